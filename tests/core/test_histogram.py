"""Tests for daemon/vllm_triage/core/histogram.py: Prometheus histogram_quantile semantics and
deltas."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_triage.core.histogram import bucket_quantile, counter_delta, histogram_delta
from vllm_triage.core.model import Histogram

INF = math.inf
H = Histogram(bounds=(0.1, 0.5, 1.0, INF), cumulative=(10, 50, 90, 100), count=100, sum=42.0)


class TestBucketQuantile:
    @pytest.mark.parametrize(
        ("q", "value", "position"),
        [
            # rank 50 lands exactly on the top of the (0.1, 0.5] bucket
            pytest.param(0.5, 0.5, "interpolated", id="p50-bucket-edge"),
            # rank 90: top of (0.5, 1.0]
            pytest.param(0.9, 1.0, "interpolated", id="p90"),
            # rank 70: halfway through (0.5, 1.0]
            pytest.param(0.7, 0.75, "interpolated", id="p70-interpolated"),
            # rank 99 falls in +Inf: PromQL answers the highest finite bound
            pytest.param(0.99, 1.0, "above_last_bound", id="p99-in-inf"),
            # rank 5 in the first bucket: interpolated from a lower bound of 0
            pytest.param(0.05, 0.05, "below_first_bound", id="p5-first-bucket"),
        ],
    )
    def test_matches_promql(self, q: float, value: float, position: str) -> None:
        """Quantiles equal PromQL's histogram_quantile and say where the rank fell."""
        got = bucket_quantile(q, H)
        assert got is not None
        assert got.value == pytest.approx(value)
        assert got.position == position

    def test_no_observations_is_none(self) -> None:
        """An empty histogram has no quantile (PromQL: NaN), not zero."""
        empty = Histogram(bounds=(1.0, INF), cumulative=(0, 0), count=0, sum=0)
        assert bucket_quantile(0.99, empty) is None

    def test_non_positive_first_bound(self) -> None:
        """A first bound <= 0 is returned as is when the rank falls in it (PromQL)."""
        h = Histogram(bounds=(-1.0, 1.0, INF), cumulative=(5, 10, 10), count=10, sum=0)
        got = bucket_quantile(0.2, h)
        assert got is not None and got.value == -1.0 and got.position == "below_first_bound"

    def test_out_of_range_q_is_refused(self) -> None:
        """q outside [0, 1] is a programming error, not a value."""
        with pytest.raises(ValueError):
            bucket_quantile(1.5, H)

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(st.integers(min_value=0, max_value=1000), min_size=2, max_size=15),
        st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=6),
    )
    def test_monotone_in_q(self, increments: list[int], qs: list[float]) -> None:
        """For any histogram, a higher q never gives a lower quantile."""
        cumulative = []
        total = 0
        for inc in increments:
            total += inc
            cumulative.append(float(total))
        bounds = (*(0.01 * 2**i for i in range(len(cumulative) - 1)), INF)
        h = Histogram(bounds=bounds, cumulative=tuple(cumulative), count=total, sum=1.0)
        values = [bucket_quantile(q, h) for q in sorted(qs)]
        if total == 0:
            assert all(v is None for v in values)
            return
        numbers = [v.value for v in values if v is not None]
        assert numbers == sorted(numbers)


class TestDeltas:
    def test_counter_reset_counts_from_zero(self) -> None:
        """A counter that went down restarted: the new value is the increase, never negative."""
        assert counter_delta(newer=30.0, older=100.0) == 30.0
        assert counter_delta(newer=130.0, older=100.0) == 30.0

    def test_histogram_delta(self) -> None:
        """Bucket deltas subtract bucket by bucket."""
        older = Histogram(bounds=(1.0, INF), cumulative=(5, 8), count=8, sum=4.0)
        newer = Histogram(bounds=(1.0, INF), cumulative=(7, 12), count=12, sum=9.0)
        d = histogram_delta(newer, older)
        assert d.cumulative == (2, 4) and d.count == 4 and d.sum == 5.0

    def test_a_falling_sum_is_a_restart(self) -> None:
        """Count up but sum down (found by tests/core/test_fuzz.py): not a negative mean, a
        restart, so the newer histogram is the delta."""
        older = Histogram(bounds=(1.0, INF), cumulative=(0, 0), count=0, sum=1.0)
        newer = Histogram(bounds=(1.0, INF), cumulative=(0, 1), count=1, sum=0.5)
        assert histogram_delta(newer, older) is newer

    def test_histogram_reset(self) -> None:
        """A histogram whose count went down restarted: the newer one is the delta."""
        older = Histogram(bounds=(1.0, INF), cumulative=(5, 8), count=8, sum=4.0)
        newer = Histogram(bounds=(1.0, INF), cumulative=(1, 2), count=2, sum=0.5)
        assert histogram_delta(newer, older) == newer

    def test_changed_layout_is_a_restart(self) -> None:
        """New bucket bounds (an upgraded vLLM) cannot be subtracted: the newer counts."""
        older = Histogram(bounds=(1.0, INF), cumulative=(5, 8), count=8, sum=4.0)
        newer = Histogram(bounds=(0.5, 1.0, INF), cumulative=(1, 9, 10), count=10, sum=5.0)
        assert histogram_delta(newer, older) == newer
