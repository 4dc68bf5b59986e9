"""From what the user says about a model and a card to the core's ``Ceiling``: one place.

Both the daemon's settings (``vllm_triage.assemble``) and ``vllm-triage ceiling`` describe a
model either by its parameter count and dtype or by its ``config.json``; the demo
describes a simulated card by its bandwidth. Each goes through here.
"""

from __future__ import annotations

from pathlib import Path

from vllm_triage.ceiling.hardware import decode_ceiling_tokens_per_s
from vllm_triage.ceiling.sizing import (
    ModelSize,
    bytes_per_param,
    model_size_from_config,
    model_size_from_parameters,
    read_config_json,
)
from vllm_triage.core.rulebook import Ceiling, Roofline
from vllm_triage.errors import ConfigError


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
    name: str | None,
    memory_bandwidth_gb_s: float,
    size: ModelSize,
    *,
    compute_tflops: float | None = None,
    tensor_parallel_size: int = 1,
    achievable_fraction: float = 1.0,
    kv_bytes_per_token: float | None = None,
    active_parameters_billion: float | None = None,
    draft_parameters_billion: float | None = None,
    draft_dtype: str | None = None,
    draft_kv_bytes_per_token: float | None = None,
) -> Roofline:
    """The core's ``Roofline`` for a model on a card: the sized figures, with the ones
    given by hand (KV bytes per token, active parameters) in their place.

    The draft model is read in ``draft_dtype`` (default: the model's weight dtype).
    ``None`` stays ``None``: the core leaves an unknown term out and names it.
    """
    label = name or f"{memory_bandwidth_gb_s:g} GB/s"
    if tensor_parallel_size > 1:
        label = f"{tensor_parallel_size}x {label}"
    draft_bytes = draft_params = None
    if draft_parameters_billion is not None:
        draft_params = draft_parameters_billion * 1e9
        try:
            draft_bytes = draft_params * bytes_per_param(draft_dtype or size.dtype)
        except ConfigError as exc:
            raise ConfigError(f"model.draft_dtype: {exc}") from exc
    active = size.active_parameters
    if active_parameters_billion is not None:
        active = active_parameters_billion * 1e9
    return Roofline(
        gpu=label,
        memory_bandwidth_gb_s=memory_bandwidth_gb_s,
        achievable_fraction=achievable_fraction,
        compute_tflops=compute_tflops,
        tensor_parallel_size=tensor_parallel_size,
        weight_bytes=(
            size.dense_weight_bytes
            if size.dense_weight_bytes is not None
            else size.weight_bytes_per_token
        ),
        routed_expert_bytes=size.routed_expert_bytes,
        num_experts=size.num_experts,
        experts_per_token=size.experts_per_token,
        active_parameters=active,
        attention_flops_per_context_token=size.attention_flops_per_context_token,
        kv_bytes_per_token=(
            kv_bytes_per_token if kv_bytes_per_token is not None else size.kv_bytes_per_token
        ),
        kv_split=size.kv_split,
        draft_weight_bytes=draft_bytes,
        draft_parameters=draft_params,
        draft_kv_bytes_per_token=draft_kv_bytes_per_token,
    )
