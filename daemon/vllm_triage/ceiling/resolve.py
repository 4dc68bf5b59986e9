"""From what the user says about a model and a card to the core's ``Ceiling`` and
``Roofline``: one place, each fact with its source.

Both the daemon's settings (``vllm_triage.assemble``) and ``vllm-triage ceiling`` describe a
model by its parameter count and dtype, by its ``config.json``, or by the name vLLM serves
it under (a row of the bundled model table); the demo describes a simulated card by its
bandwidth. Each goes through here. What the metrics say is added by the core at every
evaluation (``vllm_triage.core.roofline.sources``; ``docs/physics.md``, "Where each fact comes
from").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vllm_triage.ceiling.gpus import find_gpu
from vllm_triage.ceiling.hardware import decode_ceiling_tokens_per_s
from vllm_triage.ceiling.models import find_model, model_facts
from vllm_triage.ceiling.sizing import (
    ModelSize,
    bytes_per_param,
    model_size_from_config,
    model_size_from_parameters,
    read_config_json,
)
from vllm_triage.core.rulebook import Ceiling, Roofline, Source
from vllm_triage.errors import ConfigError


@dataclass(frozen=True, slots=True)
class CardFacts:
    """A card's bandwidth, compute and memory, each from the settings or its row of
    rules/gpus.yaml; ``None`` where neither says (the memory only comes from the row)."""

    name: str | None
    bandwidth_gb_s: float | None
    compute_tflops: float | None
    memory_gb: float | None = None
    sources: dict[str, Source] = field(default_factory=dict)


def card_facts(
    gpu: str | None, bandwidth_gb_s: float | None = None, compute_tflops: float | None = None
) -> CardFacts:
    """The settings' figures first (``hardware.memory_bandwidth_gb_s``,
    ``hardware.compute_tflops``), then the named card's row (its dense bf16 figure)."""
    sources: dict[str, Source] = {}
    name = memory = None
    row_bandwidth = row_compute = None
    if gpu is not None:
        row = find_gpu(gpu)
        name, memory = row.name, row.memory_gb
        row_bandwidth, row_compute = row.memory_bandwidth_gb_s, row.bf16_dense_tflops
    for key, given, found, what in (
        ("bandwidth", bandwidth_gb_s, row_bandwidth, "hardware.memory_bandwidth_gb_s"),
        ("compute", compute_tflops, row_compute, "hardware.compute_tflops"),
    ):
        if given is not None:
            sources[key] = Source("settings", what)
        elif found is not None:
            detail = f"{name}, bf16 dense" if key == "compute" else f"{name}"
            sources[key] = Source("gpu table", detail)
    if memory is not None:
        sources["card_memory"] = Source("gpu table", f"{name}, {memory:g} GB")
    return CardFacts(
        name,
        bandwidth_gb_s or row_bandwidth,
        compute_tflops or row_compute,
        memory,
        sources,
    )


#: Tensor parallelism nobody said: one GPU (vLLM's metrics do not say; docs/physics.md).
DEFAULT_TP = Source("default", "1 GPU")


@dataclass(frozen=True, slots=True)
class SizedModel:
    """A model's size and where it came from (the settings, a config.json, a model row);
    ``how`` says how a served name found its row."""

    size: ModelSize
    source: Source
    how: str = ""


def table_model(served_name: str, kv_cache_dtype: str | None = None) -> SizedModel | None:
    """The row of rules/models.yaml that vLLM's ``model_name`` names, sized; ``None``
    when it names none (never a near name: ``ceiling.models.find_model``)."""
    found = find_model(served_name)
    if found is None:
        return None
    row, match = found
    facts = model_facts(row, match, kv_cache_dtype=kv_cache_dtype)
    return SizedModel(facts.size, Source("model table", row.id), match.how)


def model_size(
    *,
    parameters_billion: float | None,
    config_json: str | Path | None,
    dtype: str | None,
    kv_cache_dtype: str | None = None,
) -> ModelSize | None:
    """The model's size from its ``config.json`` or from a parameter count (at most one).

    With ``config_json`` the weight dtype comes from the config unless ``dtype`` names
    one; with a parameter count it is ``dtype`` (float16 when not given) and
    ``kv_cache_dtype`` has no layout to apply to. ``None`` when neither is given. Errors
    name the user's file.
    """
    if parameters_billion is not None and config_json is not None:
        raise ConfigError("give a parameter count or a config.json, not both")
    if config_json is not None:
        config = read_config_json(config_json)
        try:
            return model_size_from_config(config, dtype=dtype, kv_cache_dtype=kv_cache_dtype)
        except ConfigError as exc:  # name the user's file, not a generic "config.json"
            raise ConfigError(f"{config_json}: {str(exc).removeprefix('config.json: ')}") from exc
    if parameters_billion is not None:
        return model_size_from_parameters(parameters_billion, dtype or "float16")
    return None


