"""The live demo's post-mortem report tells what its alerts told, to the number: the
daemon records the scrapes its own loop takes (``run --record``, daemon/vllm_triage/scrape/keep.py),
and the report is made from that folder, so each incident's cause, start time and
confidence in the report are those of the alert the receiver got. (Recorded by a second
scraper beside the daemon, the report saw other scrapes at other times, and told
prefill_bound 3 s later, at another confidence.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllm_triage.assemble import report_parts
from vllm_triage.config.load import load_settings
from vllm_triage.core.alerts import go_time
from vllm_triage.demo.live import LiveDemoResult, run_live_demo
from vllm_triage.recording.files import recording_files
from vllm_triage.recording.report import report_document


def live(tmp_path: Path, name: str, *, speed: float, duration_s: float | None) -> LiveDemoResult:
    return run_live_demo(
        (name,),
        speed=speed,
        listen="127.0.0.1:0",
        config=None,
        duration_s=duration_s,
        out=lambda line: None,
        tty=False,
        record_dir=tmp_path / "kept",
    )


def report_of(result: LiveDemoResult, name: str) -> dict[str, Any]:
    """The report ``vllm-triage report DIR/NAME --config DIR/NAME-settings.yaml`` makes:
    the folder the demo left, with the settings file it wrote beside it."""
    assert result.settings_file is not None and result.recording is not None
    parts = report_parts(load_settings(result.settings_file))
    return report_document(result.recording / name, parts, now=0.0)


def told(result: LiveDemoResult) -> dict[tuple[str, str], dict[str, Any]]:
    """Each firing alert, by (the cause it opened as, its start): the last word on it."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for payload in result.received:
        for alert in payload["alerts"]:
            if alert["status"] == "firing":
                out[(alert["labels"]["diagnosis"], alert["startsAt"])] = alert
    return out


def agree(tmp_path: Path, name: str, *, speed: float, duration_s: float | None) -> int:
    result = live(tmp_path, name, speed=speed, duration_s=duration_s)
    doc = report_of(result, name)
    alerts = told(result)
    found = [i for section in doc["sections"] for i in section["incidents"]]
    assert found, "the scenario fired nothing: the comparison would prove nothing"
    assert {(i["opened_as"], go_time(i["start"])) for i in found} == set(alerts)
    for i in found:
        alert = alerts[(i["opened_as"], go_time(i["start"]))]
        assert alert["annotations"]["cause"] == i["cause"]
        assert alert["annotations"]["confidence"] == f"{i['confidence']:.2f}"
    # The recording is the daemon's: one file per scrape it read, none from elsewhere.
    assert result.recording == tmp_path / "kept"
    files = recording_files(tmp_path / "kept" / name)
    assert result.recording_bytes >= sum(p.stat().st_size for _, p in files) > 0
    assert result.report is not None and result.report.path.parent == tmp_path / "kept"
    assert result.settings_file == tmp_path / "kept" / f"{name}-settings.yaml"
    return len(found)


def test_the_report_tells_what_the_alerts_told(tmp_path: Path) -> None:
    """prefill_bound for 150 simulated seconds at 30x: one incident, about 5 s."""
    assert agree(tmp_path, "prefill_bound", speed=30.0, duration_s=150.0) >= 1


@pytest.mark.e2e
def test_the_tours_report_tells_what_its_alerts_told(tmp_path: Path) -> None:
    """The README's demo, whole: every cause's incident, alert and report alike."""
    assert agree(tmp_path, "tour", speed=20.0, duration_s=None) >= 5
