"""Tests for daemon/vllm_triage/core/roofline/step.py: the decode step's floor, term by term, by
hand.

Each case builds the window's signals and the card's and model's facts, and checks the
floor against the arithmetic of ``docs/physics.md`` ("The decode roofline") done here in
the test, not copied from the code.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from vllm_triage.core.model import Histogram, Signals
from vllm_triage.core.roofline.step import (
    ITERATION_TOKENS,
    RUNNING,
    StepRoofline,
    evidence,
    step_roofline,
    suspect_settings,
    terms_by_weight,
    weights_only,
)
from vllm_triage.core.rulebook import Ceiling, Roofline

from support.physics import H100_BANDWIDTH, H100_BF16_FLOPS, LLAMA_8B_ON_H100

H100 = H100_BANDWIDTH  # bytes/s
H100_BF16 = H100_BF16_FLOPS  # FLOP/s
#: Llama-3.1-8B at bf16 described by its parameter count: every weight read per step.
DENSE_8B = LLAMA_8B_ON_H100
ITERATION_BOUNDS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, math.inf)


def signals(**changes: Any) -> Signals:
    base: dict[str, Any] = dict(
        itl_mean=0.010,
        running_mean=1.0,
        kv_usage_mean=0.0,
        kv_pool_tokens=400_000,
    )
    return Signals(model_name="m", at=0.0, span_seconds=60.0, snapshots=13, **{**base, **changes})


def iteration(per_bucket: dict[float, float], total: float) -> Histogram:
    """A window's ``iteration_tokens`` delta: step counts per bucket bound, and their sum."""
    counts = [per_bucket.get(b, 0.0) for b in ITERATION_BOUNDS]
    cumulative = tuple(sum(counts[: i + 1]) for i in range(len(counts)))
    return Histogram(ITERATION_BOUNDS, cumulative, cumulative[-1], total)


def roof(s: Signals, hw: Roofline = DENSE_8B) -> StepRoofline:
    r = step_roofline(s, hw)
    assert r is not None
    return r


