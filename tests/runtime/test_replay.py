"""Tests for daemon/recording/replay.py and `vllm-triage replay`: recordings in, transitions out.

The recordings are made by the simulator (daemon/simulator), which steps a physically
modelled vLLM server in virtual time and renders /metrics exactly as vLLM 0.19 (or, with
``naming="v0"``, vLLM 0.5) does; they are written in the ``record`` format.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_triage.assemble import build_evaluator
from vllm_triage.config.load import load_settings
from vllm_triage.core.evaluate import Evaluation
from vllm_triage.errors import RecordingError
from vllm_triage.recording.files import recording_files
from vllm_triage.recording.replay import Skipped, replay
from vllm_triage.simulator import record

from support.clirun import vllm_triage

START = 1_767_225_600.0
REQUIRED = {
    "event",
    "diagnosis",
    "model_name",
    "at",
    "confidence",
    "evidence",
    "remediation",
    "secondary",
}


def write_recording(
    directory: Path,
    scenario: str,
    *,
    duration: float = 300.0,
    naming: str = "v1",
    start: float = START,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for at, body in record(
        scenario, start_at=start, interval_s=5.0, duration_s=duration, naming=naming
    ):  # type: ignore[arg-type]
        (directory / f"{round(at * 1000)}.prom").write_text(body, encoding="utf-8")
    return directory


def json_lines(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


class TestReplayCommand:
    @pytest.mark.parametrize(
        "scenario", ["prefill_bound", "decode_bound", "queue_bound", "kv_pressure"]
    )
    def test_induced_cause_fires(self, tmp_path: Path, scenario: str) -> None:
        """Replaying a recording of each induced situation fires exactly that cause first."""
        rec = write_recording(tmp_path / "rec", scenario)
        result = vllm_triage("replay", str(rec), "--format", "json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        events = json_lines(result.stdout)
        assert events, result.stderr
        first = events[0]
        assert first.keys() >= REQUIRED
        assert (first["event"], first["diagnosis"]) == ("firing", scenario)
        assert first["model_name"] == "meta-llama/Llama-3.1-8B-Instruct"
        names = {p.name for p in rec.iterdir()}
        assert f"{round(float(first['at']) * 1000)}.prom" in names  # scrape time = file name
        assert isinstance(first["remediation"], list) and first["remediation"]
        assert isinstance(first["evidence"], dict) and first["evidence"]["breaches"]

    def test_light_traffic_fires_nothing(self, tmp_path: Path) -> None:
        """A healthy server gives no transition at all."""
        rec = write_recording(tmp_path / "rec", "healthy")
        result = vllm_triage("replay", str(rec), "--format", "json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout == ""

    def test_hardware_from_config(self, tmp_path: Path) -> None:
        """With the hardware and model in --config, decode evidence carries the ceiling ratio."""
        rec = write_recording(tmp_path / "rec", "decode_bound", duration=120)
        cfg = tmp_path / "triage.yaml"
        cfg.write_text("hardware:\n  gpu: cpu\nmodel:\n  parameters_billion: 8.03\n  dtype: bf16\n")
        result = vllm_triage(
            "replay", str(rec), "--format", "json", "--config", str(cfg), cwd=tmp_path
        )
        first = json_lines(result.stdout)[0]
        evidence = first["evidence"]
        assert isinstance(evidence, dict)
        assert evidence["decode_limit"] == "hardware"
        assert 0.8 < float(evidence["decode_ceiling_ratio"]) <= 1.05
        assert evidence["gpu"] == "CPU, dual-channel DDR5-5600"

    def test_text_format(self, tmp_path: Path) -> None:
        """The text format prints a FIRING line with the cause and the fix."""
        rec = write_recording(tmp_path / "rec", "queue_bound", duration=60)
        result = vllm_triage("replay", str(rec), cwd=tmp_path)
        assert result.returncode == 0
        assert "FIRING    queue_bound" in result.stdout
        assert "fix: Check the queue" in result.stdout
        assert "replayed 13 files (0 skipped): 1 transition\n" in result.stderr

    def test_unreadable_input_exits_non_zero(self, tmp_path: Path) -> None:
        """A missing or empty directory is a clear error and exit 1, not a traceback."""
        missing = vllm_triage("replay", str(tmp_path / "nope"), cwd=tmp_path)
        assert missing.returncode == 1
        assert "no such directory" in missing.stderr and "Traceback" not in missing.stderr
        (tmp_path / "empty").mkdir()
        empty = vllm_triage("replay", str(tmp_path / "empty"), cwd=tmp_path)
        assert empty.returncode == 1 and "no <unix_time_ms>.prom files" in empty.stderr

    def test_bad_file_is_skipped_and_reported(self, tmp_path: Path) -> None:
        """A corrupt scrape in a recording is reported and skipped; --strict makes it fail."""
        rec = write_recording(tmp_path / "rec", "queue_bound", duration=60)
        bad = sorted(rec.iterdir())[3]
        bad.write_bytes(b"\x00\xffgarbage")
        result = vllm_triage("replay", str(rec), "--format", "json", cwd=tmp_path)
        assert result.returncode == 0
        assert f"skipped {bad.name}: body is not UTF-8" in result.stderr
        assert json_lines(result.stdout)[0]["diagnosis"] == "queue_bound"
        strict = vllm_triage("replay", str(rec), "--strict", cwd=tmp_path)
        assert strict.returncode == 1

    def test_bad_config_exits_2_and_names_the_key(self, tmp_path: Path) -> None:
        """Nonsense settings stop the replay before it starts, naming the key."""
        rec = write_recording(tmp_path / "rec", "healthy", duration=10)
        cfg = tmp_path / "bad.yaml"
        cfg.write_text("slo:\n  itl_p99_seconds: -3\n")
        result = vllm_triage("replay", str(rec), "--config", str(cfg), cwd=tmp_path)
        assert result.returncode == 2
        assert "slo.itl_p99_seconds" in result.stderr and "Traceback" not in result.stderr


class TestReplayCore:
    def test_files_in_numeric_order(self, tmp_path: Path) -> None:
        """Files are taken by the number in their name, not as strings."""
        for name in ("999.prom", "1000.prom", "notes.txt", "10000.prom"):
            (tmp_path / name).write_text("x")
        assert [p.name for _, p in recording_files(tmp_path)] == [
            "999.prom",
            "1000.prom",
            "10000.prom",
        ]
        assert [at for at, _ in recording_files(tmp_path)] == [0.999, 1.0, 10.0]

    def test_not_a_directory(self, tmp_path: Path) -> None:
        """A file given as the recording is refused with a hint."""
        f = tmp_path / "x.prom"
        f.write_text("x")
        with pytest.raises(RecordingError, match="not a directory"):
            recording_files(f)

    def test_replay_is_deterministic(self, tmp_path: Path) -> None:
        """The same recording replays to the same transitions, every time."""
        rec = write_recording(tmp_path / "rec", "kv_pressure", duration=180)

        def run() -> list[tuple[str, str, float, float]]:
            out = []
            for item in replay(rec, build_evaluator(load_settings())):
                assert isinstance(item, Evaluation)
                out += [(t.event, t.cause, t.at, t.diagnosis.confidence) for t in item.transitions]
            return out

        first = run()
        assert first and first == run()

    def test_v0_naming_still_diagnoses(self, tmp_path: Path) -> None:
        """A vLLM 0.5-era server (no queue-time histogram) is still found queue-bound."""
        rec = write_recording(tmp_path / "rec", "queue_bound", duration=120, naming="v0")
        causes = [
            t.cause
            for item in replay(rec, build_evaluator(load_settings()))
            if isinstance(item, Evaluation)
            for t in item.transitions
        ]
        assert causes[:1] == ["queue_bound"]

    def test_restart_and_upgrade_mid_recording(self, tmp_path: Path) -> None:
        """A vLLM restart (counters back to zero) and an upgrade from V0 to V1 names mid-run
        never give negative rates, and the diagnosis carries on."""
        rec = tmp_path / "rec"
        write_recording(rec, "queue_bound", duration=120, naming="v0")
        write_recording(rec, "queue_bound", duration=120, naming="v1", start=START + 125)
        rates = []
        causes = []
        for item in replay(rec, build_evaluator(load_settings())):
            assert not isinstance(item, Skipped)
            for s in item.signals.values():
                rates += [
                    r
                    for r in (
                        s.generation_tokens_per_second,
                        s.prompt_tokens_per_second,
                        s.preemptions_per_second,
                    )
                    if r is not None
                ]
            causes += [t.cause for t in item.transitions]
        assert rates and min(rates) >= 0
        assert causes[0] == "queue_bound"
