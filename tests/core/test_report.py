"""Tests for daemon/vllm_triage/core/report.py: transitions as text lines and JSON objects."""

from __future__ import annotations

import json

from vllm_triage.core.model import Diagnosis, Reason, Transition
from vllm_triage.core.report import iso, transition_json, transition_text

D = Diagnosis(
    model_name="m",
    at=1_767_225_660.0,
    breaches=("ttft_p99",),
    cause="queue_bound",
    confidence=0.75,
    summary="requests wait",
    evidence={"requests_waiting_mean": 3.5},
    secondary=("prefill_bound",),
    remediation=("Check the queue.", "Add replicas."),
)
FIRING = Transition("firing", Reason.OPENED, "m", "queue_bound", D.at, D.at, D)
RESOLVED = Transition("resolved", Reason.RESOLVED, "m", "queue_bound", D.at + 90, D.at, D)


def test_json_has_the_contract_keys() -> None:
    """One JSON object per transition with the keys replay promises."""
    obj = json.loads(transition_json(FIRING, target="t1"))
    assert obj["event"] == "firing" and obj["diagnosis"] == "queue_bound"
    assert obj["at"] == D.at and obj["confidence"] == 0.75
    assert obj["evidence"] == {"requests_waiting_mean": 3.5}
    assert obj["remediation"] == ["Check the queue.", "Add replicas."]
    assert obj["secondary"] == ["prefill_bound"] and obj["target"] == "t1"


def test_text_lines() -> None:
    """Firing shows cause, summary and fixes; resolved shows how long it lasted."""
    text = transition_text(FIRING)
    assert (
        "FIRING    queue_bound" in text
        and "requests wait" in text
        and "fix: Check the queue." in text
    )
    assert "also: prefill_bound" in text
    assert "after 90 s (clear again)" in transition_text(RESOLVED)


def test_iso_is_utc() -> None:
    """Times print as UTC ISO 8601 with milliseconds."""
    assert iso(1_767_225_600.5) == "2026-01-01T00:00:00.500Z"
