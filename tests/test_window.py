"""Tests for daemon/core/window.py: windowed signals over snapshots."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_triage.core.model import (
    Histogram,
    KVPool,
    ModelSeries,
    ProbeStatus,
    Snapshot,
    WindowTotals,
)
from vllm_triage.core.window import Window, _sum_steps, _window_deltas, signals_from_totals

from snapshots import hist, snap


def fill(window: Window, snaps: list[Snapshot]) -> None:
    for s in snaps:
        assert window.push(s)


class TestRates:
    def test_counter_rate_over_the_span(self) -> None:
        """A counter rising 600 over 60 s is 10 per second."""
        w = Window(60)
        fill(w, [snap(t, generation_tokens=t * 10.0) for t in range(0, 61, 5)])
        assert w.signals("m").generation_tokens_per_second == pytest.approx(10.0)

    def test_counter_reset_is_never_negative(self) -> None:
        """A counter reset inside the window counts from zero, not as a negative rate."""
        w = Window(60)
        values = [100.0, 200.0, 50.0, 150.0]  # vLLM restarted between 10 s and 20 s
        fill(w, [snap(t * 10.0, preemptions=v) for t, v in enumerate(values)])
        s = w.signals("m")
        assert s.preemptions_per_second == pytest.approx((100 + 50 + 100) / 30)

    def test_one_snapshot_is_not_enough(self) -> None:
        """With one snapshot there is no rate and no percentile, and the reason says so."""
        w = Window(60)
        fill(w, [snap(0.0, preemptions=5.0, ttft=hist([30] + [0] * 10))])
        s = w.signals("m")
        assert s.preemptions_per_second is None and s.ttft_p99 is None
        assert "not enough data" in s.missing["ttft_p99"]


class TestLatency:
    def test_percentiles_use_only_the_windows_observations(self) -> None:
        """Observations from before the window do not leak into its percentiles."""
        w = Window(60)
        slow = [0] * 8 + [1000, 0, 0]  # 1000 old observations in (5, 10]
        fast = [0, 50] + [0] * 9  # 50 new ones in (0.02, 0.04]
        both = [s + f for s, f in zip(slow, fast, strict=True)]
        fill(
            w, [snap(0.0, ttft=hist(slow, total=7000.0)), snap(30.0, ttft=hist(both, total=7001.5))]
        )
        s = w.signals("m")
        assert s.ttft_p99 is not None and s.ttft_p99.value <= 0.04
        assert s.ttft_count == 50
        assert s.ttft_mean == pytest.approx(1.5 / 50)

    def test_too_few_observations_is_not_enough_data(self) -> None:
        """Fewer observations than the minimum is reported, never guessed."""
        w = Window(60, min_observations=20)
        fill(w, [snap(0.0, ttft=hist([0] * 11)), snap(10.0, ttft=hist([0, 0, 5] + [0] * 8))])
        s = w.signals("m")
        assert s.ttft_p99 is None
        assert s.missing["ttft_p99"].startswith("not enough data: 5 observations")
        assert s.ttft_mean is not None  # a mean of five is still a fact

    def test_overflow_is_flagged(self) -> None:
        """A p99 in the +Inf bucket says that it is only a lower bound."""
        w = Window(60, min_observations=1)
        fill(w, [snap(0.0, ttft=hist([0] * 11)), snap(10.0, ttft=hist([0] * 10 + [40]))])
        q = w.signals("m").ttft_p99
        assert q is not None and q.position == "above_last_bound" and q.value == 20.0

    def test_decode_rate_is_inverse_mean_itl(self) -> None:
        """Per-stream decode rate is 1 / mean ITL."""
        w = Window(60, min_observations=1)
        fill(w, [snap(0.0, itl=hist([0] * 11)), snap(10.0, itl=hist([100] + [0] * 10, total=2.5))])
        s = w.signals("m")
        assert s.itl_mean == pytest.approx(0.025)
        assert s.decode_tokens_per_second_per_stream == pytest.approx(40.0)

    def test_speculative_decoding_tokens_per_step(self) -> None:
        """Under speculative decoding a step emits 1 + accepted / drafts tokens per
        request (one ITL sample per step): the per-stream rate is that over mean ITL."""
        w = Window(60, min_observations=1)
        start = dict(spec_drafts=10.0, spec_draft_tokens=40.0, spec_accepted_tokens=20.0)
        end = dict(spec_drafts=110.0, spec_draft_tokens=440.0, spec_accepted_tokens=170.0)
        fill(
            w,
            [
                snap(0.0, itl=hist([0] * 11), **start),
                snap(10.0, itl=hist([100] + [0] * 10, total=2.5), **end),
            ],
        )
        s = w.signals("m")
        assert s.decode_tokens_per_step == pytest.approx(1 + 150 / 100)
        assert s.decode_tokens_per_second_per_stream == pytest.approx(2.5 / 0.025)
        assert (s.spec_drafts, s.spec_draft_tokens, s.spec_accepted_tokens) == (100, 400, 150)

    def test_without_speculative_decoding_one_token_per_step(self) -> None:
        w = Window(60, min_observations=1)
        fill(w, [snap(0.0), snap(10.0)])
        s = w.signals("m")
        assert s.decode_tokens_per_step == 1.0 and s.spec_drafts is None

    def test_iteration_tokens_over_the_window(self) -> None:
        """Tokens per engine step: the window's sum over its count of steps."""
        w = Window(60, min_observations=1)
        fill(
            w,
            [
                snap(0.0, iteration_tokens=hist([5] + [0] * 10, total=50.0)),
                snap(10.0, iteration_tokens=hist([25] + [0] * 10, total=2050.0)),
            ],
        )
        s = w.signals("m")
        assert s.iteration_steps == 20 and s.iteration_tokens_mean == pytest.approx(100.0)
        assert s.iteration_tokens is not None and s.iteration_tokens.count == 20

    def test_busy_means_leave_out_idle_scrapes(self) -> None:
        """Running requests while requests ran, and KV usage over those scrapes weighted by
        the requests running (as the mean ITL weighs steps): what the mean step reads."""
        w = Window(60)
        fill(
            w,
            [
                snap(0.0, running=0.0, kv_usage=0.0),
                snap(5.0, running=4.0, kv_usage=0.6),
                snap(10.0, running=2.0, kv_usage=0.2),
            ],
        )
        s = w.signals("m")
        assert s.kv_usage_busy_mean == pytest.approx((0.6 * 4 + 0.2 * 2) / 6)
        assert s.running_busy_mean == pytest.approx(3.0)
        assert s.kv_usage_mean == pytest.approx(0.8 / 3)

    def test_prefill_share_and_queue_mean(self) -> None:
        """Engine time split and queue time come from the request histograms' sums."""
        w = Window(60)
        zero = hist([0] * 11)
        fill(
            w,
            [
                snap(0.0, prefill_time=zero, decode_time=zero, queue_time=zero),
                snap(
                    10.0,
                    prefill_time=hist([0, 4] + [0] * 9, total=3.0),
                    decode_time=hist([0, 4] + [0] * 9, total=1.0),
                    queue_time=hist([0, 4] + [0] * 9, total=2.0),
                ),
            ],
        )
        s = w.signals("m")
        assert s.prefill_time_share == pytest.approx(0.75)
        assert s.queue_time_mean == pytest.approx(0.5)


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