class TestDense:
    def test_single_stream_reads_the_weights_once(self) -> None:
        """One stream, nothing in the cache: the floor is 16.06 GB over 3.35 TB/s."""
        r = roof(signals(itl_mean=0.0050))
        assert r.floor_seconds == pytest.approx(16.06e9 / H100)
        assert r.ratio == pytest.approx(16.06e9 / H100 / 0.0050)
        assert (r.bound_by, r.dominant) == ("memory", "weights")
        assert r.kv_bytes == 0.0 and r.left_out == ()

    def test_kv_of_every_running_sequence_is_read(self) -> None:
        """150 streams holding 160,000 tokens (40 % of a 400,000-token pool) read
        160,000 x 131,072 bytes of KV each step, more than the weights."""
        r = roof(signals(running_mean=150.0, kv_usage_mean=0.4, itl_mean=0.013))
        kv = 160_000 * 131072
        assert r.kv_bytes == pytest.approx(kv)
        assert r.floor_seconds == pytest.approx((16.06e9 + kv) / H100)
        assert r.dominant == "kv"
        assert r.kv_read_share == pytest.approx(kv / (kv + 16.06e9))

    def test_busy_scrapes_stand_for_the_steps(self) -> None:
        """KV usage and running requests are taken from the scrapes that found work."""
        r = roof(signals(kv_usage_mean=0.1, kv_usage_busy_mean=0.4, running_busy_mean=150.0))
        assert r.kv_bytes == pytest.approx(160_000 * 131072)
        assert r.sequences == 150.0

    def test_large_batches_turn_compute_bound(self) -> None:
        """2 x 8.03e9 FLOPs per token: 8,192 tokens a step need 133 ms of an H100."""
        r = roof(
            signals(
                itl_mean=0.2,
                running_mean=8.0,
                iteration_tokens=iteration({8192.0: 50}, 8192 * 50),
                iteration_tokens_mean=8192.0,
                iteration_steps=50.0,
            )
        )
        assert r.bound_by == "compute" and r.dominant == "compute"
        assert r.flops == pytest.approx(2 * 8.03e9 * 8192)
        assert r.floor_seconds == pytest.approx(2 * 8.03e9 * 8192 / H100_BF16, rel=1e-3)
        assert r.batch_tokens_source == ITERATION_TOKENS

    def test_attention_flops_follow_the_context(self) -> None:
        """With attention known, each token also spends its FLOPs per earlier token."""
        hw = dataclasses.replace(DENSE_8B, attention_flops_per_context_token=4 * 32 * 4096)
        r = roof(signals(running_mean=100.0, kv_usage_mean=0.25), hw)
        # 100 sequences of 1,000 tokens, one new token each (running requests: T = 100)
        assert r.flops == pytest.approx(2 * 8.03e9 * 100 + 4 * 32 * 4096 * 1000 * 100)
        assert r.batch_tokens_source == RUNNING

    def test_a_few_long_steps_cost_more_than_one_mean_step(self) -> None:
        """15 decode steps of ~150 tokens and one prefill step of ~1,150: a step of the
        mean size (212 tokens) is memory-bound, but the prefill step is compute-bound;
        the floor weighs each step (the max is convex), never the mean step."""
        h = iteration({256.0: 15, 2048.0: 1}, 15 * 150 + 1150)
        s = signals(
            itl_mean=0.008,
            running_mean=150.0,
            iteration_tokens=h,
            iteration_tokens_mean=(15 * 150 + 1150) / 16,
            iteration_steps=16.0,
        )
        r = roof(s)  # the H100's ridge: 16.06 GB / 3.35 TB/s x 989 TFLOPS / 16 GFLOP = 295
        memory = 16.06e9 / H100
        mean_step = max(memory, 2 * 8.03e9 * (15 * 150 + 1150) / 16 / H100_BF16)
        assert r.floor_seconds > mean_step * 1.1
        # the exact mix of 15 x 150 and 1 x 1150 tokens, within the buckets' resolution
        exact = (15 * memory + 2 * 8.03e9 * 1150 / H100_BF16) / 16
        assert r.floor_seconds == pytest.approx(exact, rel=0.05)


class TestParallelism:
    def test_tensor_parallel_splits_weights_and_kv_heads(self) -> None:
        """Llama-3.1-70B over 4 GPUs: each reads a quarter of the weights and of the KV
        (8 KV heads, two per GPU)."""
        hw = Roofline(
            gpu="4x H100",
            memory_bandwidth_gb_s=3350,
            weight_bytes=139.0e9,
            tensor_parallel_size=4,
            kv_bytes_per_token=327680,
            kv_split=8,
        )
        r = roof(signals(kv_usage_mean=0.5, kv_pool_tokens=100_000), hw)
        assert r.weight_bytes == pytest.approx(139.0e9 / 4)
        assert r.kv_bytes == pytest.approx(50_000 * 327680 / 4)

    def test_kv_heads_replicate_below_one_per_gpu(self) -> None:
        """8 KV heads over 16 GPUs: each GPU still holds (and reads) one whole head."""
        hw = Roofline(
            gpu="16x",
            memory_bandwidth_gb_s=3350,
            weight_bytes=139.0e9,
            tensor_parallel_size=16,
            kv_bytes_per_token=327680,
            kv_split=8,
        )
        r = roof(signals(kv_usage_mean=0.5, kv_pool_tokens=100_000), hw)
        assert r.kv_bytes == pytest.approx(50_000 * 327680 / 8)

    def test_a_latent_cache_is_read_whole_on_every_gpu(self) -> None:
        """DeepSeek's MLA cache is one latent per token that every GPU keeps whole."""
        hw = Roofline(
            gpu="8x H200",
            memory_bandwidth_gb_s=4800,
            weight_bytes=17.2e9,
            tensor_parallel_size=8,
            kv_bytes_per_token=70272,
            kv_split=1,
        )
        r = roof(signals(kv_usage_mean=0.5, kv_pool_tokens=100_000), hw)
        assert r.kv_bytes == pytest.approx(50_000 * 70272)

    def test_data_parallel_engines_are_each_one_server(self) -> None:
        """Two engines: the summed pool and running requests are halved per engine."""
        one = roof(signals(running_mean=75.0, kv_usage_mean=0.4, kv_pool_tokens=400_000))
        two = roof(
            signals(running_mean=150.0, kv_usage_mean=0.4, kv_pool_tokens=800_000, engines=2)
        )
        assert two.floor_seconds == pytest.approx(one.floor_seconds)
        assert two.sequences == 75.0


