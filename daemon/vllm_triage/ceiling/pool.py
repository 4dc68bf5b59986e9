"""KV bytes per token per GPU, from what vLLM says of its KV cache pool.

The arithmetic is pure and the core needs it at every evaluation (the roofline's KV term
from ``vllm:cache_config_info``), so it lives in ``vllm_triage.core.roofline.kvpool``; this module
offers it beside the rest of the ceiling's sizing. See docs/physics.md, "Where each fact
comes from".
"""

from __future__ import annotations

from vllm_triage.core.model import CacheConfig
from vllm_triage.core.roofline.kvpool import (
    GIB,
    SOURCE_MEMORY_BYTES,
    SOURCE_MODEL_ROW,
    SOURCE_POOL_ESTIMATE,
    KVBytesPerToken,
    card_memory_bytes,
    estimate_from_pool,
    from_memory_bytes,
    from_model_row,
    parse_cache_config,
    pool_kv_bytes_per_token,
    reserve_bytes,
)

__all__ = [
    "GIB",
    "SOURCE_MEMORY_BYTES",
    "SOURCE_MODEL_ROW",
    "SOURCE_POOL_ESTIMATE",
    "CacheConfig",
    "KVBytesPerToken",
    "card_memory_bytes",
    "estimate_from_pool",
    "from_memory_bytes",
    "from_model_row",
    "parse_cache_config",
    "pool_kv_bytes_per_token",
    "reserve_bytes",
]
