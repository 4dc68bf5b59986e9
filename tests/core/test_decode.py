"""Tests for daemon/vllm_triage/core/decode.py: the decode split (at the hardware limit, the serving
stack, or impossible settings) from the ceiling, the step roofline and DCGM, and the
fixes in the order it gives."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from vllm_triage.core.diagnose import diagnose
from vllm_triage.core.rulebook import Rulebook

from support.diagnosis import q, rules, signals
from support.physics import A10G_70B, H100_BANDWIDTH, LLAMA_8B_ON_H100, LLAMA_8B_WEIGHT_BYTES
from support.rulebooks import default_rulebook


class TestDecodeCeiling:
    def test_at_the_hardware_limit(self) -> None:
        """Decode at 93 % of the ceiling is the hardware's limit; quantizing comes first."""
        d = diagnose(
            signals(itl_p99=q(0.3), itl_mean=0.25, decode_tokens_per_second_per_stream=4.0),
            rules(A10G_70B),
        )
        assert d.cause == "decode_bound"
        assert d.evidence["decode_limit"] == "hardware"
        assert d.evidence["decode_ceiling_ratio"] == pytest.approx(4.0 / (600 / 140))
        assert "hardware limit" in d.summary
        assert d.remediation[0].startswith("Quantize")

    def test_below_the_ceiling_is_the_serving_stack(self) -> None:
        """Decode at 23 % of the ceiling points at the serving stack, not the card. (The
        ceiling knows no KV bytes per token: with context in the cache the limit would be
        unknown, tests/core/test_roofline_unknown.py; here the cache holds none.)"""
        d = diagnose(
            signals(
                itl_p99=q(0.3),
                itl_mean=1.0,
                decode_tokens_per_second_per_stream=1.0,
                kv_usage_mean=0.0,
            ),
            rules(A10G_70B),
        )
        assert d.evidence["decode_limit"] == "serving_stack"
        assert "serving stack" in d.summary
        assert not d.remediation[0].startswith("Quantize")

    def test_without_hardware(self) -> None:
        """Without hardware settings the ratio is left out and the summary says why."""
        d = diagnose(
            signals(itl_p99=q(0.3), itl_mean=0.25, decode_tokens_per_second_per_stream=4.0), rules()
        )
        assert d.cause == "decode_bound"
        assert "decode_ceiling_ratio" not in d.evidence
        assert d.evidence["decode_limit"] == "unknown"


def roofline_rules() -> Rulebook:
    """Llama-3.1-8B at bf16 on an H100 with its KV layout: the roofline's facts."""
    return dataclasses.replace(default_rulebook(), roofline=LLAMA_8B_ON_H100)


#: 150 streams holding 40 % of a 400,000-token pool: 16.06 GB of weights and 20.97 GB
#: of KV a step, an 11.05 ms floor on an H100 (3.35 TB/s).
BATCH = dict(itl_p99=q(0.3), running_mean=150.0, kv_usage_mean=0.4, kv_pool_tokens=400_000)
FLOOR_S = (LLAMA_8B_WEIGHT_BYTES + 160_000 * 131072) / H100_BANDWIDTH
#: 32 streams in a nearly empty pool while prompts pour in at 50,000 tokens/s: each step
#: carries so many prefill tokens that compute, not memory, sets its floor.
COMPUTE_BOUND: dict[str, Any] = dict(
    itl_p99=q(0.3),
    itl_mean=0.15,
    running_mean=32.0,
    kv_usage_mean=0.05,
    kv_pool_tokens=400_000,
    prompt_tokens_per_second=50_000.0,
)


