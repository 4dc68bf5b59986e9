"""Tests for daemon/core/facts.py: the derived numbers (KV headroom in requests, the
queue's share of TTFT) and the evidence that carries them."""

from __future__ import annotations

import pytest
from test_diagnose import CASES, q, rules, signals

from vllm_triage.core.diagnose import diagnose


class TestEvidence:
    def test_evidence_holds_the_deciding_numbers(self) -> None:
        """KV pressure's evidence carries the headroom, usage, waiting and preemptions."""
        d = diagnose(signals(**CASES[0].values[0]), rules())
        ev = d.evidence
        # free tokens at the fullest moment (99 % used) over the tokens per running request
        assert ev["kv_headroom_requests"] == pytest.approx(
            (100_000 * 0.01) / (97_000 / 8), rel=1e-5
        )
        assert ev["requests_waiting_mean"] == 6.0
        assert ev["preemptions_per_second"] == 0.4
        assert ev["breaches"] == "ttft_p99,waiting,kv_preemptions"

    def test_no_nan_in_evidence(self) -> None:
        """A NaN from a broken target never reaches the evidence."""
        d = diagnose(signals(ttft_p99=q(9.0), ttft_mean=float("nan")), rules())
        assert "ttft_mean_seconds" not in d.evidence


class TestKvHeadroom:
    def test_footprint_is_the_finished_requests_size(self) -> None:
        """Room is counted in requests as big as finished ones grew (prompt + output):
        a 2,048-token pool half used has no room for a 1,500-token request."""
        d = diagnose(
            signals(
                waiting_mean=5.0, running_mean=1.0, kv_usage_mean=0.5, kv_usage_max=0.5,
                kv_pool_tokens=2048, mean_prompt_tokens=700.0, mean_generation_tokens=800.0,
                ttft_p99=q(9.0), ttft_mean=6.0, queue_time_mean=5.5,
            ),
            rules(),
        )  # fmt: skip
        assert d.cause == "kv_pressure"
        assert d.evidence["kv_request_footprint_tokens"] == 1500.0
        assert d.evidence["kv_headroom_requests"] == pytest.approx(1024 / 1500, rel=1e-5)

    def test_fullest_moment_counts(self) -> None:
        """A window that began idle (mean usage low) still sees the pool full at its peak."""
        d = diagnose(
            signals(
                waiting_mean=3.0, running_mean=0.9, kv_usage_mean=0.4, kv_usage_max=0.8,
                kv_pool_tokens=2048, ttft_p99=q(0.5),
            ),
            rules(),
        )  # fmt: skip
        assert d.cause == "kv_pressure"


class TestQueueShare:
    def test_share_needs_comparable_requests(self) -> None:
        """Queue time seen for few requests (V1 observes it at finish) is no share of TTFT:
        the waiting queue alone decides, and nothing claims "0 % of TTFT"."""
        d = diagnose(
            signals(
                waiting_mean=12.0, ttft_p99=q(19.0), ttft_mean=10.0, ttft_count=16.0,
                queue_time_mean=0.001, queue_time_count=2.0,
            ),
            rules(),
        )  # fmt: skip
        assert d.cause == "queue_bound"
        assert d.secondary == ()
        assert "queue_share_of_ttft" not in d.evidence
