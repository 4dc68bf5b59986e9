"""Every roofline fact with its source (``docs/physics.md``, "Where each fact comes
from"): what the parser reads from ``vllm:cache_config_info`` and vLLM's estimator
counters, the order KV bytes per token is taken in, bytes and FLOPs per step from the
counters with the arithmetic cross-checking them, and ``decode_facts_source``."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from vllm_triage.core.model import CacheConfig, Histogram, Signals
from vllm_triage.core.roofline import sources
from vllm_triage.core.roofline.step import StepRoofline, evidence, step_roofline
from vllm_triage.core.rulebook import Roofline, Source

from support.parsing import parse_snapshot
from support.paths import RECORDINGS, VLLM_CAPTURES
from support.physics import (
    H100_ALONE,
    H100_BANDWIDTH,
    LLAMA_8B_ON_H100,
    LLAMA_8B_WEIGHT_BYTES,
)

RECORDED = sorted((RECORDINGS / "decode").glob("*.prom"))[0]
KVWARDEN = VLLM_CAPTURES / "kvwarden-vllm-0.19.1-v1.txt"
H100 = H100_BANDWIDTH

#: Llama-3.1-8B on an H100 as the model table gives it: the weights a token reads (15.0 GB,
#: not the input table) and multiplies through, its KV figure the model's own 16-bit one.
ROW = dataclasses.replace(
    LLAMA_8B_ON_H100,
    weight_bytes=15.0e9,
    active_parameters=7.5e9,
    kv_in_model_dtype=True,
    memory_gb=80,
    resident_weight_bytes=LLAMA_8B_WEIGHT_BYTES,
    sources={
        "bandwidth": Source("gpu table", "NVIDIA H100 SXM"),
        "weights": Source("model table", "meta-llama/Llama-3.1-8B-Instruct"),
        "kv_bytes_per_token": Source("model table", "meta-llama/Llama-3.1-8B-Instruct"),
        "active_parameters": Source("model table", "meta-llama/Llama-3.1-8B-Instruct"),
        "tensor_parallel": Source("settings", "1 GPU"),
    },
)
#: vLLM sized the pool itself: 0.9 of the card, 26,000 blocks of 16 tokens.
PROFILED = CacheConfig(
    num_gpu_blocks=26_000, block_size=16, kv_cache_size_tokens=416_000, gpu_memory_utilization=0.9
)


def signals(**changes: Any) -> Signals:
    """150 streams holding 40 % of a 416,000-token pool; a 20 ms step."""
    base: dict[str, Any] = dict(
        model_name="m",
        at=100.0,
        span_seconds=60.0,
        snapshots=13,
        itl_mean=0.020,
        running_mean=150.0,
        kv_usage_mean=0.4,
        kv_pool_tokens=416_000,
        kv_cache=PROFILED,
    )
    return Signals(**{**base, **changes})


def roof(s: Signals, hw: Roofline) -> StepRoofline:
    r = step_roofline(s, hw)
    assert r is not None
    return r


class TestParse:
    def test_cache_config_labels_reach_the_pool(self) -> None:
        """A real vLLM 0.32 capture fixed its pool with --kv-cache-memory-bytes: 256 MiB
        over 65,536 tokens, 4,096 bytes per token per GPU, and the window carries it."""
        snap = parse_snapshot(RECORDED.read_text(encoding="utf-8"), at=1.0)
        assert snap.kv_pool is not None and snap.kv_pool.config is not None
        cfg = snap.kv_pool.config
        assert (cfg.kv_cache_memory_bytes, cfg.kv_cache_size_tokens) == (268435456, 65536)
        assert (cfg.gpu_memory_utilization, cfg.cache_dtype) == (0.92, "auto")
        figure = sources.resolve_kv_bytes_per_token(signals(kv_cache=cfg), ROW)
        assert figure is not None and figure.per_gpu == 4096
        assert str(figure.source) == "metrics (kv_cache_memory_bytes)"

    def test_none_is_unset(self) -> None:
        """vLLM 0.19.1 sized its pool itself: kv_cache_memory_bytes is the string None."""
        snap = parse_snapshot(KVWARDEN.read_text(encoding="utf-8"), at=1.0)
        assert snap.kv_pool is not None and snap.kv_pool.config is not None
        assert snap.kv_pool.config.kv_cache_memory_bytes is None
        assert snap.kv_pool.config.gpu_memory_utilization == 0.4

    def test_estimator_counters_are_read(self) -> None:
        """vLLM 0.19.1 exports its estimator's counters (at 0 in that capture)."""
        snap = parse_snapshot(KVWARDEN.read_text(encoding="utf-8"), at=1.0)
        [series] = snap.models.values()
        assert (series.estimated_read_bytes, series.estimated_flops) == (0.0, 0.0)

    def test_data_parallel_engines_give_one_engines_labels(self) -> None:
        """Each engine exports its own pool; the first engine's labels are kept (blocks
        are summed as before)."""
        text = RECORDED.read_text(encoding="utf-8")
        line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info"))
        other = line.replace('engine="0"', 'engine="1"').replace(
            'kv_cache_memory_bytes="268435456"', 'kv_cache_memory_bytes="1"'
        )
        snap = parse_snapshot(text + other + "\n", at=1.0)
        assert snap.kv_pool is not None and snap.kv_pool.config is not None
        assert snap.kv_pool.num_gpu_blocks == 1024
        assert snap.kv_pool.config.kv_cache_memory_bytes == 268435456


