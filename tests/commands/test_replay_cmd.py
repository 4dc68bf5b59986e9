"""`vllm-triage replay` as a user runs it (daemon/vllm_triage/commands/replay.py): recordings made
by the simulator (support/scenarios.py) in, transitions out, as text or JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.clirun import vllm_triage
from support.scenarios import write_recording

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
