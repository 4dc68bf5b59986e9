"""Tests for daemon/vllm_triage/core/timeline.py: the points, incidents and thinning the report and
the status page draw."""

from __future__ import annotations

import dataclasses
import math

from vllm_triage.core.incidents import IncidentTracker
from vllm_triage.core.model import Diagnosis, Reason, Transition
from vllm_triage.core.timeline import (
    breach_began,
    for_display,
    incidents,
    median_interval,
    point_values,
    setting_values,
)

from support.physics import LLAMA_8B_H100_CEILING
from support.rulebooks import default_rulebook

RULES = default_rulebook()


#: One model's measurements, as ``Evaluation.measurements`` holds them.
MEASURED = {"requests_running_mean": 3.0, "requests_waiting_mean": 1.0, "kv_usage_max": 0.5}


class TestPointValues:
    """A point is a selection from what the evaluation measured; the measuring itself is
    tested in test_facts.py and test_evaluate.py."""

    def test_every_number_without_keys(self) -> None:
        assert point_values(MEASURED) == MEASURED

    def test_only_the_keys_asked_for_in_their_order(self) -> None:
        values = point_values(MEASURED, ("kv_usage_max", "requests_waiting_mean", "nope"))
        assert list(values.items()) == [("kv_usage_max", 0.5), ("requests_waiting_mean", 1.0)]


def test_setting_values_name_the_settings() -> None:
    values = setting_values(RULES)
    assert values["slo.ttft_p99_seconds"] == RULES.slo.ttft_p99_seconds
    assert values["thresholds.near_ceiling_ratio"] == RULES.thresholds.near_ceiling_ratio
    assert not any(k.startswith("ceiling.") for k in values)
    with_ceiling = dataclasses.replace(RULES, ceiling=LLAMA_8B_H100_CEILING)
    tokens_per_second = setting_values(with_ceiling)["ceiling.tokens_per_second"]
    assert tokens_per_second == LLAMA_8B_H100_CEILING.tokens_per_second


def diag(at: float, cause: str | None, model: str = "m") -> Diagnosis:
    return Diagnosis(
        model_name=model, at=at, breaches=("x",) if cause else (), cause=cause, summary=f"s{at:g}"
    )  # type: ignore[arg-type]


def transitions_of(causes: list[str | None], model: str = "m") -> list[Transition]:
    tracker = IncidentTracker(open_after=3, resolve_after=2)
    return [t for i, c in enumerate(causes) for t in tracker.observe(diag(float(i), c, model))]


K, Q, S = "kv_pressure", "queue_bound", "stalled"


class TestIncidents:
    def test_opened_and_resolved(self) -> None:
        found = incidents(transitions_of([K, K, K, K, None, None, None]))
        assert len(found) == 1
        i = found[0]
        assert (i.cause, i.started_at, i.ended_at) == (K, 2.0, 5.0)
        assert (i.opened_because, i.closed_because) == (Reason.OPENED, Reason.RESOLVED)
        assert i.diagnosis.summary == "s2"  # the diagnosis that fired it, not the last one

    def test_a_changed_cause_is_one_incident_in_two_stretches(self) -> None:
        """A change of cause inside an episode is one incident: the cause it opened with,
        each change (when, from, to, why), a band per stretch, the last cause's evidence."""
        (i,) = incidents(transitions_of([K, K, K, Q, Q, Q, None, None]))
        assert (i.cause, i.opened_as, i.started_at, i.ended_at) == (Q, K, 2.0, 7.0)
        assert [(c.at, c.previous, c.cause) for c in i.changes] == [(5.0, K, Q)]
        assert "kv_pressure's symptoms" in i.changes[0].why
        assert i.segments() == [(2.0, 5.0, K), (5.0, 7.0, Q)]
        assert i.diagnosis.summary == "s5"  # the diagnosis that decided the current cause
        assert (i.opened_because, i.closed_because) == (Reason.OPENED, Reason.RESOLVED)

    def test_a_stall_is_its_own_incident_end_to_end(self) -> None:
        """Into and out of stalled: the slow episode ends, the hang is its own incident."""
        found = incidents(transitions_of([K, K, K, S, S, S, None, None]))
        assert [(i.cause, i.started_at, i.ended_at) for i in found] == [
            (K, 2.0, 5.0),
            (S, 5.0, 7.0),
        ]
        assert found[0].closed_because == Reason.CAUSE_CHANGED
        assert found[1].opened_because == Reason.CAUSE_CHANGED and found[1].changes == ()

    def test_still_firing_has_no_end(self) -> None:
        (i,) = incidents(transitions_of([K, K, K, K]))
        assert i.ended_at is None and i.closed_because is None

    def test_a_resolved_whose_firing_was_forgotten(self) -> None:
        """The status page keeps only the last transitions: a lone resolved still shows."""
        resolved = [t for t in transitions_of([K, K, K, None, None]) if t.event == "resolved"]
        (i,) = incidents(resolved)
        assert (i.cause, i.started_at, i.ended_at, i.opened_because) == (K, 2.0, 4.0, None)

    def test_models_apart(self) -> None:
        ts = sorted(
            transitions_of([K, K, K, None, None], "a") + transitions_of([None, Q, Q, Q], "b"),
            key=lambda t: t.at,
        )
        found = incidents(ts)
        assert [(i.model_name, i.cause, i.ended_at) for i in found] == [
            ("a", K, 4.0),
            ("b", Q, None),
        ]


