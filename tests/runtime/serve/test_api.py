"""Tests for daemon/vllm_triage/serve/api.py: the /api/v1/diagnoses document, without HTTP."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from typing import Any

import pytest

from vllm_triage.core.incidents import IncidentTracker
from vllm_triage.core.model import Diagnosis
from vllm_triage.core.report import iso
from vllm_triage.core.rulebook import Ceiling
from vllm_triage.demo.offline import START_AT
from vllm_triage.serve.api import diagnoses_json
from vllm_triage.state import TargetState

from support.watched import MODEL, watched

NOW = START_AT + 3600


def dumped(doc: dict[str, Any]) -> dict[str, Any]:
    """What the endpoint sends: strict JSON (no NaN), read back."""
    result: dict[str, Any] = json.loads(json.dumps(doc, allow_nan=False))
    return result


@pytest.fixture(scope="module")
def kv() -> TargetState:
    return watched("kv_pressure")


@pytest.fixture(scope="module")
def healthy() -> TargetState:
    return watched("healthy")


class TestNoViewYet:
    def test_never_scraped(self) -> None:
        """Before the first scrape: down, no models, nothing made up."""
        state = TargetState("vllm-0", "http://127.0.0.1:8000/metrics", None)
        doc = dumped(diagnoses_json([state], now=NOW))
        assert doc["generated_at"] == iso(NOW) == "2026-01-01T01:00:00.000Z"
        [t] = doc["targets"]
        assert t == {
            "target": "vllm-0",
            "url": "http://127.0.0.1:8000/metrics",
            "up": False,
            "scrapes": 0,
            "scrape_failures": {},
            "last_error": None,
            "last_scrape_at": None,
            "last_success_at": None,
            "ceiling": None,
            "probe": None,
            "models": [],
            "recent_transitions": [],
        }

    def test_failing_before_any_success(self) -> None:
        """Failures, the last error and the last attempt are told; still no models."""
        ceiling = Ceiling("NVIDIA H100 SXM", 3350.0, 16.06e9, 208.6)
        state = TargetState(
            "vllm-0",
            "http://127.0.0.1:8000/metrics",
            ceiling,
            scrapes=3,
            failures=Counter({"connect": 2, "timeout": 1}),
            last_error="connection refused",
            last_scrape_at=START_AT,
        )
        [t] = dumped(diagnoses_json([state], now=NOW))["targets"]
        assert t["up"] is False and t["models"] == []
        assert t["scrape_failures"] == {"connect": 2, "timeout": 1}
        assert t["last_error"] == "connection refused"
        assert t["last_scrape_at"] == "2026-01-01T00:00:00.000Z"
        assert t["last_success_at"] is None
        assert t["ceiling"]["gpu"] == "NVIDIA H100 SXM"
        assert t["ceiling"]["tokens_per_second"] == 208.6


class TestWithView:
    def test_open_incident(self, kv: TargetState) -> None:
        """The firing incident's cause, start and evidence, and the window's signals."""
        assert kv.view is not None
        [active] = kv.view.active
        [t] = dumped(diagnoses_json([kv], now=NOW))["targets"]
        assert t["up"] is True and t["scrapes"] == 13
        assert t["last_success_at"] == iso(START_AT + 60)
        [m] = t["models"]
        assert m["model_name"] == MODEL
        assert m["evaluated_at"] == iso(START_AT + 60)
        assert m["diagnosis"] == "kv_pressure"
        assert m["current_cause"] == "kv_pressure"
        assert m["incident_state"] == "firing"
        assert m["incident_started_at"] == iso(active.started_at)
        assert "kv_preemptions" in m["breaches"]
        assert 0 < m["confidence"] <= 1
        assert m["summary"]
        assert m["remediation"] and all(isinstance(r, str) for r in m["remediation"])
        assert m["evidence"]["kv_pool_tokens"] == 32768
        # The preempted prompts' recomputation rides in the steps: no decode rate is
        # read from them, so neither is its ratio to the ceiling (the ceiling is known).
        assert "decode_tokens_per_second_per_stream" not in m["evidence"]
        assert "decode_ceiling_ratio" not in m["evidence"]
        assert m["evidence"]["decode_ceiling_tokens_per_second"] > 100
        assert (
            "steps carry prefill" in m["signals"]["missing"]["decode_tokens_per_second_per_stream"]
        )
        assert m["runtime"] == m["signals"]["runtime"] == "vllm"
        assert m["signals"]["model_name"] == MODEL
        assert m["signals"]["ttft_p99"]["q"] == 0.99
        assert m["signals"]["kv_usage_max"] > 0.9
        assert t["ceiling"]["gpu"] == "NVIDIA A100 80GB SXM"

    def test_healthy(self, healthy: TargetState) -> None:
        [t] = dumped(diagnoses_json([healthy], now=NOW))["targets"]
        [m] = t["models"]
        assert m["diagnosis"] == "healthy" and m["current_cause"] is None
        assert m["incident_state"] == "clear" and m["incident_started_at"] is None
        assert m["breaches"] == [] and m["secondary"] == []
        assert t["recent_transitions"] == []

    def test_a_down_target_keeps_its_last_view(self, kv: TargetState) -> None:
        """A failed scrape after good ones: up false, the incident still reported."""
        down = dataclasses.replace(kv, up=False, last_error="timed out")
        [t] = dumped(diagnoses_json([down], now=NOW))["targets"]
        assert t["up"] is False and t["last_error"] == "timed out"
        assert [m["diagnosis"] for m in t["models"]] == ["kv_pressure"]

    def test_only(self, kv: TargetState, healthy: TargetState) -> None:
        both = [kv, healthy]
        assert [t["target"] for t in diagnoses_json(both, now=NOW)["targets"]] == [
            "kv_pressure",
            "healthy",
        ]
        only = diagnoses_json(both, now=NOW, only="healthy")["targets"]
        assert [t["target"] for t in only] == ["healthy"]
        assert diagnoses_json(both, now=NOW, only="nope")["targets"] == []

    def test_non_finite_numbers_become_null(self, kv: TargetState) -> None:
        assert kv.view is not None
        ev = kv.view.evaluation
        broken = dataclasses.replace(
            ev,
            diagnoses={
                m: dataclasses.replace(d, confidence=math.nan, evidence={"x": math.inf})
                for m, d in ev.diagnoses.items()
            },
            signals={m: dataclasses.replace(s, itl_mean=-math.inf) for m, s in ev.signals.items()},
        )
        state = dataclasses.replace(kv, view=dataclasses.replace(kv.view, evaluation=broken))
        [m] = dumped(diagnoses_json([state], now=NOW))["targets"][0]["models"]
        assert m["confidence"] is None
        assert m["evidence"] == {"x": None}
        assert m["signals"]["itl_mean"] is None


class TestRecentTransitions:
    def test_from_a_real_incident(self, kv: TargetState) -> None:
        [t] = dumped(diagnoses_json([kv], now=NOW))["targets"]
        [tr] = t["recent_transitions"]
        assert tr["target"] == "kv_pressure"
        assert (tr["event"], tr["reason"], tr["diagnosis"]) == ("firing", "opened", "kv_pressure")
        assert tr["model_name"] == MODEL
        # The third breached evaluation, in the document's one time style (ISO 8601, UTC).
        assert tr["at"] == tr["started_at"] == iso(START_AT + 30) == "2026-01-01T00:00:30.000Z"
        assert tr["evidence"]["kv_pool_tokens"] == 32768

    def test_firing_then_resolved_in_order(self) -> None:
        """Transitions come oldest first, NaN evidence made null, even with no view."""
        tracker = IncidentTracker(open_after=1, resolve_after=1)
        state = TargetState("t", "http://127.0.0.1:1/metrics", None)
        for at, cause in ((10.0, "queue_bound"), (20.0, "queue_bound"), (30.0, None)):
            d = Diagnosis(
                model_name="m",
                at=START_AT + at,
                breaches=("waiting",) if cause else (),
                cause=cause,  # type: ignore[arg-type]
                evidence={"requests_waiting_mean": math.nan if cause else 0.0},
            )
            state.recent.extend(tracker.observe(d))
        [t] = dumped(diagnoses_json([state], now=NOW))["targets"]
        assert t["models"] == []
        got = [
            (tr["event"], tr["reason"], tr["diagnosis"], tr["at"]) for tr in t["recent_transitions"]
        ]
        assert got == [
            ("firing", "opened", "queue_bound", iso(START_AT + 10)),
            ("resolved", "resolved", "queue_bound", iso(START_AT + 30)),
        ]
        assert t["recent_transitions"][0]["evidence"] == {"requests_waiting_mean": None}
        assert t["recent_transitions"][1]["started_at"] == iso(START_AT + 10)


class TestOneTimeStyle:
    def test_every_time_in_the_document_is_iso(self, kv: TargetState) -> None:
        """Generated, scraped, evaluated, started, transitions and signals: all ISO 8601
        in UTC; no unix seconds anywhere (they once mixed)."""
        doc = dumped(diagnoses_json([kv], now=NOW))
        [t] = doc["targets"]
        [m] = t["models"]
        [tr] = t["recent_transitions"]
        times = [
            doc["generated_at"],
            t["last_scrape_at"],
            t["last_success_at"],
            m["evaluated_at"],
            m["incident_started_at"],
            m["signals"]["at"],
            tr["at"],
            tr["started_at"],
        ]
        assert all(
            isinstance(x, str) and x.endswith("Z") and x.startswith("2026-") for x in times
        ), times

    def test_evidence_breaches_is_a_list_like_breaches(self, kv: TargetState) -> None:
        [t] = dumped(diagnoses_json([kv], now=NOW))["targets"]
        [m] = t["models"]
        assert m["evidence"]["breaches"] == m["breaches"]
        assert isinstance(m["breaches"], list) and m["breaches"]