class TestDecodeRoofline:
    def test_at_the_floor_is_the_hardware_and_kv_comes_first(self) -> None:
        """A step 1.1x its floor is at the hardware's limit; KV reads dominate, so the
        first fix is an 8-bit KV cache, then the weights'."""
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 1.1), roofline_rules())
        ev = d.evidence
        assert d.cause == "decode_bound"
        assert ev["decode_limit"] == "hardware"
        assert ev["decode_roofline_ratio"] == pytest.approx(1 / 1.1, rel=1e-4)
        assert ev["decode_step_floor_seconds"] == pytest.approx(FLOOR_S, rel=1e-4)
        assert (ev["decode_bound_by"], ev["decode_dominant_term"]) == ("memory", "kv")
        assert "at the hardware limit, KV cache reads dominate" in d.summary
        assert "fp8" in d.remediation[0]
        assert any(r.startswith("Quantize") for r in d.remediation[3:])

    def test_far_above_the_floor_is_the_serving_stack(self) -> None:
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 4), roofline_rules())
        assert d.evidence["decode_limit"] == "serving_stack"
        assert "serving stack" in d.summary
        assert "per-step overhead" in d.remediation[0]

    def test_faster_than_the_floor_means_the_settings_are_wrong(self) -> None:
        """A step half its floor is impossible: the summary says the settings are wrong
        and names them, the KV setting first (the dominant term)."""
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S / 2), roofline_rules())
        ev = d.evidence
        assert ev["decode_limit"] == "unknown"
        assert "settings are wrong" in d.summary and "model.kv_bytes_per_token" in d.summary
        assert str(ev["decode_settings_suspect"]).startswith("model.kv_bytes_per_token")
        assert "hardware.tensor_parallel_size" in str(ev["decode_settings_suspect"])
        assert "faster than the hardware and model settings allow" in d.remediation[0]

    def test_compute_bound_steps_fix_tokens_per_step_first(self) -> None:
        d = diagnose(signals(**COMPUTE_BOUND), roofline_rules())
        assert d.evidence["decode_bound_by"] == "compute"
        assert d.evidence["decode_limit"] == "hardware"
        assert "fewer tokens per step" in d.remediation[0]

    def test_healthy_carries_the_roofline(self) -> None:
        """The roofline is evidence while healthy too (exported, drawn in Grafana)."""
        d = diagnose(signals(**{**BATCH, "itl_p99": q(0.015)}, itl_mean=0.013), roofline_rules())
        assert d.cause is None
        assert d.evidence["decode_roofline_ratio"] == pytest.approx(FLOOR_S / 0.013, rel=1e-4)
        assert "decode_limit" not in d.evidence

    def test_unknown_kv_is_named_in_the_summary(self) -> None:
        rules = dataclasses.replace(
            roofline_rules(),
            roofline=dataclasses.replace(LLAMA_8B_ON_H100, kv_bytes_per_token=None),
        )
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 1.1), rules)
        assert "left out: KV reads" in d.summary
        assert "model.kv_bytes_per_token" in str(d.evidence["decode_roofline_left_out"])

    def test_spec_decode_per_stream_rate_in_the_summary(self) -> None:
        d = diagnose(
            signals(
                **BATCH,
                itl_mean=FLOOR_S * 1.1,
                decode_tokens_per_step=2.5,
                decode_tokens_per_second_per_stream=2.5 / (FLOOR_S * 1.1),
            ),
            roofline_rules(),
        )
        assert d.evidence["decode_tokens_per_step"] == 2.5
        assert f"{2.5 / (FLOOR_S * 1.1):.3g} tok/s per stream" in d.summary


class TestMeasuredMemoryActivity:
    """DCGM's DRAM activity in the decode split (fleet mode): a card busy reading memory
    is at its limit whatever the arithmetic says; disagreements are said."""

    def test_busy_memory_is_the_hardware_limit_though_the_floor_is_low(self) -> None:
        """The arithmetic puts the step at a quarter of its floor (it misses reads), but
        the memory interface is busy 75 % of cycles: at the hardware limit."""
        d = diagnose(
            signals(**BATCH, itl_mean=FLOOR_S * 4, dram_active_mean=0.75), roofline_rules()
        )
        ev = d.evidence
        assert ev["decode_limit"] == "hardware"
        assert ev["decode_dram_active_ratio"] == 0.75
        assert ev["decode_dram_agrees_with_roofline"] is False
        assert "memory busy 75% of cycles" in d.summary
        assert "at the hardware limit by measurement, though the floor is only 25%" in d.summary
        assert "fp8" in d.remediation[0]  # the reads to cut, KV's first

    def test_quiet_memory_disagrees_with_a_memory_bound_floor(self) -> None:
        d = diagnose(
            signals(**BATCH, itl_mean=FLOOR_S * 1.1, dram_active_mean=0.2), roofline_rules()
        )
        assert d.evidence["decode_limit"] == "hardware"  # the roofline's verdict stands
        assert d.evidence["decode_dram_agrees_with_roofline"] is False
        assert "busy only 20% of cycles: the measurement and the arithmetic disagree" in d.summary

    def test_both_say_the_limit(self) -> None:
        d = diagnose(
            signals(**BATCH, itl_mean=FLOOR_S * 1.1, dram_active_mean=0.7), roofline_rules()
        )
        assert d.evidence["decode_dram_agrees_with_roofline"] is True
        assert "disagree" not in d.summary

    def test_quiet_memory_below_the_floor_agrees_on_the_serving_stack(self) -> None:
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 4, dram_active_mean=0.2), roofline_rules())
        assert d.evidence["decode_limit"] == "serving_stack"
        assert d.evidence["decode_dram_agrees_with_roofline"] is True

    def test_a_compute_bound_step_leaves_the_memory_quiet(self) -> None:
        d = diagnose(signals(**COMPUTE_BOUND, dram_active_mean=0.1), roofline_rules())
        assert d.evidence["decode_bound_by"] == "compute"
        assert d.evidence["decode_dram_agrees_with_roofline"] is True

    def test_busy_memory_without_any_hardware_settings(self) -> None:
        d = diagnose(signals(itl_p99=q(0.3), itl_mean=0.2, dram_active_mean=0.8), rules())
        assert d.evidence["decode_limit"] == "hardware"
        assert "decode_dram_agrees_with_roofline" not in d.evidence
        assert "memory busy 80% of cycles: at the hardware limit" in d.summary

    def test_the_threshold_is_the_settings(self) -> None:
        strict = dataclasses.replace(
            roofline_rules(),
            thresholds=dataclasses.replace(default_rulebook().thresholds, dram_active_busy=0.9),
        )
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 4, dram_active_mean=0.75), strict)
        assert d.evidence["decode_limit"] == "serving_stack"

    def test_a_sidecar_has_no_measurement(self) -> None:
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 4), roofline_rules())
        assert "decode_dram_active_ratio" not in d.evidence and "DCGM" not in d.summary
