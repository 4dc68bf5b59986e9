"""KV bytes per token per GPU, from what vLLM says of its KV cache pool (pure arithmetic:
the core resolves the roofline's KV term with it, ``vllm_triage.ceiling.pool`` offers it
to the commands).

vLLM exports its cache settings as the labels of ``vllm:cache_config_info`` (strings;
"None" when unset). They hold the pool's size in tokens (``kv_cache_size_tokens``, or
``num_gpu_blocks`` x ``block_size``) and, when the operator fixed it with
``--kv-cache-memory-bytes``, its size in bytes per GPU: then bytes over tokens *is* the KV
bytes per token per GPU. Otherwise vLLM sized the pool itself as what is left of
``gpu_memory_utilization`` x the card's memory once the weights and its profile run's peak
(activations, CUDA graphs, buffers outside PyTorch) are taken out; that can be estimated,
with a bound. A model row gives the figure too, from the architecture. No I/O here: the
caller passes the labels and the facts. See docs/physics.md, "Where each fact comes from".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_triage.core.model import CacheConfig

GIB = 2**30

SOURCE_MEMORY_BYTES = "kv_cache_memory_bytes"
SOURCE_MODEL_ROW = "model row"
SOURCE_POOL_ESTIMATE = "pool estimate"

#: KV cache dtypes (vLLM's cache_dtype) -> bytes per element over the model's 16 bits.
_KV_WIDTH: dict[str, float] = {
    "auto": 1.0,
    "bfloat16": 1.0,
    "float16": 1.0,
    "half": 1.0,
    "fp8": 0.5,
    "fp8_e4m3": 0.5,
    "fp8_e5m2": 0.5,
    "fp8_inc": 0.5,
}

#: The card memory PyTorch reports, as a share of the vendor's figure read in GiB (an H100
#: "80 GB" reports 79.2 GiB) and read in decimal GB (the lowest seen: a few percent under,
#: for cards whose "GB" is decimal and ECC takes its share).
_MEMORY_NOMINAL_OF_GIB = 0.99
_MEMORY_LOW_OF_GB = 0.97

#: What vLLM's profile run keeps out of the pool besides the weights: peak activations of
#: a max_num_batched_tokens forward pass and of the sampler over max_num_seqs requests,
#: CUDA graphs and buffers outside PyTorch (NCCL, cuBLAS workspaces). It depends on those
#: settings and the vocabulary more than on the model's size, and vLLM's API server picks
#: larger defaults on cards of 70 GiB or more other than the A100 (1,024 sequences, 8,192
#: batched tokens, against 256 and 2,048), so the reserve is a constant plus a share of the
#: card.
#: Measured: about 1.2 GB on an A100 80GB (8B model, vLLM's smaller defaults), 4.4-7.9 GiB
#: on an H100 80GB (0.6B-32B models at 1,024 sequences, 8,192 batched tokens).
_RESERVE_NOMINAL = (0.5 * GIB, 0.03)
_RESERVE_LOW = (0.5 * GIB, 0.0)
_RESERVE_HIGH = (1.0 * GIB, 0.10)


#: The most one GPU's KV pool could hold: 1 TiB (the largest card sold holds 288 GB), and
#: as many tokens (a token's keys and values take a byte at the very least). The labels
#: are a peer's strings: a number beyond these is no card's pool (a 400-digit
#: ``num_gpu_blocks`` does not fit a float, and the arithmetic would raise on it), so it
#: is unknown, and said.
MAX_POOL_BYTES = 2**40
MAX_POOL_TOKENS = 2**40

#: The integer labels read, and the bound on each (``block_size`` x ``num_gpu_blocks``,
#: the pool's tokens, is held to ``MAX_POOL_TOKENS`` too).
_BOUNDS: dict[str, int] = {
    "num_gpu_blocks": MAX_POOL_TOKENS,
    "block_size": MAX_POOL_TOKENS,
    "kv_cache_size_tokens": MAX_POOL_TOKENS,
    "kv_cache_memory_bytes": MAX_POOL_BYTES,
}


def _whole(text: str | None) -> int | None:
    """``text`` as a whole number; None when it is not one ("None", absent, "1.5", or
    more digits than Python converts)."""
    try:
        return int(str(text).strip())
    except ValueError:
        return None


def _positive_int(text: str | None, cap: int = MAX_POOL_TOKENS) -> int | None:
    value = _whole(text)
    return value if value is not None and 0 < value <= cap else None


def read_pool(labels: Mapping[str, str]) -> tuple[int, int] | None:
    """One engine's (block_size, num_gpu_blocks), when both are whole numbers a card's
    pool could hold; None otherwise (vLLM prints "None" before it has profiled the pool;
    a number beyond the bounds is ``beyond_bounds``'s to say)."""
    block = _positive_int(labels.get("block_size"))
    blocks = _positive_int(labels.get("num_gpu_blocks"))
    if block is None or blocks is None or block * blocks > MAX_POOL_TOKENS:
        return None
    return block, blocks


def beyond_bounds(labels: Mapping[str, str]) -> str | None:
    """Why a ``cache_config_info`` sample's pool is unknown although it gave numbers: the
    labels whose number no card could hold (the problem a snapshot carries), else None."""
    over = [
        name
        for name, cap in _BOUNDS.items()
        if (value := _whole(labels.get(name))) is not None and value > cap
    ]
    block = _positive_int(labels.get("block_size"))
    blocks = _positive_int(labels.get("num_gpu_blocks"))
    if not over and block is not None and blocks is not None and block * blocks > MAX_POOL_TOKENS:
        over.append("block_size x num_gpu_blocks")
    if not over:
        return None
    return (
        f"cache_config_info: {', '.join(over)} beyond what any card could hold "
        f"({MAX_POOL_TOKENS:,} tokens, {MAX_POOL_BYTES:,} bytes); the pool is unknown"
    )


def _fraction(text: str | None) -> float | None:
    try:
        value = float(str(text).strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 < value <= 1 else None


def parse_cache_config(labels: Mapping[str, str]) -> CacheConfig:
    """Read the labels of one ``vllm:cache_config_info`` sample (unknown labels ignored;
    a number beyond what a card could hold is unknown, ``beyond_bounds`` says which)."""
    block = _positive_int(labels.get("block_size"))
    blocks = _positive_int(labels.get("num_gpu_blocks"))
    if block is not None and blocks is not None and block * blocks > MAX_POOL_TOKENS:
        block = blocks = None
    return CacheConfig(
        num_gpu_blocks=blocks,
        block_size=block,
        kv_cache_size_tokens=_positive_int(labels.get("kv_cache_size_tokens")),
        gpu_memory_utilization=_fraction(labels.get("gpu_memory_utilization")),
        cache_dtype=(labels.get("cache_dtype") or "auto").strip().lower(),
        kv_cache_memory_bytes=_positive_int(
            labels.get("kv_cache_memory_bytes"), cap=MAX_POOL_BYTES
        ),
    )


@dataclass(frozen=True, slots=True)
class KVBytesPerToken:
    """KV bytes one token holds on one GPU, where the figure comes from, and its bounds
    (equal to the value for an exact figure)."""

    value: float
    source: str
    low: float
    high: float
    detail: str


def from_memory_bytes(cfg: CacheConfig) -> KVBytesPerToken | None:
    """kv_cache_memory_bytes / pool tokens, when the operator fixed the pool's bytes.

    vLLM fits whole blocks into those bytes, so the true figure lies between the bytes over
    one block more than the pool and the bytes over the pool (equal when they divide)."""
    tokens = cfg.pool_tokens
    if cfg.kv_cache_memory_bytes is None or tokens is None:
        return None
    value = cfg.kv_cache_memory_bytes / tokens
    low = cfg.kv_cache_memory_bytes / (tokens + (cfg.block_size or 0))
    if cfg.kv_cache_memory_bytes % tokens == 0:
        low = value
    return KVBytesPerToken(
        value,
        SOURCE_MEMORY_BYTES,
        low,
        value,
        f"kv_cache_memory_bytes {cfg.kv_cache_memory_bytes} / {tokens} tokens",
    )


def from_model_row(kv_bytes_16bit_per_gpu: float, cache_dtype: str) -> KVBytesPerToken | None:
    """A model row's KV bytes per token per GPU (its 16-bit figure), in vLLM's cache_dtype:
    "auto" keeps the model's 16 bits, fp8 (fp8_e4m3, fp8_e5m2) halves it. Another cache
    dtype (fp8_ds_mla, a 4-bit cache) is not known here: None."""
    width = _KV_WIDTH.get(cache_dtype.strip().lower())
    if width is None or not kv_bytes_16bit_per_gpu > 0:
        return None
    value = kv_bytes_16bit_per_gpu * width
    return KVBytesPerToken(
        value, SOURCE_MODEL_ROW, value, value, f"model row, KV cache {cache_dtype}"
    )


def card_memory_bytes(memory_gb: float) -> tuple[float, float, float]:
    """(nominal, low, high) bytes PyTorch reports for a card sold as ``memory_gb`` "GB":
    most HBM parts mean GiB, some cards decimal GB (rules/gpus.yaml's header)."""
    return (
        memory_gb * GIB * _MEMORY_NOMINAL_OF_GIB,
        memory_gb * 1e9 * _MEMORY_LOW_OF_GB,
        memory_gb * GIB,
    )


def reserve_bytes(total_bytes: float) -> tuple[float, float, float]:
    """(nominal, low, high) bytes vLLM's profile run keeps out of the pool besides the
    weights, on a card of ``total_bytes``."""

    def at(constant: float, share: float) -> float:
        return constant + share * total_bytes

    return at(*_RESERVE_NOMINAL), at(*_RESERVE_LOW), at(*_RESERVE_HIGH)


def estimate_from_pool(
    cfg: CacheConfig, *, memory_gb: float, weight_bytes_per_gpu: float
) -> KVBytesPerToken | None:
    """(card memory x gpu_memory_utilization - weights - reserve) / pool tokens.

    The bound takes the card's memory and the reserve at both ends of their ranges; the
    weights are taken as given. None without a pool size or utilization, or when even
    the nominal estimate leaves nothing for the pool (the inputs disagree with vLLM)."""
    tokens = cfg.pool_tokens
    util = cfg.gpu_memory_utilization
    if tokens is None or util is None or not (memory_gb > 0 and weight_bytes_per_gpu >= 0):
        return None
    total, total_low, total_high = card_memory_bytes(memory_gb)
    reserve, reserve_low, _ = reserve_bytes(total)
    _, _, reserve_high = reserve_bytes(total_high)
    pool = total * util - weight_bytes_per_gpu - reserve
    if pool <= 0:
        return None
    low = max(0.0, total_low * util - weight_bytes_per_gpu - reserve_high) / tokens
    high = (total_high * util - weight_bytes_per_gpu - reserve_low) / tokens
    detail = (
        f"({total / 1e9:.2f} GB of a {memory_gb:g} GB card x {util:g} - "
        f"{weight_bytes_per_gpu / 1e9:.2f} GB weights - {reserve / 1e9:.2f} GB reserve) "
        f"/ {tokens} tokens"
    )
    return KVBytesPerToken(pool / tokens, SOURCE_POOL_ESTIMATE, low, high, detail)


def pool_kv_bytes_per_token(
    cfg: CacheConfig,
    *,
    model_kv_bytes_16bit_per_gpu: float | None = None,
    memory_gb: float | None = None,
    weight_bytes_per_gpu: float | None = None,
) -> KVBytesPerToken | None:
    """The best figure available: kv_cache_memory_bytes (exact), else the model row
    (exact for the architecture), else the pool estimate; None when none applies."""
    exact = from_memory_bytes(cfg)
    if exact is not None:
        return exact
    if model_kv_bytes_16bit_per_gpu is not None:
        row = from_model_row(model_kv_bytes_16bit_per_gpu, cfg.cache_dtype)
        if row is not None:
            return row
    if memory_gb is not None and weight_bytes_per_gpu is not None:
        return estimate_from_pool(
            cfg, memory_gb=memory_gb, weight_bytes_per_gpu=weight_bytes_per_gpu
        )
    return None
