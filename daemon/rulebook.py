"""Settings -> Rulebook: resolve the GPU name, read config.json, load the remediation texts.

This is the one place that turns user settings into the core's inputs; it reads files,
so it runs once at start-up (in the shell), and the core only ever sees the result.
"""

from __future__ import annotations

import functools

from daemon.diagnose import Ceiling, Rulebook
from daemon.errors import ConfigError
from daemon.evaluate import Evaluator
from daemon.gpus import find_gpu
from daemon.hardware import decode_ceiling_tokens_per_s
from daemon.model import CAUSES, Cause
from daemon.rules import read_bundled
from daemon.settings import Settings
from daemon.sizing import (
    ModelSize,
    model_size_from_config,
    model_size_from_parameters,
    read_config_json,
)


@functools.cache
def load_remediation() -> dict[Cause, tuple[str, ...]]:
    """The remediation texts; cached, like the GPU table (``gpus.default_table``), because
    they are immutable package data and every target's rulebook reads them: a daemon
    with 250 targets spent seconds of start-up re-parsing this YAML."""
    data = read_bundled("remediation.yaml")
    if not isinstance(data, dict):
        raise ConfigError("rules/remediation.yaml: expected a mapping of cause to a list")
    out: dict[Cause, tuple[str, ...]] = {}
    for cause in CAUSES:
        items = data.get(cause)
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ConfigError(f"rules/remediation.yaml: {cause}: expected a list of strings")
        out[cause] = tuple(items)
    return out


def model_size(settings: Settings) -> ModelSize | None:
    m = settings.model
    if m.config_json is not None:
        return model_size_from_config(
            read_config_json(m.config_json), dtype=None, kv_cache_dtype=m.kv_cache_dtype
        )
    if m.parameters_billion is not None:
        return model_size_from_parameters(m.parameters_billion, m.dtype)
    return None


def ceiling(settings: Settings) -> Ceiling | None:
    """The decode ceiling, when both the hardware and the model size are known."""
    hw = settings.hardware
    name: str | None = None
    bandwidth = hw.memory_bandwidth_gb_s
    if hw.gpu is not None:
        gpu = find_gpu(hw.gpu)
        name = gpu.name
        bandwidth = bandwidth or gpu.memory_bandwidth_gb_s
    size = model_size(settings)
    if bandwidth is None or size is None:
        return None
    if hw.tensor_parallel_size > 1:
        name = f"{hw.tensor_parallel_size}x {name or f'{bandwidth:g} GB/s'}"
    return Ceiling(
        gpu=name or f"{bandwidth:g} GB/s",
        memory_bandwidth_gb_s=bandwidth,
        weight_bytes_per_token=size.weight_bytes_per_token,
        tokens_per_second=decode_ceiling_tokens_per_s(
            bandwidth,
            size.weight_bytes_per_token,
            tensor_parallel_size=hw.tensor_parallel_size,
            achievable_fraction=hw.achievable_fraction,
        ),
    )


def build_rulebook(settings: Settings) -> Rulebook:
    return Rulebook(
        slo=settings.slo,
        thresholds=settings.thresholds,
        remediation=load_remediation(),
        ceiling=ceiling(settings),
    )


def build_evaluator(settings: Settings, rulebook: Rulebook | None = None) -> Evaluator:
    """A fresh core for one target, configured from the settings (and ``rulebook``, when
    the caller already resolved one, as the demo does with each scenario's hardware)."""
    return Evaluator(
        rulebook or build_rulebook(settings),
        window_seconds=settings.window_seconds,
        open_after=settings.incident.open_after,
        resolve_after=settings.incident.resolve_after,
    )
