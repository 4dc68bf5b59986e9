"""Tests for daemon/vllm_triage/core/signals.py: a window's totals read as rates, percentiles and
means (through ``Window.signals``, and straight from ``WindowTotals`` as fleet mode does)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from vllm_triage.core.model import Histogram, KVPool, Snapshot, WindowTotals
from vllm_triage.core.signals import signals_from_totals
from vllm_triage.core.totals import Window

from support.snapshots import hist, snap


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
        assert s.prefill_time_count == 4  # the requests that finished: the share is theirs
        assert s.queue_time_mean == pytest.approx(0.5)


class TestDecodeSpeedOnlyFromDecodeSteps:
    """An ITL-derived decode speed is left out of a window whose steps carry prefill: its
    inter-token gaps are the mixed steps' (a prefill chunk and the decodes beside it)."""

    @staticmethod
    def window(step_tokens: float, running: float = 8.0, **extra: float) -> Window:
        w = Window(60, min_observations=1)
        fill(
            w,
            [
                snap(0.0, running=running, itl=hist([0] * 11), iteration_tokens=hist([0] * 11)),
                snap(
                    10.0,
                    running=running,
                    itl=hist([100] + [0] * 10, total=2.5),
                    iteration_tokens=hist([10] + [0] * 10, total=10 * step_tokens),
                    **extra,
                ),
            ],
        )
        return w

    def test_decode_steps_give_a_speed(self) -> None:
        """Eight decoding, nine tokens a step: decode steps; 1 / mean ITL stands."""
        s = self.window(step_tokens=9.0).signals("m")
        assert s.decode_tokens_per_second_per_stream == pytest.approx(40.0)
        assert "decode_tokens_per_second_per_stream" not in s.missing

    def test_steps_that_carry_prefill_give_none_and_say_why(self) -> None:
        """Eight decoding, thirty tokens a step: most of each step is prefill."""
        s = self.window(step_tokens=30.0).signals("m")
        assert s.decode_tokens_per_second_per_stream is None
        why = s.missing["decode_tokens_per_second_per_stream"]
        assert "steps carry prefill" in why and "30 tokens per step for 8 decoding" in why

    @staticmethod
    def rates(prompt_tokens: float) -> Window:
        """No iteration histogram: 1,000 tokens generated, ``prompt_tokens`` computed."""
        w = Window(60, min_observations=1)
        fill(
            w,
            [
                snap(0.0, itl=hist([0] * 11), prompt_tokens=0.0, generation_tokens=0.0),
                snap(
                    10.0,
                    itl=hist([100] + [0] * 10, total=2.5),
                    prompt_tokens=prompt_tokens,
                    generation_tokens=1000.0,
                ),
            ],
        )
        return w

    def test_without_step_counts_the_token_rates_decide(self) -> None:
        """No iteration histogram (an engine that does not count tokens per step): prompt
        tokens computed at least as many as the generated ones is the same ratio."""
        assert self.rates(1200.0).signals("m").decode_tokens_per_second_per_stream is None
        kept = self.rates(600.0).signals("m").decode_tokens_per_second_per_stream
        assert kept == pytest.approx(40.0)


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
