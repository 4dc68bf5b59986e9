"""Where each fact of the decode step roofline comes from, and what the metrics add.

The assembly resolves what the settings, a config.json and the bundled tables say
(``Roofline.sources``); vLLM's metrics say the rest at every evaluation, so the core
finishes the job here (``docs/physics.md``, "Where each fact comes from"):

- KV bytes per token per GPU, tried in order: the user's ``model.kv_bytes_per_token`` or
  config.json; ``kv_cache_memory_bytes / kv_cache_size_tokens`` from
  ``vllm:cache_config_info`` (exact, when the operator fixed the pool's bytes); the
  model row's figure; an estimate from the pool's size, the card's memory and the weights.
  A 16-bit figure of the model's own (config.json, model row) is halved when vLLM
  reports an fp8 cache.
- Bytes and FLOPs per engine step from vLLM's own estimator
  (``vllm:estimated_read_bytes_per_gpu_total``, ``vllm:estimated_flops_per_gpu_total``),
  their window increases over the steps'. They outrank the model table and estimates,
  not what the user set, and the two are cross-checked (``TOLERANCE``).
- What is still unknown and could close the gap between the floor and the step: then
  the ratio is a lower bound and the verdict waits for the one setting that settles it.

Pure arithmetic on the signals and the rulebook's facts.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_triage.core.model import Signals
from vllm_triage.core.roofline.kvpool import estimate_from_pool, from_memory_bytes, from_model_row
from vllm_triage.core.rulebook import Roofline, Source

#: How far vLLM's own estimate of a step's bytes or FLOPs may lie from the arithmetic's,
#: as |a - b| / max(a, b), before the evidence says they disagree. vLLM's estimator
#: counts a few reads the arithmetic does not (activations) and reads min(T x k, E)
#: experts of a mixture where the arithmetic takes uniform routing, so a dense model's
#: two figures agree within a few percent and a mixture's within tens.
TOLERANCE = 0.25

#: What settles each unknown term, as the summary and ``decode_roofline_needs`` say it.
SETTLE_WEIGHTS = (
    "set model.parameters_billion or model.config_json (or serve a model from the table)"
)
SETTLE_KV = "set model.kv_bytes_per_token (or serve a model from the table)"
SETTLE_POOL = "run a vLLM that exports vllm:cache_config_info (the KV pool's size)"
SETTLE_DRAFT = "set model.draft_parameters_billion"
SETTLE_DRAFT_KV = "set model.draft_kv_bytes_per_token"

ESTIMATED_READ = "vllm:estimated_read_bytes_per_gpu_total"
ESTIMATED_FLOPS = "vllm:estimated_flops_per_gpu_total"

#: A fact the rulebook names no source for was handed over whole (a test, a hand-made
#: rulebook): it counts as given.
_GIVEN = Source("settings")


def source_of(hw: Roofline, fact: str) -> Source:
    return hw.sources.get(fact, _GIVEN)


def kv_split(hw: Roofline) -> int:
    """Over how many GPUs a model figure of KV bytes per token divides: the tensor
    parallel size, never more than the KV heads (below one head each, they replicate)."""
    tp = max(1, hw.tensor_parallel_size)
    return min(tp, hw.kv_split) if hw.kv_split else tp


@dataclass(frozen=True, slots=True)
class KVFigure:
    """KV bytes per token: ``bytes`` over ``split`` GPUs (1 for a per-GPU figure)."""

    bytes: float
    split: int
    source: Source

    @property
    def per_gpu(self) -> float:
        return self.bytes / self.split


def _model_figure(hw: Roofline, cache_dtype: str) -> KVFigure | None:
    """The rulebook's figure (settings, config.json or model row), in the cache dtype
    vLLM reports when it is the model's own 16-bit figure; None when there is none or
    the cache dtype is one the arithmetic does not know (fp8_ds_mla, a 4-bit cache)."""
    if hw.kv_bytes_per_token is None:
        return None
    source = source_of(hw, "kv_bytes_per_token")
    if not hw.kv_in_model_dtype or cache_dtype == "auto":
        return KVFigure(hw.kv_bytes_per_token, kv_split(hw), source)
    scaled = from_model_row(hw.kv_bytes_per_token, cache_dtype)
    if scaled is None:
        return None
    detail = ", ".join(d for d in (source.detail, f"KV cache {cache_dtype}") if d)
    return KVFigure(scaled.value, kv_split(hw), Source(source.kind, detail))


def resolve_kv_bytes_per_token(s: Signals, hw: Roofline) -> KVFigure | None:
    """KV bytes per token, from the first source that has it (the module's note)."""
    cfg = s.kv_cache
    model = _model_figure(hw, cfg.cache_dtype if cfg is not None else "auto")
    if model is not None and model.source.given:
        return model
    if cfg is not None:
        exact = from_memory_bytes(cfg)
        if exact is not None:
            return KVFigure(exact.value, 1, Source("metrics", "kv_cache_memory_bytes"))
    if model is not None:
        return model
    if cfg is None or hw.memory_gb is None or hw.resident_weight_bytes is None:
        return None
    per_gpu = hw.resident_weight_bytes / max(1, hw.tensor_parallel_size)
    pool = estimate_from_pool(cfg, memory_gb=hw.memory_gb, weight_bytes_per_gpu=per_gpu)
    if pool is None:
        return None
    bounds = f"from the pool's size, {pool.low:.0f} to {pool.high:.0f}"
    return KVFigure(pool.value, 1, Source("estimate", bounds))


@dataclass(frozen=True, slots=True)
class VllmEstimate:
    """One engine step's bytes read and FLOPs per GPU by vLLM's own estimator (window
    increases over the steps'); ``None`` where a counter is absent or did not move."""

    bytes_per_step: float | None
    flops_per_step: float | None


def vllm_estimate(s: Signals) -> VllmEstimate | None:
    """vLLM's estimate per step, when its counters and the step count moved."""
    steps = s.iteration_steps
    if steps <= 0:
        return None

    def per_step(total: float | None) -> float | None:
        return total / steps if total is not None and total > 0 else None

    found = VllmEstimate(per_step(s.estimated_read_bytes), per_step(s.estimated_flops))
    if found.bytes_per_step is None and found.flops_per_step is None:
        return None
    return found


def _apart(a: float, b: float) -> float:
    return abs(a - b) / max(a, b)


def disagreement(
    estimate: VllmEstimate | None, arithmetic_bytes: float | None, arithmetic_flops: float | None
) -> str | None:
    """Where vLLM's estimate and the arithmetic lie more than ``TOLERANCE`` apart."""
    if estimate is None:
        return None
    out: list[str] = []
    pairs = (
        ("bytes", estimate.bytes_per_step, arithmetic_bytes, 1e9, "GB"),
        ("FLOPs", estimate.flops_per_step, arithmetic_flops, 1e12, "TFLOP"),
    )
    for what, theirs, ours, unit, name in pairs:
        if theirs is None or ours is None or ours <= 0:
            continue
        apart = _apart(theirs, ours)
        if apart > TOLERANCE:
            out.append(
                f"{what} per step: vLLM's estimate {theirs / unit:.3g} {name}, the facts "
                f"{ours / unit:.3g} {name} ({apart:.0%} apart; tolerance {TOLERANCE:.0%})"
            )
    return "; ".join(out) or None


def pool_source(s: Signals) -> str:
    if s.kv_pool_tokens is None:
        return "unknown (no vllm:cache_config_info)"
    if s.kv_cache is not None and s.kv_cache.kv_cache_size_tokens is not None:
        return "metrics (kv_cache_size_tokens)"
    return "metrics (num_gpu_blocks x block_size)"


def facts_source(
    hw: Roofline,
    s: Signals,
    kv: KVFigure | None,
    *,
    vllm_bytes: bool,
    vllm_flops: bool,
) -> str:
    """Every fact with its source, compactly: ``bandwidth=gpu table (NVIDIA H100 SXM);
    weights=settings; kv_bytes_per_token=metrics (kv_cache_memory_bytes); ...``."""
    parts: list[tuple[str, str]] = [
        ("bandwidth", str(source_of(hw, "bandwidth"))),
        ("compute", str(source_of(hw, "compute")) if hw.compute_tflops else "unknown"),
        ("weights", str(source_of(hw, "weights")) if hw.weight_bytes is not None else "unknown"),
        ("kv_bytes_per_token", str(kv.source) if kv is not None else "unknown"),
        ("pool_tokens", pool_source(s)),
        ("tensor_parallel", str(source_of(hw, "tensor_parallel"))),
        (
            "active_parameters",
            str(source_of(hw, "active_parameters"))
            if hw.active_parameters is not None
            else "unknown",
        ),
    ]
    if vllm_bytes:
        parts.append(("step_bytes", f"metrics ({ESTIMATED_READ})"))
    if vllm_flops:
        parts.append(("step_flops", f"metrics ({ESTIMATED_FLOPS})"))
    return "; ".join(f"{k}={v}" for k, v in parts)