class TestMixtureOfExperts:
    #: DeepSeek-V3's routed experts (256, 8 per token) and a slice of shared weights.
    DEEPSEEK = Roofline(
        gpu="8x H200",
        memory_bandwidth_gb_s=4800,
        weight_bytes=17.2e9,
        routed_expert_bytes=653.9e9,
        num_experts=256,
        experts_per_token=8,
        tensor_parallel_size=8,
    )

    @pytest.mark.parametrize(
        ("tokens", "share"),
        [(1, 0.03), (8, 0.22), (16, 0.40), (32, 0.64), (64, 0.87), (128, 0.98)],
    )
    def test_distinct_experts_touched_grow_with_the_batch(self, tokens: int, share: float) -> None:
        """Uniform routing, E (1 - (1 - k/E)^T) of DeepSeek-V3's 256 experts."""
        r = roof(signals(running_mean=float(tokens)), self.DEEPSEEK)
        assert r.experts_touched_share == pytest.approx(share, abs=0.006)
        assert r.weight_bytes == pytest.approx((17.2e9 + 653.9e9 * r.experts_touched_share) / 8)

    def test_one_token_reads_its_active_experts(self) -> None:
        """At batch 1 a token reads exactly k of E experts: the 'active parameters'."""
        r = roof(signals(running_mean=1.0), self.DEEPSEEK)
        assert r.weight_bytes * 8 == pytest.approx(17.2e9 + 653.9e9 * 8 / 256)


#: 16 streams drafting k = 4 tokens per step, half of them accepted (tau = 3).
DRAFTED: dict[str, Any] = dict(
    itl_mean=0.012,
    running_mean=16.0,
    spec_drafts=1000.0,
    spec_draft_tokens=4000.0,
    spec_accepted_tokens=2000.0,
    decode_tokens_per_step=3.0,
    iteration_tokens=iteration({64.0: 100}, 100 * 48.0),
    iteration_tokens_mean=48.0,
    iteration_steps=100.0,
)