class TestKVBytesPerToken:
    """Tried in order: the settings or config.json; kv_cache_memory_bytes; the model row;
    the pool estimate. A 16-bit figure of the model's own follows vLLM's cache dtype."""

    FIXED = dataclasses.replace(PROFILED, kv_cache_memory_bytes=416_000 * 65536)

    def test_settings_outrank_the_metrics(self) -> None:
        hw = dataclasses.replace(
            ROW,
            kv_in_model_dtype=False,
            sources={**ROW.sources, "kv_bytes_per_token": Source("settings")},
        )
        figure = sources.resolve_kv_bytes_per_token(signals(kv_cache=self.FIXED), hw)
        assert figure is not None and figure.per_gpu == 131072  # one GPU: not split
        assert figure.source.kind == "settings"

    def test_the_metrics_outrank_the_model_table(self) -> None:
        figure = sources.resolve_kv_bytes_per_token(signals(kv_cache=self.FIXED), ROW)
        assert figure is not None and (figure.per_gpu, figure.source.kind) == (65536, "metrics")

    def test_the_model_table_outranks_the_estimate(self) -> None:
        figure = sources.resolve_kv_bytes_per_token(signals(), ROW)
        assert figure is not None and figure.source.kind == "model table"
        assert figure.per_gpu == 131072

    @pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
    def test_an_fp8_cache_halves_the_models_figure(self, dtype: str) -> None:
        cfg = dataclasses.replace(PROFILED, cache_dtype=dtype)
        figure = sources.resolve_kv_bytes_per_token(signals(kv_cache=cfg), ROW)
        assert figure is not None and figure.bytes == 65536
        assert f"KV cache {dtype}" in str(figure.source)

    def test_an_fp8_cache_leaves_a_figure_the_user_gave(self) -> None:
        hw = dataclasses.replace(ROW, kv_in_model_dtype=False)
        cfg = dataclasses.replace(PROFILED, cache_dtype="fp8")
        figure = sources.resolve_kv_bytes_per_token(signals(kv_cache=cfg), hw)
        assert figure is not None and figure.bytes == 131072

    def test_the_estimate_last(self) -> None:
        """No figure anywhere: (0.99 x 80 GiB x 0.9 - 16.06 GB - 3.09 GB) / 416,000."""
        hw = dataclasses.replace(ROW, kv_bytes_per_token=None)
        figure = sources.resolve_kv_bytes_per_token(signals(), hw)
        assert figure is not None and figure.source.kind == "estimate"
        total = 0.99 * 80 * 2**30
        expected = (total * 0.9 - 16.06e9 - (0.5 * 2**30 + 0.03 * total)) / 416_000
        assert figure.per_gpu == pytest.approx(expected)
        assert 100_000 < figure.per_gpu < 140_000  # the model's 131,072 is near

    def test_nothing_to_estimate_from(self) -> None:
        hw = dataclasses.replace(ROW, kv_bytes_per_token=None, memory_gb=None)
        assert sources.resolve_kv_bytes_per_token(signals(), hw) is None
        r = roof(signals(), hw)
        assert r.kv_bytes is None and r.lower_bound
        assert r.gaps[0] == sources.SETTLE_KV


