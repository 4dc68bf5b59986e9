"""Tests for daemon/vllm_triage/core/totals.py: the window of snapshots, what it accumulates (gauge
statistics, counter and bucket deltas) and the engine's progress beside it."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_triage.core.model import Histogram, KVPool, ModelSeries, ProbeStatus, Snapshot
from vllm_triage.core.totals import Window, _sum_steps, _window_deltas

from support.snapshots import hist, snap


def fill(window: Window, snaps: list[Snapshot]) -> None:
    for s in snaps:
        assert window.push(s)


class TestGaugesAndShape:
    def test_gauges_mean_and_max(self) -> None:
        """Gauges are the mean and max of the window's samples."""
        w = Window(60)
        fill(
            w,
            [snap(t * 10.0, waiting=float(v), kv_usage=v / 10) for t, v in enumerate([0, 2, 4, 6])],
        )
        s = w.signals("m")
        assert s.waiting_mean == pytest.approx(3.0) and s.waiting_max == 6.0
        assert s.waiting_min == 0.0
        assert s.kv_usage_max == pytest.approx(0.6)

    def test_window_slides(self) -> None:
        """Snapshots older than the window fall out of it."""
        w = Window(60)
        fill(w, [snap(float(t), waiting=0.0 if t < 100 else 5.0) for t in range(0, 200, 10)])
        s = w.signals("m")
        assert s.span_seconds == 60.0
        assert s.waiting_mean == 5.0

    def test_out_of_order_is_ignored(self) -> None:
        """A snapshot not newer than the last is refused, not merged backwards."""
        w = Window(60)
        assert w.push(snap(10.0))
        assert not w.push(snap(10.0))
        assert not w.push(snap(5.0))
        assert len(w) == 1

    def test_new_model_has_no_baseline(self) -> None:
        """A model seen for the first time adds no counts of unknown age."""
        w = Window(60)
        first = Snapshot(at=0.0, era="v1", prefix="vllm:", models={})
        fill(w, [first, snap(10.0, generation_tokens=5000.0), snap(20.0, generation_tokens=5100.0)])
        assert w.signals("m").generation_tokens_per_second == pytest.approx(100 / 20)

    def test_pool_size_from_the_newest_snapshot(self) -> None:
        """The KV pool size is read from cache_config_info in the newest snapshot."""
        w = Window(60)
        fill(w, [snap(0.0, pool=KVPool(16, 100)), snap(5.0, pool=KVPool(16, 200))])
        assert w.signals("m").kv_pool_tokens == 3200

    def test_missing_series_are_named(self) -> None:
        """Series the target does not expose (V0: no queue time) are named as such."""
        w = Window(60)
        fill(w, [snap(0.0, running=1.0), snap(10.0, running=1.0)])
        s = w.signals("m")
        assert s.queue_time_mean is None
        assert s.missing["queue_time_mean"] == "not exposed by this vLLM"

    def test_model_series_defaults(self) -> None:
        """A bare series has nothing but its name: every signal is None or zero."""
        m = ModelSeries(model_name="x")
        assert m.ttft is None and m.running is None


