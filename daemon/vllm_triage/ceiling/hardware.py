"""The hardware ceiling: how fast one stream can decode on a device, by arithmetic.

Decode reads every weight once per generated token, so a single stream cannot run faster
than ``memory bandwidth / bytes read per token`` (``docs/physics.md``): the bandwidth
comes from the GPU table (``gpus``), the bytes from the model's size (``sizing``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vllm_triage.ceiling.gpus import GPU
from vllm_triage.ceiling.sizing import ModelSize
from vllm_triage.core.roofline.kvpool import GIB

#: vLLM's default ``gpu_memory_utilization``: the share of a card it lets itself use.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
#: Tensor-parallel sizes tried for the least that fits: vLLM splits the attention heads
#: evenly over the GPUs, and models' head counts divide by powers of two.
_TP_SIZES = tuple(2**k for k in range(8))


@dataclass(frozen=True, slots=True)
class Fit:
    """Whether a model's weights fit on a card, split ``tensor_parallel_size`` ways.

    The card counts at its most generous (its "GB" read as GiB, ``rules/gpus.yaml``'s
    header) times vLLM's default ``gpu_memory_utilization``: "does not fit" is said only
    when the weights alone are more than vLLM would let itself use, before any KV cache.
    """

    fits: bool
    weight_bytes_per_gpu: float
    usable_bytes: float
    #: The least power-of-two tensor-parallel size whose share fits (None: over 128).
    min_tensor_parallel_size: int | None

    def text(self) -> str:
        least = self.min_tensor_parallel_size
        need = (
            f"at least {least} such cards (--tensor-parallel-size {least})"
            if least is not None
            else "more than 128 such cards"
        )
        return (
            f"does not fit: {self.weight_bytes_per_gpu / 1e9:.1f} GB of weights per card, "
            f"where vLLM lets itself use {self.usable_bytes / 1e9:.1f} GB "
            f"({DEFAULT_GPU_MEMORY_UTILIZATION:.0%} of the card); it needs {need}, and room "
            "beyond the weights for the KV cache"
        )


def fit(size: ModelSize, gpu: GPU, tensor_parallel_size: int = 1) -> Fit | None:
    """Whether ``size``'s weights fit on ``gpu`` (None: the table gives no memory)."""
    if gpu.memory_gb is None:
        return None
    usable = gpu.memory_gb * GIB * DEFAULT_GPU_MEMORY_UTILIZATION
    weights = size.resident_bytes
    least = next((n for n in _TP_SIZES if weights / n <= usable), None)
    per_gpu = weights / tensor_parallel_size
    return Fit(per_gpu <= usable, per_gpu, usable, least)


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
        fitted = fit(size, gpu, tensor_parallel_size)
        ceiling = decode_ceiling_tokens_per_s(
            gpu.memory_bandwidth_gb_s,
            size.weight_bytes_per_token,
            tensor_parallel_size=tensor_parallel_size,
            achievable_fraction=achievable_fraction,
        )
        row: dict[str, Any] = {
            "gpu": gpu.name,
            "memory_bandwidth_gb_s": gpu.memory_bandwidth_gb_s,
            # No rate for a model the card cannot hold: it would not run at all.
            "decode_ceiling_tokens_per_s": (
                None if fitted is not None and not fitted.fits else round(ceiling, 2)
            ),
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
        if fitted is not None:
            row["fits"] = fitted.fits
            row["min_tensor_parallel_size"] = fitted.min_tensor_parallel_size
            if not fitted.fits:
                row["does_not_fit"] = fitted.text()
        rows.append(row)
    return rows
