"""``vllm-triage whatif``: the simulator calibrated to a recording's window, run as changed."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import yaml

from vllm_triage.assemble import build_evaluator
from vllm_triage.cli import build_parser
from vllm_triage.commands import whatif as whatif_command
from vllm_triage.demo.offline import scenario_facts, scenario_settings
from vllm_triage.simulator import get_scenario
from vllm_triage.whatif.calibrate import METRICS, misses, whatif
from vllm_triage.whatif.window import read_window

from support.clirun import vllm_triage
from support.clock import FakeClock
from support.harness import refused_port, simulated_on
from support.paths import ROOT
from support.scenarios import write_recording

RECORDINGS = ROOT / "tests" / "fixtures" / "recordings"
CPU_CONFIG = ROOT / "tests" / "system" / "realvllm" / "triage-cpu.yaml"


def _config(tmp: Path, scenario: str) -> Path:
    """What a user would write for the simulated server: its card, model and SLOs."""
    sc = get_scenario(scenario)
    data = scenario_facts(sc)
    if sc.slo:
        data["slo"] = dict(sc.slo)
    path = tmp / "triage.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "name", sorted(p.name for p in RECORDINGS.iterdir() if p.is_dir()), ids=str
)
def test_runs_on_every_committed_recording(tmp_path: Path, name: str) -> None:
    """Every real recording gives a window, its replay and a changed run, as JSON."""
    out = vllm_triage(
        "whatif",
        str(RECORDINGS / name),
        "--config",
        str(CPU_CONFIG),
        "--change",
        "max_num_seqs=8",
        "--format",
        "json",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) >= {"at", "changes", "before", "after", "calibration"}
    assert doc["changes"] == {"max_num_seqs": 8}
    assert set(doc["before"]) == set(METRICS) == set(doc["after"])


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("colour=blue", "kv_cache_dtype"),
        ("max_num_seqs=0", "max_num_seqs"),
        ("replicas=two", "replicas"),
        ("gpu=Abacus", "unknown GPU"),
        ("dtype=fp7", "unknown dtype"),
        ("arrival_rate_scale=-1", "arrival_rate_scale"),
        ("kv_cache_dtype", "KEY=VALUE"),
    ],
)
def test_a_bad_change_exits_2_naming_the_valid_keys(tmp_path: Path, change: str, says: str) -> None:
    out = vllm_triage("whatif", str(RECORDINGS / "light"), "--change", change, cwd=tmp_path)
    assert out.returncode == 2, out.stdout
    assert says in out.stderr


def test_text_names_before_replay_and_after(tmp_path: Path) -> None:
    rec = write_recording(tmp_path / "rec", "decode_bound", duration=120.0)
    out = vllm_triage(
        "whatif",
        str(rec),
        "--config",
        str(_config(tmp_path, "decode_bound")),
        "--change",
        "dtype=fp8",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "before" in out.stdout and "after" in out.stdout
    assert "decode_step_seconds" in out.stdout and "dtype=fp8" in out.stdout


@pytest.mark.parametrize(
    ("scenario", "at"),
    [("tour", 285.0), ("queue_bound", 180.0), ("healthy", 180.0)],
)
def test_calibration_error_within_15_percent(tmp_path: Path, scenario: str, at: float) -> None:
    """With no change, the calibrated replay matches what the window measured: decode
    step and TTFT p99 within 15 %."""
    sc = get_scenario(scenario)
    rec = write_recording(tmp_path / "rec", scenario, duration=at)
    settings = scenario_settings(sc, None)
    obs = read_window(rec, build_evaluator(settings), at)
    r = whatif(obs, lambda: build_evaluator(settings), {})
    assert r.after == r.replay
    for key in ("decode_step_seconds", "ttft_p99_seconds"):
        before, replay = r.before[key], r.replay[key]
        assert before and replay, key
        assert abs(replay / before - 1) <= 0.15, (key, before, replay)


def test_the_default_window_is_the_first_incidents(tmp_path: Path) -> None:
    rec = write_recording(tmp_path / "rec", "queue_bound", duration=240.0)
    settings = scenario_settings(get_scenario("queue_bound"), None)
    obs = read_window(rec, build_evaluator(settings))
    assert obs.cause == "queue_bound"
    assert obs.offset_seconds < 240.0


def _joined_late(tmp_path: Path, keep_from: float, keep_to: float) -> Path:
    """A queue_bound recording begun while the queue already stood (a daemon started, or
    `run --record` turned on, mid-incident): its first firing comes a few scrapes in."""
    rec = write_recording(tmp_path / "rec", "queue_bound", duration=300.0)
    first = min(int(p.stem) for p in rec.glob("*.prom"))
    for p in rec.glob("*.prom"):
        if not keep_from * 1000 <= int(p.stem) - first <= keep_to * 1000:
            p.unlink()
    return rec


def test_a_recording_joined_mid_incident_gets_a_whole_window(tmp_path: Path) -> None:
    """The first firing comes three scrapes in, when the core's window holds 15 s: the
    default is the first whole window of that incident, not those 15 s."""
    settings = scenario_settings(get_scenario("queue_bound"), None)
    rec = _joined_late(tmp_path, 120.0, 300.0)
    at_firing = read_window(rec, build_evaluator(settings), 15.0)
    assert at_firing.span_seconds <= 15.0
    obs = read_window(rec, build_evaluator(settings))
    assert obs.cause == "queue_bound"
    assert obs.span_seconds >= settings.window_seconds - 5.0  # one scrape interval
    assert len(obs.intervals) >= 11


def test_an_incident_shorter_than_a_window_gives_its_longest_stretch(tmp_path: Path) -> None:
    settings = scenario_settings(get_scenario("queue_bound"), None)
    rec = _joined_late(tmp_path, 120.0, 160.0)  # 40 s of recording in all
    obs = read_window(rec, build_evaluator(settings))
    assert obs.cause == "queue_bound"
    assert 30.0 <= obs.span_seconds <= 40.0


def test_a_miscalibrated_metric_is_said_and_its_after_marked(tmp_path: Path) -> None:
    """The replay missing what was measured by more than 20 % on a metric: a warning line
    naming it, and its `after` marked; the JSON lists it under calibration.off."""
    rec = write_recording(tmp_path / "rec", "decode_bound", duration=120.0)
    settings = scenario_settings(get_scenario("decode_bound"), None)
    obs = read_window(rec, build_evaluator(settings))
    result = whatif(obs, lambda: build_evaluator(settings), {"kv_cache_dtype": "fp8"})
    # As if the replay had run 2.25x slow on ITL p99 (the newcomer's 22.5 vs 9.99 ms).
    measured = result.before["itl_p99_seconds"]
    assert measured
    replay = {**result.replay, "itl_p99_seconds": 2.25 * measured}
    off = misses(result.before, replay)
    assert off == {"itl_p99_seconds": pytest.approx(1.25)}
    shown = whatif_command.result_text(dataclasses.replace(result, replay=replay, off=off))
    [row] = [x for x in shown.splitlines() if x.startswith("itl_p99_seconds")]
    assert row.endswith(" !")
    assert "warning: the calibrated replay misses the measured itl_p99_seconds by +125%" in shown
    others = [x for x in shown.splitlines() if x.startswith("ttft_p99_seconds")]
    assert others and not others[0].endswith("!")


def test_each_change_says_which_term_it_moves(tmp_path: Path) -> None:
    rec = write_recording(tmp_path / "rec", "decode_bound", duration=120.0)
    out = vllm_triage(
        "whatif", str(rec), "--config", str(_config(tmp_path, "decode_bound")),
        "--change", "kv_cache_dtype=fp8", "--change", "max_num_seqs=64",
        "--format", "json", cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    first, second = json.loads(out.stdout)["reasons"]
    assert first.startswith("KV cache in fp8: halves the KV bytes each step reads per token")
    assert "pool holds 2x the tokens" in first and ";" not in first  # said once, below
    assert second.startswith("max_num_seqs 64: the batch cap")
    assert "running" in second and " ms" in second  # what the load made of both


class TestTarget:
    """``--target URL``: a live server watched for one window (on a fake clock: the
    simulated server's time and the watch's pass only when the test says)."""

    def test_a_live_queue_is_calibrated_and_changed(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        clock = FakeClock()
        monkeypatch.setattr(
            whatif_command,
            "watch",
            functools.partial(whatif_command.watch, clock=clock, sleep=clock.sleep),
        )
        with simulated_on(clock, get_scenario("queue_bound"), speed=1.0) as url:
            clock.sleep(60.0)  # the queue builds before the watch starts
            args = build_parser().parse_args(
                [
                    "whatif",
                    "--target",
                    url,
                    "--window",
                    "30",
                    "--interval",
                    "5",
                    "--change",
                    "max_num_seqs=64",
                    "--format",
                    "json",
                ]
            )
            code = args.func(args)
        # The last line: unconfigured in this process, the recorder's log lines come first
        # (the installed command sends them to stderr).
        doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert code == 0
        assert doc["changes"] == {"max_num_seqs": 64}
        assert doc["before"]["requests_waiting_mean"] > 1
        # Four times the seats of a queue-bound server: the queue goes.
        assert doc["after"]["requests_waiting_mean"] < doc["before"]["requests_waiting_mean"]

    def test_neither_or_both_sources_is_a_usage_error(self, tmp_path: Path) -> None:
        out = vllm_triage("whatif", cwd=tmp_path)
        assert out.returncode == 2 and "--target" in out.stderr

    def test_a_refused_port_exits_1(self, tmp_path: Path) -> None:
        url = f"http://127.0.0.1:{refused_port()}/metrics"
        out = vllm_triage(
            "whatif",
            "--target",
            url,
            "--window",
            "1",
            "--interval",
            "0.5",
            cwd=tmp_path,
        )
        assert out.returncode == 1, out.stderr
        assert "usable" in out.stderr