#: 3,000 steps of 150 tokens in the window.
STEPS: dict[str, Any] = dict(
    iteration_steps=3000.0,
    iteration_tokens=Histogram(
        (1.0, 256.0, float("inf")), (0.0, 3000.0, 3000.0), 3000.0, 450_000.0
    ),
    iteration_tokens_mean=150.0,
)


class TestVllmEstimate:
    """Bytes and FLOPs per step from vLLM's counters over the step count."""

    def test_per_step(self) -> None:
        s = signals(estimated_read_bytes=3000 * 40e9, estimated_flops=3000 * 2.4e12, **STEPS)
        found = sources.vllm_estimate(s)
        assert found == sources.VllmEstimate(40e9, 2.4e12)

    def test_counters_that_did_not_move_are_absent(self) -> None:
        assert sources.vllm_estimate(signals(estimated_read_bytes=0.0, **STEPS)) is None
        assert sources.vllm_estimate(signals(estimated_read_bytes=1e9)) is None  # no steps

    def test_they_size_the_step_when_the_facts_rank_below_them(self) -> None:
        """Weights from the model table: vLLM's 40 GB a step is the floor's memory term,
        and the arithmetic's 15 + 21.8 GB cross-checks within the tolerance."""
        s = signals(estimated_read_bytes=3000 * 40e9, estimated_flops=3000 * 2.4e12, **STEPS)
        r = roof(s, ROW)
        assert r.bytes_from_vllm and r.vllm_bytes == pytest.approx(40e9)
        assert r.floor_seconds == pytest.approx(40e9 / H100, rel=1e-6)
        assert r.disagreement is None
        assert "step_bytes=metrics (vllm:estimated_read_bytes_per_gpu_total)" in r.facts_source
        ev = evidence(r)
        assert ev["decode_step_bytes_vllm"] == pytest.approx(40e9)
        assert ev["decode_step_flops_vllm"] == pytest.approx(2.4e12)

    def test_they_fill_an_unknown_model(self) -> None:
        """Nothing known of the model: vLLM's bytes are the floor, no term is missing."""
        hw = H100_ALONE
        s = signals(estimated_read_bytes=3000 * 40e9, kv_cache=None, **STEPS)
        r = roof(s, hw)
        assert r.floor_seconds == pytest.approx(40e9 / H100, rel=1e-6)
        assert not r.lower_bound and r.weight_bytes is None

    def test_the_users_facts_win_and_a_disagreement_is_said(self) -> None:
        """Facts the user gave stand; vLLM's estimate twice theirs is said, not used."""
        given = {k: Source("settings") for k in ("weights", "kv_bytes_per_token")}
        hw = dataclasses.replace(ROW, sources={**ROW.sources, **given}, kv_in_model_dtype=False)
        s = signals(estimated_read_bytes=3000 * 80e9, **STEPS)
        r = roof(s, hw)
        assert not r.bytes_from_vllm
        assert r.disagreement is not None and r.disagreement.startswith("bytes per step")
        assert f"tolerance {sources.TOLERANCE:.0%}" in r.disagreement
        assert evidence(r)["decode_vllm_estimate_disagrees"] == r.disagreement


class TestFactsSource:
    def test_every_fact_named(self) -> None:
        r = roof(signals(), ROW)
        parts = dict(p.split("=", 1) for p in r.facts_source.split("; "))
        assert parts == {
            "bandwidth": "gpu table (NVIDIA H100 SXM)",
            "compute": "settings",
            "weights": "model table (meta-llama/Llama-3.1-8B-Instruct)",
            "kv_bytes_per_token": "model table (meta-llama/Llama-3.1-8B-Instruct)",
            "pool_tokens": "metrics (kv_cache_size_tokens)",
            "tensor_parallel": "settings (1 GPU)",
            "active_parameters": "model table (meta-llama/Llama-3.1-8B-Instruct)",
        }
        assert evidence(r)["decode_facts_source"] == r.facts_source
        assert evidence(r)["decode_kv_bytes_per_token"] == 131072
