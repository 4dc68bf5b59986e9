"""Settings -> the core's inputs: resolve the GPU name, read config.json, load remediation.

This is the one place that turns validated user settings (pydantic, ``vllm_triage.config.schema``)
into the core's plain dataclasses (``vllm_triage.core.rulebook``); it reads files, so it runs
once at start-up (in the shell), and the core only ever sees the result.
"""

from __future__ import annotations

import functools

from vllm_triage.ceiling.gpus import find_gpu
from vllm_triage.ceiling.resolve import build_ceiling, build_roofline, model_size
from vllm_triage.ceiling.sizing import ModelSize
from vllm_triage.config.schema import Settings
from vllm_triage.core.evaluate import Evaluator
from vllm_triage.core.model import CAUSES, Cause
from vllm_triage.core.parse import ParseLimits
from vllm_triage.core.rulebook import Ceiling, Roofline, Rulebook, Slo, Thresholds
from vllm_triage.errors import ConfigError
from vllm_triage.rules import read_bundled


@functools.cache
def load_remediation() -> dict[Cause, tuple[str, ...]]:
    """The remediation texts; cached, like the GPU table (``gpus.load_gpu_table``), because
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


#: The keys of ``decode_roofline`` in rules/remediation.yaml.
DECODE_TERMS = ("weights", "kv", "draft", "compute", "serving_stack", "settings")


@functools.cache
def load_decode_remediation() -> dict[str, tuple[str, ...]]:
    """The decode-bound texts by what the roofline says binds (rules/remediation.yaml,
    ``decode_roofline``); cached like ``load_remediation``."""
    data = read_bundled("remediation.yaml")
    section = data.get("decode_roofline") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise ConfigError("rules/remediation.yaml: decode_roofline: expected a mapping")
    out: dict[str, tuple[str, ...]] = {}
    for term in DECODE_TERMS:
        items = section.get(term)
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ConfigError(
                f"rules/remediation.yaml: decode_roofline.{term}: expected a list of strings"
            )
        out[term] = tuple(items)
    return out


def settings_model_size(settings: Settings) -> ModelSize | None:
    m = settings.model
    return model_size(
        parameters_billion=m.parameters_billion,
        config_json=m.config_json,
        # A config.json names its own dtype; ``m.dtype`` (default float16) is for a count.
        dtype=None if m.config_json is not None else m.dtype,
        kv_cache_dtype=m.kv_cache_dtype,
    )


def ceiling(settings: Settings, size: ModelSize | None = None) -> Ceiling | None:
    """The decode ceiling, when both the hardware and the model size are known."""
    hw = settings.hardware
    name: str | None = None
    bandwidth = hw.memory_bandwidth_gb_s
    if hw.gpu is not None:
        gpu = find_gpu(hw.gpu)
        name = gpu.name
        bandwidth = bandwidth or gpu.memory_bandwidth_gb_s
    size = size or settings_model_size(settings)
    if bandwidth is None or size is None:
        return None
    return build_ceiling(
        name,
        bandwidth,
        size.weight_bytes_per_token,
        tensor_parallel_size=hw.tensor_parallel_size,
        achievable_fraction=hw.achievable_fraction,
    )


def roofline(settings: Settings, size: ModelSize | None = None) -> Roofline | None:
    """The decode step roofline's facts, when the hardware and the model size are known
    (``docs/physics.md``, "The decode roofline"); hand-set keys replace the sized ones."""
    hw, m = settings.hardware, settings.model
    name: str | None = None
    bandwidth, compute = hw.memory_bandwidth_gb_s, hw.compute_tflops
    if hw.gpu is not None:
        gpu = find_gpu(hw.gpu)
        name = gpu.name
        bandwidth = bandwidth or gpu.memory_bandwidth_gb_s
        compute = compute or gpu.bf16_dense_tflops
    size = size or settings_model_size(settings)
    if bandwidth is None or size is None:
        return None
    return build_roofline(
        name,
        bandwidth,
        size,
        compute_tflops=compute,
        tensor_parallel_size=hw.tensor_parallel_size,
        achievable_fraction=hw.achievable_fraction,
        kv_bytes_per_token=m.kv_bytes_per_token,
        active_parameters_billion=m.active_parameters_billion,
        draft_parameters_billion=m.draft_parameters_billion,
        draft_dtype=m.draft_dtype,
        draft_kv_bytes_per_token=m.draft_kv_bytes_per_token,
    )


def build_rulebook(settings: Settings) -> Rulebook:
    slo, th = settings.slo, settings.thresholds
    size = settings_model_size(settings)
    return Rulebook(
        slo=Slo(
            ttft_p99_seconds=slo.ttft_p99_seconds,
            itl_p99_seconds=slo.itl_p99_seconds,
            waiting_requests=slo.waiting_requests,
        ),
        thresholds=Thresholds(
            min_observations=th.min_observations,
            kv_headroom_requests=th.kv_headroom_requests,
            kv_usage_full=th.kv_usage_full,
            queue_share_of_ttft=th.queue_share_of_ttft,
            prefill_dominant_share=th.prefill_dominant_share,
            itl_spike_ratio=th.itl_spike_ratio,
            near_ceiling_ratio=th.near_ceiling_ratio,
            roofline_impossible_ratio=th.roofline_impossible_ratio,
            dram_active_busy=th.dram_active_busy,
            stall_after_seconds=th.stall_after_seconds,
        ),
        remediation=load_remediation(),
        ceiling=ceiling(settings, size),
        roofline=roofline(settings, size),
        decode_remediation=load_decode_remediation(),
    )


def build_evaluator(settings: Settings, rulebook: Rulebook | None = None) -> Evaluator:
    """A fresh core for one target, configured from the settings (and ``rulebook``, when
    the caller already resolved one, as the demo does with each scenario's hardware)."""
    return Evaluator(
        rulebook or build_rulebook(settings),
        window_seconds=settings.window_seconds,
        open_after=settings.incident.open_after,
        resolve_after=settings.incident.resolve_after,
        change_cause_after=settings.incident.change_cause_after,
        reopen_within=settings.incident.reopen_within,
    )


def parse_limits(settings: Settings) -> ParseLimits:
    """What one scrape of a target may cost to read."""
    return ParseLimits(
        max_lines=settings.max_lines_per_scrape,
        max_line_length=settings.max_line_length,
        max_label_value_length=settings.max_label_value_length,
        max_models=settings.max_models_per_target,
    )
