"""Unknown is not a verdict: while a term that could close the gap between the floor and
the measured step is unknown (KV bytes per token while sequences hold context, the
weights, a draft model), ``decode_limit`` is ``unknown``, never ``serving_stack``; the
ratio is marked a lower bound and the summary names the setting that settles it
(``docs/physics.md``, "Where each fact comes from")."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from vllm_triage.core.diagnose import diagnose
from vllm_triage.core.model import CacheConfig, Quantile, Signals
from vllm_triage.core.roofline import sources
from vllm_triage.core.rulebook import Roofline, Rulebook

from support.paths import GOLDEN
from support.physics import H100_ALONE, H100_BANDWIDTH, LLAMA_8B_ON_H100, LLAMA_8B_WEIGHT_BYTES
from support.rulebooks import default_rulebook

#: Llama-3.1-8B's weights on an H100; nothing known of its KV cache.
NO_KV = dataclasses.replace(LLAMA_8B_ON_H100, kv_bytes_per_token=None, kv_split=None)
WEIGHTS_S = LLAMA_8B_WEIGHT_BYTES / H100_BANDWIDTH  # 4.8 ms


def rules(hw: Roofline | None) -> Rulebook:
    return dataclasses.replace(default_rulebook(), roofline=hw)


def signals(**changes: Any) -> Signals:
    """150 streams holding 40 % of a 400,000-token pool, every token slow."""
    base: dict[str, Any] = dict(
        model_name="m",
        at=100.0,
        span_seconds=60.0,
        snapshots=13,
        itl_p50=Quantile(0.5, 0.02),
        itl_p99=Quantile(0.99, 0.3),
        itl_mean=0.020,
        ttft_p99=Quantile(0.99, 0.3),
        running_mean=150.0,
        kv_usage_mean=0.4,
        kv_usage_max=0.45,
        waiting_mean=0.0,
        kv_pool_tokens=400_000,
    )
    return Signals(**{**base, **changes})


class TestKVUnknown:
    def test_sequences_with_context_make_the_limit_unknown(self) -> None:
        """The weights alone are 24 % of a 20 ms step; 160,000 tokens of context could
        read the rest: no verdict, the bound said, and the one setting named."""
        d = diagnose(signals(), rules(NO_KV))
        ev = d.evidence
        assert d.cause == "decode_bound"
        assert ev["decode_limit"] == "unknown"
        assert ev["decode_roofline_ratio"] == pytest.approx(WEIGHTS_S / 0.020, rel=1e-4)
        assert ev["decode_roofline_ratio_is_lower_bound"] is True
        assert ev["decode_roofline_needs"] == sources.SETTLE_KV
        assert "only a lower bound" in d.summary
        assert "set model.kv_bytes_per_token (or serve a model from the table)" in d.summary
        assert "serving stack" not in d.summary
        assert "decode_settings_suspect" not in ev
        # Not the "impossible settings" fix: the cause's own.
        assert d.remediation == default_rulebook().remediation["decode_bound"]

    def test_an_empty_cache_cannot_close_the_gap(self) -> None:
        d = diagnose(signals(kv_usage_mean=0.0, kv_usage_max=0.0), rules(NO_KV))
        assert d.evidence["decode_limit"] == "serving_stack"
        assert "decode_roofline_ratio_is_lower_bound" not in d.evidence

    def test_an_unknown_pool_with_requests_running_may(self) -> None:
        hw = dataclasses.replace(NO_KV, kv_bytes_per_token=131072)
        d = diagnose(signals(kv_pool_tokens=None), rules(hw))
        assert d.evidence["decode_limit"] == "unknown"
        assert d.evidence["decode_roofline_needs"] == sources.SETTLE_POOL

    def test_a_bound_already_at_the_limit_is_the_hardware(self) -> None:
        """The weights alone fill 96 % of the step: whatever the KV reads, the card is
        at its limit (the bound is still said)."""
        d = diagnose(signals(itl_mean=WEIGHTS_S / 0.96), rules(NO_KV))
        assert d.evidence["decode_limit"] == "hardware"
        assert d.evidence["decode_roofline_ratio_is_lower_bound"] is True

    def test_with_the_kv_fact_the_verdict_is_given(self) -> None:
        hw = dataclasses.replace(NO_KV, kv_bytes_per_token=131072)
        d = diagnose(signals(itl_mean=0.1), rules(hw))
        assert d.evidence["decode_limit"] == "serving_stack"
        assert "decode_roofline_ratio_is_lower_bound" not in d.evidence


class TestOtherTerms:
    def test_unknown_weights(self) -> None:
        """A card but no model: the KV reads alone (exact, from the metrics) are a bound,
        and the model's size is what settles it."""
        hw = H100_ALONE
        cfg = CacheConfig(
            num_gpu_blocks=25_000,
            block_size=16,
            kv_cache_size_tokens=400_000,
            gpu_memory_utilization=0.9,
            kv_cache_memory_bytes=400_000 * 131072,
        )
        d = diagnose(signals(kv_cache=cfg), rules(hw))
        assert d.evidence["decode_limit"] == "unknown"
        assert d.evidence["decode_roofline_needs"] == sources.SETTLE_WEIGHTS
        assert "weights" in str(d.evidence["decode_roofline_left_out"])

    def test_nothing_sized_says_the_model(self) -> None:
        hw = H100_ALONE
        d = diagnose(signals(kv_pool_tokens=None), rules(hw))
        assert d.evidence["decode_limit"] == "unknown"
        assert "the model's size is unknown: set model.parameters_billion" in d.summary

    def test_no_card_says_the_card(self) -> None:
        d = diagnose(signals(), rules(None))
        assert d.evidence["decode_limit"] == "unknown"
        assert "set hardware.gpu" in d.summary

    def test_an_unknown_draft_model(self) -> None:
        hw = dataclasses.replace(NO_KV, kv_bytes_per_token=131072)
        s = signals(spec_drafts=1000.0, spec_draft_tokens=4000.0, spec_accepted_tokens=2000.0)
        d = diagnose(s, rules(hw))
        assert d.evidence["decode_limit"] == "unknown"
        assert d.evidence["decode_roofline_needs"] == sources.SETTLE_DRAFT


def test_the_gauges_help_says_lower_bound() -> None:
    """As /metrics shows it (the golden file is the exporter's output)."""
    [help_line] = [
        line
        for line in GOLDEN.read_text(encoding="utf-8").splitlines()
        if line.startswith("# HELP vllm_triage_decode_roofline_ratio ")
    ]
    assert "lower bound when the facts are incomplete" in help_line
    assert "decode_roofline_ratio_is_lower_bound" in help_line
