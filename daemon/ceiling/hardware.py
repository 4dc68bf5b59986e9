"""The hardware ceiling: how fast one stream can decode on a device, by arithmetic.

Decode reads every weight once per generated token, so a single stream cannot run faster
than ``memory bandwidth / bytes read per token`` (``docs/physics.md``): the bandwidth
comes from the GPU table (``gpus``), the bytes from the model's size (``sizing``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_triage.ceiling.gpus import GPU
from vllm_triage.ceiling.sizing import ModelSize


def decode_ceiling_tokens_per_s(
    memory_bandwidth_gb_s: float,
    weight_bytes_per_token: float,
    *,
    tensor_parallel_size: int = 1,
    achievable_fraction: float = 1.0,
) -> float:
    """Single-stream decode ceiling: bytes per second available / bytes read per token.

    Tensor parallelism over N GPUs splits every weight matrix, so each GPU reads 1/N of
    the weights per token and the ceiling scales with N (all-reduce communication is left
    out). Published bandwidth is a peak that real kernels do not reach; pass
    ``achievable_fraction`` (e.g. 0.8) to discount it, or keep 1.0 to compare against the
    published figure as the seed does. KV cache reads are not included (they grow with
    context; see ``kv_bytes_per_token``).
    """
    if not (memory_bandwidth_gb_s > 0 and weight_bytes_per_token > 0):
        raise ValueError("bandwidth and weight bytes must be positive")
    if tensor_parallel_size < 1:
        raise ValueError("tensor_parallel_size must be at least 1")
    if not 0 < achievable_fraction <= 1:
        raise ValueError("achievable_fraction must be in (0, 1]")
    bytes_per_s = memory_bandwidth_gb_s * 1e9 * tensor_parallel_size * achievable_fraction
    return bytes_per_s / weight_bytes_per_token


def ceiling_rows(
    size: ModelSize,
    gpus: Iterable[GPU],
    tensor_parallel_size: int = 1,
    achievable_fraction: float = 1.0,
) -> list[dict[str, Any]]:
    """One JSON-ready row per GPU: the ceiling and the figures it was computed from."""
    rows: list[dict[str, Any]] = []
    for gpu in gpus:
        ceiling = decode_ceiling_tokens_per_s(
            gpu.memory_bandwidth_gb_s,
            size.weight_bytes_per_token,
            tensor_parallel_size=tensor_parallel_size,
            achievable_fraction=achievable_fraction,
        )
        row: dict[str, Any] = {
            "gpu": gpu.name,
            "memory_bandwidth_gb_s": gpu.memory_bandwidth_gb_s,
            "decode_ceiling_tokens_per_s": round(ceiling, 2),
            "weight_bytes_per_token": size.weight_bytes_per_token,
            "parameters_billion": round(size.parameters / 1e9, 3),
            "dtype": size.dtype,
            "source": gpu.source,
            "tensor_parallel_size": tensor_parallel_size,
            "achievable_fraction": achievable_fraction,
            "notes": list(size.notes),
        }
        if size.kv_bytes_per_token is not None:
            row["kv_bytes_per_token"] = size.kv_bytes_per_token
        rows.append(row)
    return rows
