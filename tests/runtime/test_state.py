"""Tests for daemon/vllm_triage/state.py: the status page's bounded memory of the last hour
(``History``)."""

from __future__ import annotations

import math

import pytest

from vllm_triage.assemble import build_evaluator, build_rulebook
from vllm_triage.config.load import load_settings
from vllm_triage.core.evaluate import Evaluation
from vllm_triage.core.model import Diagnosis, Signals
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.core.series import Ring
from vllm_triage.page.spec import load_spec
from vllm_triage.rules import runtime_table
from vllm_triage.state import History

from support.scenarios import recorded

RULES = build_rulebook(load_settings())
KEYS = ("requests_running_mean", "requests_waiting_mean")


class TestRing:
    def test_keeps_the_last_capacity_points_oldest_first(self) -> None:
        ring = Ring(KEYS, capacity=4)
        for i in range(10):
            ring.append(
                float(i), {"requests_running_mean": float(i)}, "kv_pressure" if i % 2 else None
            )
        w = ring.window(since=0.0)
        assert w.times == [6.0, 7.0, 8.0, 9.0]
        assert w.columns["requests_running_mean"] == [6.0, 7.0, 8.0, 9.0]
        assert w.columns["requests_waiting_mean"] == [None] * 4  # unknown stays unknown
        assert w.causes == [None, "kv_pressure", None, "kv_pressure"]
        assert len(ring) == 4 and ring.newest == 9.0

    def test_window_since(self) -> None:
        ring = Ring(KEYS, capacity=10)
        for i in range(5):
            ring.append(float(i), {}, None)
        assert ring.window(since=3.0).times == [3.0, 4.0]

    def test_float32_columns(self) -> None:
        """Values are kept in single precision: about seven digits, enough to draw."""
        ring = Ring(KEYS, capacity=2)
        ring.append(1.0, {"requests_running_mean": 0.123456789}, None)
        (v,) = ring.window(0.0).columns["requests_running_mean"]
        assert v == pytest.approx(0.123456789, rel=1e-6) and v != 0.123456789

    def test_memory_is_allocated_once(self) -> None:
        ring = Ring(KEYS, capacity=721)
        before = ring.nbytes
        for i in range(2000):
            ring.append(float(i), {"requests_running_mean": 1.0}, None)
        assert ring.nbytes == before == 721 * (8 + 2 * 4 + 8)

    def test_capacity_must_be_positive(self) -> None:
        with pytest.raises(ValueError):
            Ring(KEYS, capacity=0)


def evaluation(at: float, models: dict[str, float]) -> Evaluation:
    return Evaluation(
        at=at,
        accepted=True,
        signals={
            m: Signals(model_name=m, at=at, span_seconds=60, snapshots=12, running_mean=v)
            for m, v in models.items()
        },
        diagnoses={m: Diagnosis(model_name=m, at=at, breaches=(), cause=None) for m in models},
        measurements={m: {"requests_running_mean": v} for m, v in models.items()},
    )


class TestHistory:
    def test_an_hour_at_the_interval(self) -> None:
        h = History.for_interval(KEYS, history_seconds=3600, interval_seconds=5)
        assert h.capacity == 721 and h.keep_seconds == 3600

    def test_per_model_and_forgets_a_model_gone_for_an_hour(self) -> None:
        h = History(KEYS, capacity=100, keep_seconds=60)
        h.record(evaluation(0.0, {"a": 1.0, "b": 2.0}))
        h.record(evaluation(30.0, {"a": 3.0}))
        windows = h.windows(since=0.0)
        assert windows["a"].columns["requests_running_mean"] == [1.0, 3.0]
        assert windows["b"].times == [0.0]
        h.record(evaluation(61.0, {"a": 4.0}))
        assert list(h.windows(since=0.0)) == ["a"]

    def test_the_stated_bound(self) -> None:
        """The figure docs/operations.md states for the status page: one model, a 5 s
        interval, the panels' keys: about 50 KB, and the same after days of evaluations
        as after the first."""
        spec = load_spec()
        h = History.for_interval(spec.measured_keys, history_seconds=3600, interval_seconds=5)
        settings = load_settings()
        evaluator = build_evaluator(settings)
        parser = SnapshotParser(runtime_table())
        sizes = []
        bodies = recorded("tour", start_at=0.0, interval_s=5.0, duration_s=900)
        for n, (at, body) in enumerate(bodies):
            h.record(evaluator.step(parser.parse(body, at)))
            if n in (10, 179):
                sizes.append(h.nbytes)
        per_point = 8 + 4 * len(spec.measured_keys) + 8
        assert sizes == [721 * per_point] * 2
        assert 40_000 < sizes[0] < 60_000
        (window,) = h.windows(since=0.0).values()
        assert len(window.times) == 181
        usage = [v for v in window.columns["kv_usage_max"] if v is not None]
        assert usage and all(0.0 <= v <= 1.0 for v in usage)
        assert not any(
            v is not None and math.isnan(v) for col in window.columns.values() for v in col
        )