def build_ceiling(
    name: str | None,
    memory_bandwidth_gb_s: float,
    weight_bytes_per_token: float,
    *,
    tensor_parallel_size: int = 1,
    achievable_fraction: float = 1.0,
) -> Ceiling:
    """The core's ``Ceiling`` for a card (named, or known only by its bandwidth)."""
    label = name or f"{memory_bandwidth_gb_s:g} GB/s"
    if tensor_parallel_size > 1:
        label = f"{tensor_parallel_size}x {label}"
    return Ceiling(
        gpu=label,
        memory_bandwidth_gb_s=memory_bandwidth_gb_s,
        weight_bytes_per_token=weight_bytes_per_token,
        tokens_per_second=decode_ceiling_tokens_per_s(
            memory_bandwidth_gb_s,
            weight_bytes_per_token,
            tensor_parallel_size=tensor_parallel_size,
            achievable_fraction=achievable_fraction,
        ),
    )


def build_roofline(
    card: CardFacts,
    model: SizedModel | None,
    *,
    table: SizedModel | None = None,
    tensor_parallel_size: int = 1,
    tensor_parallel_source: Source = DEFAULT_TP,
    achievable_fraction: float = 1.0,
    kv_bytes_per_token: float | None = None,
    kv_cache_dtype: str | None = None,
    active_parameters_billion: float | None = None,
    draft_parameters_billion: float | None = None,
    draft_dtype: str | None = None,
    draft_kv_bytes_per_token: float | None = None,
) -> Roofline | None:
    """The core's ``Roofline`` for a model on a card: the sized figures, with the ones
    given by hand (KV bytes per token, active parameters) in their place, and each
    fact's source. ``table`` (the served model's row) gives what ``model`` lacks: all of
    it without a model, the KV layout and attention beside a bare parameter count.

    ``None`` without a bandwidth (no floor at all). The draft model is read in
    ``draft_dtype`` (default: the model's weight dtype). An unknown fact stays ``None``:
    the core sizes it from the metrics or leaves the term out and names it.
    """
    if card.bandwidth_gb_s is None:
        return None
    if model is None:
        model, table = table, None
    label = card.name or f"{card.bandwidth_gb_s:g} GB/s"
    if tensor_parallel_size > 1:
        label = f"{tensor_parallel_size}x {label}"
    sources = dict(card.sources)
    sources["tensor_parallel"] = tensor_parallel_source
    size = model.size if model is not None else None
    # The KV layout and attention: the model's own, else (beside a bare count) the row's.
    layout_of = model if size is not None and size.kv_split is not None else table
    layout = layout_of.size if layout_of is not None else None
    draft_bytes = draft_params = None
    if draft_parameters_billion is not None:
        draft_params = draft_parameters_billion * 1e9
        try:
            dtype = draft_dtype or (size.dtype if size is not None else "float16")
            draft_bytes = draft_params * bytes_per_param(dtype)
        except ConfigError as exc:
            raise ConfigError(f"model.draft_dtype: {exc}") from exc
    weights = active = resident = None
    if size is not None and model is not None:
        sources["weights"] = model.source
        weights = (
            size.dense_weight_bytes
            if size.dense_weight_bytes is not None
            else size.weight_bytes_per_token
        )
        resident = size.resident_bytes
        active = size.active_parameters
        dense = model.source.kind == "settings"  # a bare count: every weight is active
        sources["active_parameters"] = (
            Source("settings", "model.parameters_billion, dense") if dense else model.source
        )
    if active_parameters_billion is not None:
        active = active_parameters_billion * 1e9
        sources["active_parameters"] = Source("settings", "model.active_parameters_billion")
    kv = None
    kv_in_model_dtype = False
    if kv_bytes_per_token is not None:
        kv = kv_bytes_per_token
        sources["kv_bytes_per_token"] = Source("settings", "model.kv_bytes_per_token")
    elif layout_of is not None and layout_of.size.kv_bytes_per_token is not None:
        kv = float(layout_of.size.kv_bytes_per_token)
        # Sized at the model's 16 bits unless a KV dtype was set: vLLM's cache_dtype applies.
        kv_in_model_dtype = kv_cache_dtype is None
        sources["kv_bytes_per_token"] = layout_of.source
    return Roofline(
        gpu=label,
        memory_bandwidth_gb_s=card.bandwidth_gb_s,
        achievable_fraction=achievable_fraction,
        compute_tflops=card.compute_tflops,
        tensor_parallel_size=tensor_parallel_size,
        weight_bytes=weights,
        routed_expert_bytes=size.routed_expert_bytes if size else 0.0,
        num_experts=size.num_experts if size else 0,
        experts_per_token=size.experts_per_token if size else 0,
        active_parameters=active,
        attention_flops_per_context_token=(
            layout.attention_flops_per_context_token if layout is not None else None
        ),
        kv_bytes_per_token=kv,
        kv_split=layout.kv_split if layout is not None else None,
        draft_weight_bytes=draft_bytes,
        draft_parameters=draft_params,
        draft_kv_bytes_per_token=draft_kv_bytes_per_token,
        kv_in_model_dtype=kv_in_model_dtype,
        memory_gb=card.memory_gb,
        resident_weight_bytes=resident,
        sources=sources,
    )
