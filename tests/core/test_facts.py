"""Tests for daemon/vllm_triage/core/facts.py: the derived numbers (KV headroom in requests, the
queue's share of TTFT), the evidence that carries them, and the measurements charted
from it for every evaluation."""

from __future__ import annotations

import dataclasses

import pytest

from vllm_triage.core.diagnose import diagnose
from vllm_triage.core.facts import measurements
from vllm_triage.core.model import Quantile, Signals

from support.diagnosis import KV_FULL_PREEMPTING, q, rules, signals
from support.physics import LLAMA_8B_H100_CEILING


class TestEvidence:
    def test_evidence_holds_the_deciding_numbers(self) -> None:
        """KV pressure's evidence carries the headroom, usage, waiting and preemptions."""
        d = diagnose(signals(**KV_FULL_PREEMPTING), rules())
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


def bare(**fields: object) -> Signals:
    """Signals that know nothing but what a test gives them."""
    base = Signals(model_name="m", at=100.0, span_seconds=60.0, snapshots=12)
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


class TestMeasurements:
    """``measurements``: every number one evaluation gives a chart, by evidence key
    (``Evaluation.measurements`` holds them, one dict per model)."""

    def test_a_healthy_evaluation_has_its_numbers_too(self) -> None:
        """The evidence is only attached to breached diagnoses; the charts need every one."""
        s = bare(
            ttft_p50=Quantile(0.5, 0.2),
            ttft_p99=Quantile(0.99, 0.9),
            itl_p99=Quantile(0.99, 0.04),
            waiting_mean=0.0,
            running_mean=7.0,
            kv_usage_mean=0.31,
            prefill_time_share=0.12,
        )
        d = diagnose(s, rules())
        assert d.cause is None and d.evidence == {}
        values = measurements(s, d, rules())
        assert values["ttft_p50_seconds"] == 0.2
        assert values["ttft_p99_seconds"] == 0.9
        assert values["itl_p99_seconds"] == 0.04
        assert values["requests_running_mean"] == 7.0
        assert values["kv_usage_mean"] == 0.31
        assert values["prefill_time_share"] == 0.12

    def test_unknown_is_absent_never_zero(self) -> None:
        """A signal the server does not expose is not drawn as 0."""
        s = bare(running_mean=3.0)
        values = measurements(s, diagnose(s, rules()), rules())
        assert "kv_usage_mean" not in values and "ttft_p99_seconds" not in values
        assert "decode_ceiling_ratio" not in values  # no hardware set: no ceiling

    def test_any_numeric_evidence_key_becomes_a_series(self) -> None:
        """A key a diagnosis adds (the roofline's, say) is charted without code here
        knowing it; text and flags are not numbers and are left out."""
        s = bare(itl_p99=Quantile(0.99, 0.5))
        d = dataclasses.replace(
            diagnose(s, rules()),
            evidence={"decode_roofline_ratio": 0.93, "decode_limit": "hardware", "x": True},
        )
        values = measurements(s, d, rules())
        assert values["decode_roofline_ratio"] == 0.93
        assert "decode_limit" not in values and "x" not in values

    def test_ceiling_ratio_at_every_evaluation(self) -> None:
        h100 = rules(LLAMA_8B_H100_CEILING)
        s = bare(decode_tokens_per_second_per_stream=150.0)
        values = measurements(s, diagnose(s, h100), h100)
        assert values["decode_ceiling_ratio"] == pytest.approx(150.0 / 208.6, rel=1e-3)