def breached(at: float, cause: str | None, running: float) -> Evaluation:
    """One model ``m`` evaluated at ``at``: ``cause`` diagnosed (None: clear)."""
    e = evaluation(at, {"m": running})
    e.diagnoses["m"] = Diagnosis(model_name="m", at=at, breaches=(), cause=cause)
    return e


class TestRingAmend:
    def test_replaces_the_newest_point_in_place(self) -> None:
        ring = Ring(KEYS, capacity=3)
        ring.append(0.0, {"requests_running_mean": 1.0}, None)
        ring.append(60.0, {"requests_running_mean": 2.0}, None)
        ring.amend(75.0, {"requests_waiting_mean": 3.0}, "queue_bound")
        w = ring.window()
        assert len(ring) == 2 and ring.newest == 75.0
        assert w.times == [0.0, 75.0]
        # Every number is the later evaluation's: one it did not measure is unknown.
        assert w.columns["requests_running_mean"] == [1.0, None]
        assert w.columns["requests_waiting_mean"] == [None, 3.0]
        assert w.causes == [None, "queue_bound"]

    def test_a_clear_evaluation_keeps_the_cause_of_the_point(self) -> None:
        ring = Ring(KEYS, capacity=3)
        ring.append(0.0, {}, "kv_pressure")
        ring.amend(15.0, {}, None)
        assert ring.window().causes == ["kv_pressure"]
        ring.amend(30.0, {}, "stalled")  # a later cause replaces it
        assert ring.window().causes == ["stalled"]

    def test_on_an_empty_ring_appends(self) -> None:
        ring = Ring(KEYS, capacity=2)
        ring.amend(5.0, {"requests_running_mean": 1.0}, None)
        assert ring.window().times == [5.0] and len(ring) == 1

    def test_amends_the_newest_after_wrapping(self) -> None:
        ring = Ring(KEYS, capacity=2)
        for i in range(3):
            ring.append(float(i), {"requests_running_mean": float(i)}, None)
        ring.amend(2.5, {"requests_running_mean": 9.0}, None)
        w = ring.window()
        assert w.times == [1.0, 2.5]
        assert w.columns["requests_running_mean"] == [1.0, 9.0]


class TestHistoryStep:
    def test_an_hour_at_the_step(self) -> None:
        h = History.for_interval(KEYS, history_seconds=3600, interval_seconds=15, step_seconds=60)
        assert (h.capacity, h.step_seconds) == (61, 60)
        # At or under the interval every evaluation is a point: no step.
        for step in (0.0, 10.0, 15.0):
            h = History.for_interval(
                KEYS, history_seconds=3600, interval_seconds=15, step_seconds=step
            )
            assert (h.capacity, h.step_seconds) == (241, 0.0)

    def test_one_point_per_step_the_last_evaluation_of_it(self) -> None:
        h = History.for_interval(KEYS, history_seconds=3600, interval_seconds=15, step_seconds=60)
        for at in (15.0, 30.0, 45.0, 60.0, 75.0, 90.0):
            h.record(breached(at, None, at))
        w = h.windows(since=0.0)["m"]
        # 15..60 are the step ending at 60; 75 and 90 the one ending at 120.
        assert w.times == [60.0, 90.0]
        assert w.columns["requests_running_mean"] == [60.0, 90.0]
        assert w.step == 60.0

    def test_a_breach_inside_a_step_stays_shown(self) -> None:
        h = History.for_interval(KEYS, history_seconds=3600, interval_seconds=15, step_seconds=60)
        h.record(breached(15.0, None, 1.0))
        h.record(breached(30.0, "kv_pressure", 2.0))
        h.record(breached(45.0, None, 3.0))
        h.record(breached(60.0, None, 4.0))
        h.record(breached(75.0, None, 5.0))
        w = h.windows(since=0.0)["m"]
        assert w.causes == ["kv_pressure", None]
        assert w.columns["requests_running_mean"] == [4.0, 5.0]

    def test_an_hour_of_steps_is_bounded(self) -> None:
        h = History.for_interval(KEYS, history_seconds=3600, interval_seconds=15, step_seconds=60)
        for i in range(1, 4 * 240):  # four hours at 15 s
            h.record(breached(15.0 * i, None, 1.0))
        w = h.windows(since=0.0)["m"]
        assert len(w.times) == 61 and w.times[-1] == 15.0 * (4 * 240 - 1)
        # Each point but the newest (its step not over yet) ends a step.
        assert all(t % 60.0 == 0.0 for t in w.times[:-1])
        assert h.nbytes == 61 * (8 + 4 * len(KEYS) + 8)

    def test_without_a_step_every_evaluation_is_a_point(self) -> None:
        h = History.for_interval(KEYS, history_seconds=3600, interval_seconds=15)
        for at in (15.0, 30.0, 45.0):
            h.record(breached(at, None, at))
        w = h.windows(since=0.0)["m"]
        assert w.times == [15.0, 30.0, 45.0] and w.step == 0.0