class TestSpeculativeDecoding:
    def test_draft_forwards_add_their_reads(self) -> None:
        """k = 4 draft forwards of a 1.24B bf16 draft, one after the other, each reading
        its 2.48 GB; the target verifies the emitted tokens plus the rejected drafts."""
        hw = dataclasses.replace(
            DENSE_8B,
            draft_weight_bytes=2.48e9,
            draft_parameters=1.24e9,
            draft_kv_bytes_per_token=32768,
        )
        r = roof(signals(**DRAFTED), hw)
        assert r.draft_bytes == pytest.approx(4 * 2.48e9)  # nothing in the cache yet
        # 48 tokens emitted a step, plus (4000 - 2000) rejected drafts over 100 steps
        assert r.batch_tokens == pytest.approx(48 + 20)
        assert r.floor_seconds == pytest.approx((16.06e9 + 4 * 2.48e9) / H100)
        assert r.tokens_per_step == 3.0

    def test_a_draft_models_own_kv_is_read_by_each_forward(self) -> None:
        """Each of the k forwards also reads the draft's KV of every sequence."""
        hw = dataclasses.replace(
            DENSE_8B,
            draft_weight_bytes=2.48e9,
            draft_parameters=1.24e9,
            draft_kv_bytes_per_token=32768,
        )
        r = roof(signals(**{**DRAFTED, "kv_usage_mean": 0.1}), hw)
        assert r.draft_bytes == pytest.approx(4 * (2.48e9 + 40_000 * 32768))
        assert r.left_out == ()

    def test_unknown_draft_kv_is_named(self) -> None:
        hw = dataclasses.replace(DENSE_8B, draft_weight_bytes=2.48e9, draft_parameters=1.24e9)
        r = roof(signals(**DRAFTED), hw)
        assert r.left_out == ("draft KV reads: model.draft_kv_bytes_per_token unknown",)

    def test_ngram_drafts_read_nothing(self) -> None:
        hw = dataclasses.replace(DENSE_8B, draft_weight_bytes=0.0, draft_parameters=0.0)
        r = roof(signals(**DRAFTED), hw)
        assert r.draft_bytes == 0.0 and r.left_out == ()

    def test_unknown_draft_is_named_not_zero(self) -> None:
        r = roof(signals(**DRAFTED))
        assert r.draft_bytes is None
        assert any("model.draft_parameters_billion" in item for item in r.left_out)

    def test_running_requests_compute_one_plus_k_tokens(self) -> None:
        """Without the iteration histogram, each running request computes 1 + k tokens."""
        changes = {**DRAFTED, "iteration_tokens": None, "iteration_tokens_mean": None}
        r = roof(signals(**changes))
        assert r.batch_tokens == pytest.approx(16 * (1 + 4))
        assert r.batch_tokens_source == RUNNING


class TestUnknownTerms:
    def test_each_unknown_term_is_named(self) -> None:
        """Without KV bytes, compute or the pool, those terms are left out and said."""
        hw = Roofline(gpu="x", memory_bandwidth_gb_s=1000, weight_bytes=1e9)
        r = roof(signals(kv_pool_tokens=None), hw)
        assert r.kv_bytes is None and r.flops is None
        assert r.floor_seconds == pytest.approx(1e9 / 1e12)
        assert "KV reads: model.kv_bytes_per_token unknown" in r.left_out
        assert "compute: hardware.compute_tflops unknown" in r.left_out
        assert evidence(r)["decode_roofline_left_out"] == "; ".join(r.left_out)

    def test_pool_unknown_is_named(self) -> None:
        r = roof(signals(kv_pool_tokens=None))
        assert any("cache_config_info" in item for item in r.left_out)

    def test_no_itl_no_roofline(self) -> None:
        assert step_roofline(signals(itl_mean=None), DENSE_8B) is None

    def test_achievable_fraction_lengthens_the_floor(self) -> None:
        hw = dataclasses.replace(DENSE_8B, achievable_fraction=0.8)
        assert roof(signals(), hw).floor_seconds == pytest.approx(16.06e9 / (0.8 * H100))


class TestHelpers:
    def test_weights_only_matches_the_single_stream_ceiling(self) -> None:
        """A ceiling alone (2x TP, 80 % achievable folded in) gives floor = 1 / ceiling."""
        c = Ceiling("2x H100", 3350, 16.06e9, 2 * 0.8 * 3350e9 / 16.06e9)
        r = roof(signals(), weights_only(c))
        assert r.floor_seconds == pytest.approx(1 / c.tokens_per_second)

    def test_evidence_keys(self) -> None:
        ev = evidence(roof(signals(running_mean=150.0, kv_usage_mean=0.4)))
        for key in (
            "decode_roofline_ratio",
            "decode_step_seconds",
            "decode_step_floor_seconds",
            "decode_bound_by",
            "decode_kv_read_share",
            "decode_tokens_per_step",
            "decode_step_weight_bytes",
            "decode_step_kv_bytes",
        ):
            assert ev[key] is not None, key

    def test_terms_and_settings_follow_the_dominant_term(self) -> None:
        r = roof(signals(running_mean=150.0, kv_usage_mean=0.4))
        assert terms_by_weight(r) == ("kv", "weights")
        assert suspect_settings(r)[0] == "model.kv_bytes_per_token"