class TestTotals:
    """``signals_from_totals``: the one reading of a window's totals, shared by the
    sidecar's window and fleet mode's Prometheus answers."""

    def totals(self) -> tuple[Window, WindowTotals]:
        w = Window(60, min_observations=5)
        fill(
            w,
            [
                snap(
                    t,
                    pool=KVPool(block_size=16, num_gpu_blocks=1000),
                    running=4.0,
                    waiting=float(t % 2),
                    kv_usage=0.5,
                    generation_tokens=t * 100.0,
                    ttft=hist([0, 2 * t, t] + [0] * 8, total=t * 1.0),
                    queue_time=hist([t] + [0] * 10, total=t * 0.1),
                )
                for t in range(0, 61, 5)
            ],
        )
        return w, w.totals("m")

    def test_the_window_reads_its_totals(self) -> None:
        w, t = self.totals()
        assert t.span_seconds == 60 and t.snapshots == 13 and t.kv_pool_tokens == 16_000
        assert t.counters["generation_tokens"] == 6000
        assert signals_from_totals(t, 5) == w.signals("m")

    def test_a_histogram_read_for_its_mean_alone(self) -> None:
        """Fleet mode fetches only the sum and count of the histograms it takes means
        of: a single +Inf bucket gives the same mean and count."""
        w, t = self.totals()
        q = t.histograms["queue_time"]
        mean_only = Histogram(bounds=(math.inf,), cumulative=(q.count,), count=q.count, sum=q.sum)
        got = signals_from_totals(
            dataclasses.replace(t, histograms={**t.histograms, "queue_time": mean_only}), 5
        )
        assert got == w.signals("m")

    def test_no_span_is_not_enough_data(self) -> None:
        _, t = self.totals()
        s = signals_from_totals(dataclasses.replace(t, span_seconds=0.0, snapshots=1), 5)
        assert s.ttft_p99 is None and s.generation_tokens_per_second is None
        assert s.missing["ttft_p99"].startswith("not enough data: one snapshot")

    def test_measured_memory_activity_passes_through(self) -> None:
        _, t = self.totals()
        assert (
            signals_from_totals(dataclasses.replace(t, dram_active_mean=0.7), 5).dram_active_mean
            == 0.7
        )