def test_breach_began_walks_back_the_unbroken_run() -> None:
    times = [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]
    causes = [K, None, Q, K, K, None]
    assert breach_began(times, causes, 20.0) == 10.0
    assert breach_began(times, causes, 0.0) == 0.0
    assert breach_began(times, causes, 25.0) is None  # not breached then
    assert breach_began(times, causes, 12.0) is None  # no evaluation then


def test_breach_began_with_points_one_per_step() -> None:
    """Points one per 60 s step, each the last evaluation of its step: an incident that
    opened at 100 s is in the point at 120 s; its run is known to the step."""
    times = [60.0, 120.0, 180.0, 240.0, 285.0]
    causes = [None, K, K, None, Q]
    assert breach_began(times, causes, 100.0, 60.0) == 100.0  # never after it opened
    assert breach_began(times, causes, 130.0, 60.0) == 120.0  # walked back a step
    assert breach_began(times, causes, 180.0, 60.0) == 120.0
    assert breach_began(times, causes, 190.0, 60.0) is None  # its point was clear
    assert breach_began(times, causes, 250.0, 60.0) == 250.0  # the newest point, unfinished
    assert breach_began(times, causes, 290.0, 60.0) is None  # after every point
    assert breach_began(times, causes, 30.0, 60.0) is None  # in a clear point
    assert breach_began([], [], 30.0, 60.0) is None


def test_breach_began_a_point_more_than_a_step_later_is_not_its_own() -> None:
    """A gap: the first point after ``at`` is a step or more later, so ``at`` fell in
    no point kept."""
    assert breach_began([60.0, 240.0], [K, K], 100.0, 60.0) is None


def test_median_interval() -> None:
    assert median_interval([0.0, 5.0, 10.0, 60.0, 65.0]) == 5.0
    assert median_interval([1.0]) is None


class TestForDisplay:
    def test_within_budget_keeps_everything_and_marks_gaps(self) -> None:
        times = [0.0, 5.0, 10.0, 100.0, 105.0]
        s = for_display(
            times, {"v": [1.0, 2.0, None, 4.0, 5.0]}, [None] * 5, max_points=10, gap_seconds=12.5
        )
        assert s.times == [0.0, 5.0, 10.0, 55.0, 100.0, 105.0]
        assert s.columns["v"] == [1.0, 2.0, None, None, 4.0, 5.0]
        assert not s.thinned and s.evaluations == 5

    def test_over_budget_keeps_every_spike(self) -> None:
        """6 hours at 5 s thinned to 400 points still shows a one-evaluation spike and a
        one-evaluation dip, each at its value, in time order."""
        n = 4320
        times = [5.0 * i for i in range(n)]
        values: list[float | None] = [1.0 + 0.1 * math.sin(i / 50) for i in range(n)]
        values[1234], values[3000] = 50.0, -7.0
        causes: list[str | None] = [None] * n
        causes[1234] = K
        s = for_display(times, {"v": values}, causes, max_points=400, gap_seconds=12.5)
        assert s.thinned and s.evaluations == n
        assert len(s.times) <= 400
        assert s.times == sorted(s.times)
        assert max(v for v in s.columns["v"] if v is not None) == 50.0
        assert min(v for v in s.columns["v"] if v is not None) == -7.0
        assert K in s.causes
        assert s.times[0] == 0.0 and s.times[-1] == times[-1]

    def test_over_budget_keeps_gaps(self) -> None:
        times = [float(i) for i in range(1000)] + [float(5000 + i) for i in range(1000)]
        s = for_display(times, {"v": [1.0] * 2000}, [None] * 2000, max_points=200, gap_seconds=2.5)
        gap_rows = [t for t, v in zip(s.times, s.columns["v"], strict=True) if v is None]
        assert len(gap_rows) == 1 and 999 < gap_rows[0] < 5000

    def test_empty(self) -> None:
        s = for_display([], {"v": []}, [], max_points=10, gap_seconds=None)
        assert s.times == [] and s.columns == {"v": []} and s.evaluations == 0
