"""Tests for daemon/vllm_triage/recording/replay.py: recordings in, transitions out (the command,
`vllm-triage replay`, is tests/commands/test_replay_cmd.py).

The recordings are made by the simulator (daemon/vllm_triage/simulator), which steps a physically
modelled vLLM server in virtual time and renders /metrics exactly as vLLM 0.19 (or, with
``naming="v0"``, vLLM 0.5) does; they are written in the ``record`` format.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_triage.assemble import build_evaluator
from vllm_triage.config.load import load_settings
from vllm_triage.core.evaluate import Evaluation
from vllm_triage.errors import RecordingError
from vllm_triage.recording.files import recording_files
from vllm_triage.recording.replay import Skipped, replay

from support.scenarios import START, write_recording


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
