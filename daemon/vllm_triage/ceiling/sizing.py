"""How many bytes a model reads per decoded token, and how many its KV cache holds per token.

The denominator of the decode ceiling (``docs/physics.md``): from a parameter count and
dtype, or from a model's ``config.json``, where mixture-of-experts (only the active
experts are read), tied embeddings, quantization and multi-head latent attention change
the answer. A config also gives what the decode step roofline needs beyond bytes per
token: the routed experts apart (a batch touches more of them than one token does), the
active parameters (FLOPs per token), attention FLOPs per context token, and over how many
GPUs the KV cache splits (``docs/physics.md``, "The decode roofline").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_triage.errors import ConfigError
from vllm_triage.rules import read_small_text

# Canonical name and bytes per weight. 4-bit formats count 0.5 byte and leave out their
# scales and zero points (a few percent), as the seed's arithmetic does.
_DTYPES: dict[str, tuple[str, float]] = {
    "fp32": ("float32", 4),
    "float32": ("float32", 4),
    "bf16": ("bfloat16", 2),
    "bfloat16": ("bfloat16", 2),
    "fp16": ("float16", 2),
    "float16": ("float16", 2),
    "half": ("float16", 2),
    "fp8": ("fp8", 1),
    "float8": ("fp8", 1),
    "fp8_e4m3": ("fp8", 1),
    "fp8_e5m2": ("fp8", 1),
    "float8_e4m3fn": ("fp8", 1),
    "int8": ("int8", 1),
    "int4": ("int4", 0.5),
    "4bit": ("int4", 0.5),
    "awq": ("int4", 0.5),
    "gptq-4bit": ("int4", 0.5),
}


def _dtype(name: str) -> tuple[str, float]:
    key = name.strip().lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; accepted: {', '.join(_DTYPES)}")
    return _DTYPES[key]


def bytes_per_param(dtype: str) -> float:
    """Bytes one weight occupies (and is read as) in ``dtype``; unknown names raise."""
    return _dtype(dtype)[1]


@dataclass(frozen=True, slots=True)
class ModelSize:
    """How big a model is, and how many bytes one decoded token reads.

    ``parameters`` counts every weight (all experts); ``weight_bytes_per_token`` is what
    one decode step reads, which is less for a mixture of experts. ``notes`` say which
    simplifications produced the figures, so they can be shown as evidence.
    """

    parameters: float
    weight_bytes_per_token: float
    kv_bytes_per_token: int | None
    dtype: str
    notes: tuple[str, ...] = ()
    #: Weights one token multiplies through (2 FLOPs each): what a token reads, less
    #: the input embedding table it only looks a row up in. None: unknown.
    active_parameters: float | None = None
    #: Of ``weight_bytes_per_token``, the bytes every step reads whatever the batch (all
    #: of a dense model); the routed experts are ``routed_expert_bytes`` in all, of which
    #: one token reads ``experts_per_token`` / ``num_experts``.
    dense_weight_bytes: float | None = None
    routed_expert_bytes: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    #: FLOPs one new token spends on each earlier token of its sequence, all layers.
    attention_flops_per_context_token: float | None = None
    #: Over how many GPUs tensor parallelism can split the KV cache: the KV heads (a
    #: latent cache, DeepSeek's MLA, is one tensor each GPU keeps whole: 1).
    kv_split: int | None = None
    num_layers: int | None = None
    #: What the weights occupy (all of them, the input embedding table included), when
    #: it differs from what a token reads; see ``resident_bytes``.
    resident_weight_bytes: float | None = None

    @property
    def resident_bytes(self) -> float:
        """What the weights occupy on the GPUs, all of them together: a config's count,
        or, from a parameter count, every weight (all of them are read)."""
        if self.resident_weight_bytes is not None:
            return self.resident_weight_bytes
        return self.weight_bytes_per_token


def model_size_from_parameters(parameters_billion: float, dtype: str) -> ModelSize:
    """The seed's arithmetic: every parameter is read once per token (8B x 2 = 16e9 bytes),
    and multiplied through once (a dense model: all of them are active)."""
    if not (math.isfinite(parameters_billion) and parameters_billion > 0):
        raise ConfigError(f"parameters_billion must be a positive number, got {parameters_billion}")
    name, size = _dtype(dtype)
    params = parameters_billion * 1e9
    return ModelSize(
        params,
        params * size,
        None,
        name,
        active_parameters=params,
        dense_weight_bytes=params * size,
    )


def _text(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The language model's config: multimodal configs nest it under ``text_config``."""
    nested = config.get("text_config")
    if isinstance(nested, Mapping):
        return nested, "text_config."
    return config, ""


