"""The GPU table: published memory bandwidth (and compute) per card, from ``rules/gpus.yaml``.

Bandwidth is the numerator of the decode ceiling (``docs/physics.md``); compute sets how
fast prefill can go (the simulator uses it) and when a decode step turns compute-bound.
Figures are published peaks; the table is data users can read and extend, not constants
in code.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vllm_triage.errors import ConfigError
from vllm_triage.rules import bundled_path, read_bundled

GPU_TABLE = "gpus.yaml"


@dataclass(frozen=True, slots=True)
class GPU:
    """One row of ``rules/gpus.yaml``: a device's published peak memory bandwidth.

    ``memory_bandwidth_gb_s`` is in decimal GB/s (1e9 bytes/s) per device, as vendors
    publish it; ``bf16_dense_tflops`` (dense, no sparsity) is for prefill estimates and the compute
    side of the decode step roofline. ``fp8_dense_tflops`` is the dense FP8 peak where one is
    published; ``memory_gb`` the memory the card is sold with, in the vendor's "GB" (binary
    for most HBM parts, decimal for some: ``rules/gpus.yaml`` says which), for estimating
    vLLM's KV pool.
    """

    name: str
    memory_bandwidth_gb_s: float
    source: str
    aliases: tuple[str, ...] = ()
    bf16_dense_tflops: float | None = None
    note: str = ""
    fp8_dense_tflops: float | None = None
    memory_gb: float | None = None


class _GPUEntry(BaseModel):
    """The YAML shape of one row; strict so that a typo'd key or a quoted number fails."""

    model_config = ConfigDict(extra="forbid", strict=True, str_strip_whitespace=True)

    name: str = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    memory_bandwidth_gb_s: float = Field(gt=0, allow_inf_nan=False)
    source: str = Field(min_length=1)
    bf16_dense_tflops: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    fp8_dense_tflops: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    memory_gb: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    note: str = ""


class _GPUTable(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    gpus: list[_GPUEntry] = Field(min_length=1)


def _describe(exc: ValidationError, data: Any) -> str:
    """Name the entry (index and, when readable, its ``name``) and key of each error."""
    parts = []
    for err in exc.errors():
        loc = list(err["loc"])
        where = ".".join(str(x) for x in loc) or "top level"
        if len(loc) >= 2 and loc[0] == "gpus" and isinstance(loc[1], int):
            where = f"gpus[{loc[1]}]"
            with contextlib.suppress(KeyError, TypeError, IndexError):
                where += f" ({data['gpus'][loc[1]]['name']!r})"
            if len(loc) > 2:
                where += ": " + ".".join(str(x) for x in loc[2:])
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _norm(name: str) -> str:
    """Lookup key: users write "H100-SXM5", "h100 sxm5" and "H100_SXM5" for one thing."""
    return re.sub(r"[\s_-]+", "", name).casefold()


def _keys(gpu: GPU) -> set[str]:
    keys = {_norm(gpu.name), *(_norm(a) for a in gpu.aliases)}
    vendor, _, rest = gpu.name.partition(" ")
    if vendor in ("NVIDIA", "AMD") and rest:
        keys.add(_norm(rest))  # "A100 80GB SXM" without the vendor word
    return keys


def _build_index(gpus: Iterable[GPU], source: str) -> dict[str, GPU]:
    """Map every lookup key to its GPU; a key shared by two GPUs is ambiguous, so refused."""
    index: dict[str, GPU] = {}
    for i, gpu in enumerate(gpus):
        for key in _keys(gpu):
            other = index.setdefault(key, gpu)
            if other is not gpu:
                raise ConfigError(
                    f"{source}: gpus[{i}] ({gpu.name!r}): name or alias {key!r} "
                    f"also names {other.name!r}"
                )
    return index


def parse_gpu_table(data: Any, *, source: str = bundled_path(GPU_TABLE)) -> tuple[GPU, ...]:
    """Validate a loaded GPU table; errors raise ``ConfigError`` naming ``source`` and entry."""
    try:
        table = _GPUTable.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc, data)}") from exc
    gpus = tuple(
        GPU(
            name=e.name,
            memory_bandwidth_gb_s=e.memory_bandwidth_gb_s,
            source=e.source,
            aliases=tuple(e.aliases),
            bf16_dense_tflops=e.bf16_dense_tflops,
            note=e.note,
            fp8_dense_tflops=e.fp8_dense_tflops,
            memory_gb=e.memory_gb,
        )
        for e in table.gpus
    )
    _build_index(gpus, source)
    return gpus


@functools.cache
def load_gpu_table() -> tuple[GPU, ...]:
    """The bundled GPU table; cached because it is immutable package data."""
    return parse_gpu_table(read_bundled(GPU_TABLE))


@functools.cache
def _gpu_index() -> dict[str, GPU]:
    return _build_index(load_gpu_table(), bundled_path(GPU_TABLE))


def find_gpu(name: str) -> GPU:
    """The table row whose name or alias matches ``name`` (case, spaces, ``-``/``_`` ignored)."""
    gpu = _gpu_index().get(_norm(name))
    if gpu is None:
        raise ConfigError(unknown_gpu(name))
    return gpu


def close_gpus(name: str, most: int = 3) -> list[str]:
    """The table's names nearest ``name`` (by its names and aliases), nearest first."""
    index = _gpu_index()
    key = _norm(name)
    # A known name that the user's starts with (``h100`` of ``h10080g``) first, longest
    # first; then close spellings.
    near = sorted((k for k in index if len(k) >= 3 and key.startswith(k)), key=len, reverse=True)
    near += difflib.get_close_matches(key, list(index), n=4 * most, cutoff=0.6)
    out: list[str] = []
    for k in near:
        if index[k].name not in out:
            out.append(index[k].name)
    return out[:most]


def unknown_gpu(name: str) -> str:
    """One short line: the name, the nearest known ones, and where the rest are."""
    near = close_gpus(name)
    if len(near) > 1:
        hint = f"; did you mean {', '.join(near[:-1])} or {near[-1]}?"
    elif near:
        hint = f"; did you mean {near[0]}?"
    else:
        hint = ""
    count = len(load_gpu_table())
    return (
        f"unknown GPU {name!r}{hint} ({count} cards in {bundled_path(GPU_TABLE)}; "
        "`vllm-triage ceiling --parameters-billion 8` lists them)"
    )