class TestFastPathEquivalence:
    @settings(max_examples=150, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.integers(min_value=0, max_value=50),  # new observations this step
                st.booleans(),  # restart before this step
                st.booleans(),  # model missing from this snapshot
            ),
            min_size=2,
            max_size=14,
        )
    )
    def test_fast_path_equals_summing_steps(self, plan: list[tuple[int, bool, bool]]) -> None:
        """newest-minus-first (no resets) and the step-by-step sum give the same deltas."""
        w = Window(10_000)
        total = 0
        at = 0.0
        for new, restart, missing in plan:
            total = new if restart else total + new
            at += 5.0
            per_bucket = [total // 2, total - total // 2] + [0] * 9
            if missing:
                w.push(Snapshot(at=at, era="v1", prefix="vllm:", models={}))
            else:
                w.push(snap(at, ttft=hist(per_bucket, total=total * 0.5), preemptions=float(total)))
        entries = list(w._entries)
        steps = [s.get("m") for _, s in entries[1:]]
        first, newest = entries[0][0].models.get("m"), entries[-1][0].models.get("m")
        fast = _window_deltas(first, newest, steps)
        counters: dict[str, float] = {}
        hists: dict[str, Histogram] = {}
        _sum_steps(["preemptions", "ttft"], steps, counters, hists, set())
        assert fast[0].get("preemptions") == counters.get("preemptions")
        got, want = fast[1].get("ttft"), hists.get("ttft")
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got.cumulative == want.cumulative and got.count == want.count
            assert got.sum == pytest.approx(want.sum)


def frozen_after(
    stop: float, until: float, *, every: float = 5.0, running: float = 8.0, **extra: float
) -> list[Snapshot]:
    """Tokens flowing until ``stop``, then every series frozen (a hung engine) to ``until``."""
    out = []
    t = 0.0
    while t <= until:
        moving = min(t, stop)
        out.append(
            snap(t, generation_tokens=moving * 40, kv_usage=0.1 + moving / 1000, running=running)
        )
        t += every
    return out


class TestProgress:
    def test_seconds_without_progress_count_from_the_last_move(self) -> None:
        """Tokens stop at 20 s with 8 requests running: at 50 s, 30 s without progress."""
        w = Window(60)
        fill(w, frozen_after(20.0, 50.0))
        p = w.signals("m").progress
        assert p is not None
        assert p.last_progress_at == 20.0 and p.seconds_without_progress == 30.0
        assert (p.running, p.waiting, p.outstanding) == (8.0, None, 8.0)
        assert p.last_values["generation_tokens"] == 800.0
        assert set(p.checked) == {"generation_tokens", "running", "kv_usage"}
        assert p.interval_seconds == pytest.approx(5.0)

    def test_a_stall_outlasts_the_window(self) -> None:
        """The time of the last progress is kept when the snapshots that showed it leave
        the window: a 10 s window still sees a stall of 90 s."""
        w = Window(10)
        fill(w, frozen_after(10.0, 100.0))
        p = w.signals("m").progress
        assert p is not None and p.seconds_without_progress == 90.0
        assert len(w) == 3  # the window itself holds only its last 10 s

    def test_an_idle_engine_owes_nothing(self) -> None:
        """Frozen series with nothing running or waiting is an idle server, not a stall."""
        w = Window(60)
        fill(w, frozen_after(20.0, 100.0, running=0.0))
        p = w.signals("m").progress
        assert p is not None and p.seconds_without_progress == 0.0

    def test_any_moving_series_is_progress(self) -> None:
        """Counters flat but a gauge moving (a long prompt prefilled chunk by chunk fills
        the KV cache step by step): the engine steps."""
        w = Window(60)
        fill(
            w,
            [
                snap(t, generation_tokens=5.0, running=1.0, kv_usage=t / 100)
                for t in range(0, 60, 5)
            ],
        )
        p = w.signals("m").progress
        assert p is not None and p.seconds_without_progress == 0.0 and p.last_progress_at == 55

    def test_counters_going_down_is_a_restart_not_a_stall(self) -> None:
        """vLLM restarted: every counter is back near zero. That is progress."""
        w = Window(60)
        snaps = frozen_after(10.0, 40.0)
        restarted = snap(45.0, generation_tokens=3.0, kv_usage=0.1 + 10 / 1000, running=8.0)
        fill(w, [*snaps, restarted])
        p = w.signals("m").progress
        assert p is not None and p.last_progress_at == 45.0 and p.seconds_without_progress == 0

    def test_a_gap_longer_than_the_window_starts_the_watch_again(self) -> None:
        """Nothing was seen for longer than the window (the daemon paused, the target was
        down): the gap is not counted as time without progress."""
        w = Window(60)
        fill(w, frozen_after(10.0, 20.0))
        later = [
            snap(t, generation_tokens=400.0, kv_usage=0.11, running=8.0) for t in (200.0, 205.0)
        ]
        fill(w, later)
        p = w.signals("m").progress
        assert p is not None and p.last_progress_at == 200.0 and p.seconds_without_progress == 5

    def test_an_unanswered_probe_is_work_owed(self) -> None:
        """Gauges say idle, but a probe sent at 30 s is still unanswered at 70 s while
        nothing moves: 40 s without progress (the hang metrics cannot show)."""
        w = Window(60)
        snaps = frozen_after(20.0, 70.0, running=0.0)
        probed = [
            dataclasses.replace(s, probe=ProbeStatus(unanswered_since=30.0)) if s.at >= 30 else s
            for s in snaps
        ]
        fill(w, probed)
        p = w.signals("m").progress
        assert p is not None and p.seconds_without_progress == 40.0
        assert p.probe_unanswered_seconds == 40.0

    def test_an_unanswered_probe_on_a_moving_engine_is_a_busy_server(self) -> None:
        w = Window(60)
        snaps = [
            snap(t, generation_tokens=t * 40, running=50.0, waiting=200.0) for t in range(0, 65, 5)
        ]
        fill(w, [dataclasses.replace(s, probe=ProbeStatus(unanswered_since=10.0)) for s in snaps])
        p = w.signals("m").progress
        assert p is not None and p.seconds_without_progress == 0.0

    def test_the_last_stall_is_told_for_one_window(self) -> None:
        """A stretch without progress that ended is kept while the window holds its
        delayed observations, then forgotten."""
        w = Window(60)
        fill(w, frozen_after(20.0, 60.0))
        fill(w, [snap(65.0, generation_tokens=900.0, kv_usage=0.2, running=8.0)])
        p = w.signals("m").progress
        assert p is not None and p.previous_stall_seconds == 40.0
        assert p.previous_stall_ended_seconds_ago == 0.0 and p.seconds_without_progress == 0
        fill(
            w,
            [
                snap(t, generation_tokens=900.0 + t, kv_usage=0.2, running=8.0)
                for t in (125.0, 130.0)
            ],
        )
        p = w.signals("m").progress
        assert p is not None and p.previous_stall_seconds is None

    def test_gauges_alone_cannot_tell(self) -> None:
        """Without a counter that must move when the engine steps, steady gauges are not
        evidence of anything: progress is not judged, and the signals say why."""
        w = Window(60)
        fill(w, [snap(t, running=4.0, waiting=10.0, kv_usage=0.1) for t in range(0, 65, 5)])
        s = w.signals("m")
        assert s.progress is None and "not exposed" in s.missing["progress"]

    def test_engine_steps_are_read_when_exposed(self) -> None:
        """vllm:iteration_tokens_total_count, one per engine step, is a progress series."""
        w = Window(60)
        fill(w, [snap(t, iterations=t * 10, running=1.0) for t in range(0, 20, 5)])
        p = w.signals("m").progress
        assert p is not None and "iterations" in p.checked and p.seconds_without_progress == 0

    def test_models_that_are_gone_are_forgotten(self) -> None:
        """A model no longer exposed leaves nothing behind; back, it is watched anew."""
        w = Window(60)
        fill(w, frozen_after(0.0, 30.0))
        fill(w, [snap(35.0, model="other", generation_tokens=1.0, running=1.0)])
        fill(w, [snap(40.0, generation_tokens=0.0, kv_usage=0.1, running=8.0)])
        p = w.signals("m").progress
        assert p is not None and p.last_progress_at == 40.0