def _int(cfg: Mapping[str, Any], key: str, prefix: str, *, default: int | None = None) -> int:
    """An integer key: required ones must be positive (a zero layer count would divide
    by zero later), optional ones (given a default) may be zero."""
    value = cfg.get(key)
    if value is None:
        if default is not None:
            return default
        raise ConfigError(f"config.json: missing required key {prefix + key!r}")
    least = 1 if default is None else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "a positive" if least else "a non-negative"
        raise ConfigError(f"config.json: {prefix + key!r} must be {kind} integer, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class _Attention:
    """One attention layer's shape: its linear weights, what one token keeps in the KV
    cache, and what attending to one earlier token costs."""

    layers: int
    linear_params: int  # per layer
    norm_params: int  # per layer, beyond the two RMSNorms every layer has
    kv_elements: int  # per token per layer
    kv_split: int  # GPUs the cache can split over (KV heads; 1 for a latent cache)
    flops_per_pair: int  # per layer, per (new token, earlier token)


def _attention(cfg: Mapping[str, Any], prefix: str) -> _Attention:
    """Grouped-query (Llama-style) or multi-head latent attention (DeepSeek V2/V3).

    GQA keeps a key and a value per KV head (2 x KV heads x head_dim per token and layer)
    and spends 2 x heads x head_dim FLOPs on scores and as many on the weighted values per
    earlier token. MLA keeps one compressed latent (``kv_lora_rank``) plus the shared
    rotary key (``qk_rope_head_dim``) per token and layer; decoding with its up-projections
    absorbed, each head scores over latent + rotary dims and sums values over the latent.
    """
    layers = _int(cfg, "num_hidden_layers", prefix)
    heads = _int(cfg, "num_attention_heads", prefix)
    hidden = _int(cfg, "hidden_size", prefix)
    if cfg.get("kv_lora_rank") is not None:
        latent = _int(cfg, "kv_lora_rank", prefix)
        rope = _int(cfg, "qk_rope_head_dim", prefix)
        nope = _int(cfg, "qk_nope_head_dim", prefix)
        v_dim = _int(cfg, "v_head_dim", prefix)
        q_rank = _int(cfg, "q_lora_rank", prefix, default=0)
        q_head = heads * (nope + rope)
        query = hidden * q_rank + q_rank * q_head if q_rank else hidden * q_head
        linear = query + hidden * (latent + rope) + latent * heads * (nope + v_dim)
        linear += heads * v_dim * hidden
        return _Attention(
            layers=layers,
            linear_params=linear,
            norm_params=q_rank + latent,  # the q and kv latent RMSNorms
            kv_elements=latent + rope,
            kv_split=1,
            flops_per_pair=2 * heads * (latent + rope) + 2 * heads * latent,
        )
    kv_heads = _int(cfg, "num_key_value_heads", prefix, default=heads)
    explicit = cfg.get("head_dim") is not None
    head_dim = _int(cfg, "head_dim", prefix) if explicit else hidden // heads
    return _Attention(
        layers=layers,
        linear_params=2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim,
        norm_params=0,
        kv_elements=2 * kv_heads * head_dim,
        kv_split=kv_heads,
        flops_per_pair=4 * heads * head_dim,
    )


def architecture_kv_bytes_per_token(config: Mapping[str, Any], kv_dtype_bytes: float) -> int:
    """KV cache bytes one token holds: 2 (key, value) x layers x KV heads x head_dim x
    bytes; with multi-head latent attention, (kv_lora_rank + qk_rope_head_dim) x layers x
    bytes (``docs/physics.md``, "The KV cache")."""
    if not kv_dtype_bytes > 0:
        raise ValueError("kv_dtype_bytes must be positive")
    cfg, prefix = _text(config)
    att = _attention(cfg, prefix)
    return int(att.layers * att.kv_elements * kv_dtype_bytes)


def _lookup(config: Mapping[str, Any], cfg: Mapping[str, Any], key: str) -> Any:
    """Keys multimodal configs keep at the top level (dtype, quantization, tying)."""
    return cfg[key] if cfg.get(key) is not None else config.get(key)


def _quantized(qc: Any) -> tuple[str, str]:
    """(canonical dtype, method) of a ``quantization_config``; unknown widths raise."""
    if not isinstance(qc, Mapping):
        raise ConfigError("config.json: 'quantization_config' must be an object")
    method = str(qc.get("quant_method", "unknown")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", method
    if method == "mxfp4":
        return "int4", method
    bits = qc.get("bits", qc.get("w_bit"))
    if qc.get("load_in_4bit"):
        bits = 4
    elif qc.get("load_in_8bit"):
        bits = 8
    groups = qc.get("config_groups")
    if bits is None and isinstance(groups, Mapping):  # compressed-tensors
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping) and weights.get("num_bits") is not None:
                bits = weights["num_bits"]
                if bits == 8 and weights.get("type") == "float":
                    return "fp8", method
                break
    if bits == 4:
        return "int4", method
    if bits == 8:
        return "int8", method
    raise ConfigError(
        f"config.json: quantization_config: cannot tell the weight width of quant_method "
        f"{method!r} (bits={bits!r}); pass dtype (--dtype) explicitly"
    )


def _dtypes(
    config: Mapping[str, Any], cfg: Mapping[str, Any], dtype: str | None, notes: list[str]
) -> tuple[str, float, str, float]:
    """(weight dtype, bytes) for linear layers and (activation dtype, bytes) for the rest.

    Precedence for weights: the ``dtype`` argument, then ``quantization_config``, then the
    config's ``torch_dtype``/``dtype``. Quantization covers linear layers only: embeddings,
    lm_head, norms and routers stay in the 16-bit activation dtype, as in AWQ/GPTQ/FP8
    checkpoints and vLLM's online FP8.
    """
    raw = _lookup(config, cfg, "torch_dtype") or _lookup(config, cfg, "dtype")
    if raw is None:
        notes.append("config.json names no torch_dtype: 16-bit assumed")
        raw = "float16"
    try:
        weight, weight_bytes = _dtype(str(raw))
    except ConfigError as exc:
        raise ConfigError(f"config.json: torch_dtype: {exc}") from exc
    act, act_bytes = weight, weight_bytes
    if weight_bytes > 2:
        notes.append(
            f"config.json says {weight}: vLLM's dtype=auto serves float32 checkpoints in "
            "16 bits, so 2 bytes per weight are counted (pass dtype to override)"
        )
        weight, weight_bytes = act, act_bytes = "float16", 2.0
    elif weight_bytes < 2:  # a checkpoint stored in 8 bits still computes in 16
        act, act_bytes = "bfloat16", 2.0
    qc = _lookup(config, cfg, "quantization_config")
    if dtype is not None:
        weight, weight_bytes = _dtype(dtype)
        if weight_bytes >= 2:
            act, act_bytes = weight, weight_bytes
        if qc is not None:
            notes.append(f"dtype {weight} given: it replaces the config's quantization_config")
    elif qc is not None:
        weight, method = _quantized(qc)
        weight_bytes = _DTYPES[weight][1]
        notes.append(
            f"quantization_config ({method}): linear layers at {weight_bytes:g} bytes per weight, "
            "scales and zero points not counted (a few percent)"
        )
    if weight_bytes < act_bytes:
        notes.append(f"embeddings, lm_head, norms and routers kept in {act}")
    return weight, weight_bytes, act, act_bytes


@dataclass(frozen=True, slots=True)
class _Counts:
    """Parameter counts split by how they are stored (linear vs 16-bit) and read."""

    linear_total: int
    linear_read: int
    other_total: int  # norms, routers, embeddings, lm_head: activation dtype
    other_read: int
    routed_total: int = 0  # of linear_total: every routed expert of every MoE layer
    experts: int = 0
    per_token: int = 0


def _count(cfg: Mapping[str, Any], prefix: str, tied: bool, notes: list[str]) -> _Counts:
    """Count a Llama-style decoder: attention projections (grouped-query or latent),
    gated MLP (3 matrices), RMSNorms."""
    hidden = _int(cfg, "hidden_size", prefix)
    vocab = _int(cfg, "vocab_size", prefix)
    att = _attention(cfg, prefix)
    layers, attention = att.layers, att.linear_params
    experts = next(
        (
            _int(cfg, k, prefix)
            for k in ("num_local_experts", "num_experts", "n_routed_experts")
            if cfg.get(k)
        ),
        0,
    )
    sparse = 0
    expert = shared = router = 0
    per_token = 0
    if experts:
        per_token = _int(cfg, "num_experts_per_tok", prefix)
        if per_token > experts:
            raise ConfigError(f"config.json: {prefix}num_experts_per_tok exceeds the expert count")
        # Mixtral's experts use intermediate_size; Qwen/DeepSeek name a smaller one.
        expert_inter = _int(cfg, "moe_intermediate_size", prefix, default=0)
        expert = 3 * hidden * (expert_inter or _int(cfg, "intermediate_size", prefix))
        shared_inter = _int(cfg, "shared_expert_intermediate_size", prefix, default=0)
        n_shared = _int(cfg, "n_shared_experts", prefix, default=0)
        shared = 3 * hidden * shared_inter + n_shared * expert
        router = hidden * experts + (hidden if shared_inter else 0)  # + shared-expert gate
        # Which layers are sparse: DeepSeek keeps the first k dense, Qwen lists dense
        # layers or makes every n-th layer sparse.
        first_dense = _int(cfg, "first_k_dense_replace", prefix, default=0)
        step = _int(cfg, "decoder_sparse_step", prefix, default=1) or 1
        dense_only = cfg.get("mlp_only_layers") or []
        if not isinstance(dense_only, list):
            raise ConfigError(f"config.json: {prefix}mlp_only_layers must be a list")
        sparse = sum(
            1
            for i in range(layers)
            if i >= first_dense and i not in dense_only and (i + 1) % step == 0
        )
        notes.append(
            f"mixture of experts: {per_token} of {experts} experts read per token in each of "
            f"{sparse} MoE layers"
            + (", plus the shared expert(s)" if shared else "")
            + "; parameters count all experts"
        )
    dense = layers - sparse
    mlp = 3 * hidden * _int(cfg, "intermediate_size", prefix) if dense else 0
    linear_common = layers * attention + dense * mlp + sparse * shared
    norms = (2 * layers + 1) * hidden + layers * att.norm_params
    table = vocab * hidden
    small = norms + sparse * router  # read every token, kept in the activation dtype
    if tied:
        notes.append("tied embeddings: the lm_head reads the shared embedding table every token")
        other_total = other_read = small + table
    else:
        # Embedding lookup reads one row; the lm_head matmul reads its whole matrix.
        notes.append(
            f"input embedding table ({table / 1e9:.3g}B parameters) not read per token (one row)"
        )
        other_total, other_read = small + 2 * table, small + table + hidden
    return _Counts(
        linear_total=linear_common + sparse * experts * expert,
        linear_read=linear_common + sparse * per_token * expert,
        other_total=other_total,
        other_read=other_read,
        routed_total=sparse * experts * expert,
        experts=experts,
        per_token=per_token,
    )


def model_size_from_config(
    config: Mapping[str, Any], *, dtype: str | None = None, kv_cache_dtype: str | None = None
) -> ModelSize:
    """Size and bytes read per token of a HuggingFace ``config.json`` (Llama-style layout).

    Bytes per token count every weight a decode step touches: all of a dense model except
    the input embedding table (one row of it is read), or, for a mixture of experts, the
    shared weights plus ``num_experts_per_tok`` experts. Biases, per-head q/k norms and
    multi-token-prediction heads are left out (well under 1% of the weights).
    """
    cfg, prefix = _text(config)
    notes: list[str] = []
    if prefix:
        notes.append(
            "multimodal config: text_config counted; the vision tower runs in prefill only"
        )
    weight, weight_bytes, act, act_bytes = _dtypes(config, cfg, dtype, notes)
    tied_raw = _lookup(config, cfg, "tie_word_embeddings")
    if tied_raw is None:
        notes.append("tie_word_embeddings absent: embeddings assumed untied")
    counts = _count(cfg, prefix, bool(tied_raw), notes)

    if kv_cache_dtype is None or kv_cache_dtype.strip().lower() == "auto":
        kv_name, kv_bytes = act, act_bytes
        if weight_bytes < act_bytes:
            notes.append(
                f"weight quantization does not shrink the KV cache: KV counted in {act} "
                "(set kv_cache_dtype, e.g. fp8, to change it)"
            )
    else:
        kv_name, kv_bytes = _dtype(kv_cache_dtype)
    notes.append(f"KV cache in {kv_name}")
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
        notes.append("sliding-window attention: KV per token counts every layer (an upper bound)")
    att = _attention(cfg, prefix)
    if att.kv_split == 1 and cfg.get("kv_lora_rank") is not None:
        notes.append(
            "multi-head latent attention: KV per token is (kv_lora_rank + qk_rope_head_dim) "
            "x layers, kept whole on every tensor-parallel GPU"
        )
    read = counts.linear_read * weight_bytes + counts.other_read * act_bytes
    routed = counts.routed_total * weight_bytes
    return ModelSize(
        parameters=float(counts.linear_total + counts.other_total),
        weight_bytes_per_token=float(read),
        kv_bytes_per_token=architecture_kv_bytes_per_token(config, kv_bytes),
        dtype=weight,
        notes=tuple(notes),
        # What a token reads is what it multiplies through, but for the one row of the
        # input table it looks up (a rounding error, counted).
        active_parameters=float(counts.linear_read + counts.other_read),
        dense_weight_bytes=float(read - routed * counts.per_token / max(counts.experts, 1)),
        routed_expert_bytes=float(routed),
        num_experts=counts.experts,
        experts_per_token=counts.per_token,
        attention_flops_per_context_token=float(att.layers * att.flops_per_pair),
        kv_split=att.kv_split,
        num_layers=att.layers,
        resident_weight_bytes=float(
            counts.linear_total * weight_bytes + counts.other_total * act_bytes
        ),
    )


def read_config_json(path: str | Path) -> dict[str, Any]:
    """Load a model's Hugging Face ``config.json`` (or the folder holding it); every way
    it can fail becomes one ``ConfigError`` that names the file."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(read_small_text(p))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply; refused") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a config.json must hold a JSON object")
    return data
