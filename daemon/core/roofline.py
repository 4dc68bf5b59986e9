"""The decode step roofline: the shortest a decode step can physically be, per GPU, from
the window's own signals and the card's and model's facts (``docs/physics.md``, "The
decode roofline").

A decode step reads the weights (a mixture of experts: the shared weights plus the
experts its tokens touch), the KV cache of every running sequence, and a draft model's
weights (and its own KV cache) once per draft token; it multiplies every token it
computes through the active parameters. It cannot take less than the longer of bytes /
bandwidth and FLOPs / compute.
vLLM observes one inter-token latency per request per engine step, so the mean ITL *is*
the mean step: floor / mean ITL says how close to the hardware the server runs, whatever
the batch, the context length or the speculative decoding.

Pure arithmetic: no clock, no I/O; the same signals and facts give the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from vllm_triage.core.model import EvidenceValue, Histogram, Signals
from vllm_triage.core.rulebook import Ceiling, Roofline

Bound = Literal["memory", "compute"]
Term = Literal["weights", "kv", "draft", "compute"]


@dataclass(frozen=True, slots=True)
class StepRoofline:
    """One evaluation's decode step against its floor. Bytes, FLOPs and seconds are per
    GPU and per engine step; ``None`` terms were unknown and are named in ``left_out``."""

    gpu: str
    step_seconds: float
    floor_seconds: float
    bound_by: Bound
    dominant: Term
    weight_bytes: float
    kv_bytes: float | None
    draft_bytes: float | None
    flops: float | None
    tokens_per_step: float
    batch_tokens: float
    batch_tokens_source: str
    sequences: float | None
    experts_touched_share: float | None
    left_out: tuple[str, ...] = ()

    @property
    def ratio(self) -> float:
        """Floor over the observed step: near 1 at the hardware's limit; well above 1 is
        impossible (the settings describe a slower card or a bigger model than served)."""
        return self.floor_seconds / self.step_seconds

    @property
    def kv_read_share(self) -> float | None:
        if self.kv_bytes is None:
            return None
        total = self.weight_bytes + self.kv_bytes + (self.draft_bytes or 0.0)
        return self.kv_bytes / total if total > 0 else None


def weights_only(ceiling: Ceiling) -> Roofline:
    """The roofline a single-stream ``Ceiling`` implies when nothing else is known: its
    weights at its effective bandwidth (tensor parallelism and the achievable fraction are
    already folded into ``tokens_per_second``), every other term unknown."""
    return Roofline(
        gpu=ceiling.gpu,
        memory_bandwidth_gb_s=ceiling.tokens_per_second * ceiling.weight_bytes_per_token / 1e9,
        weight_bytes=ceiling.weight_bytes_per_token,
    )


@dataclass(frozen=True, slots=True)
class _Batch:
    """Tokens computed per step (T, the mean), how they spread over the window's steps
    (share of steps, tokens), sequences per step (B) and draft length (k), per engine."""

    tokens: float
    mix: tuple[tuple[float, float], ...]
    source: str
    sequences: float | None
    draft_length: float


def _mix(h: Histogram, mean: float) -> tuple[tuple[float, float], ...]:
    """The steps' token counts from the window's ``iteration_tokens`` buckets: each bucket
    at its midpoint, all scaled so that their mean is the exact ``mean`` (sum / count).

    Why not the mean alone: a step's floor is the larger of a memory term and a compute
    term that grows with T, so a few long prefill steps among many decode steps cost more
    than one step of the mean size would (the max is convex).
    """
    mix: list[tuple[float, float]] = []
    lower, seen = 0.0, 0.0
    for bound, cumulative in zip(h.bounds, h.cumulative, strict=True):
        n = cumulative - seen
        if n > 0:
            mid = 2.0 * lower if math.isinf(bound) else (lower + bound) / 2.0
            mix.append((n / h.count, max(mid, 1.0)))
        lower, seen = bound, cumulative
    scale = mean / sum(p * t for p, t in mix) if mix else 1.0
    return tuple((p, t * scale) for p, t in mix) or ((1.0, mean),)


def _batch(s: Signals, engines: int) -> _Batch:
    """T from ``vllm:iteration_tokens_total`` when exposed (prompt plus generated tokens
    per step, plus the rejected draft tokens the step also computed); otherwise from the
    running requests, each computing 1 + k tokens, plus the prompt tokens per step."""
    drafts = s.spec_drafts or 0.0
    draft_length = (s.spec_draft_tokens or 0.0) / drafts if drafts > 0 else 0.0
    running = s.running_busy_mean if s.running_busy_mean is not None else s.running_mean
    sequences = running / engines if running is not None else None
    h = s.iteration_tokens
    if h is not None and s.iteration_tokens_mean is not None and s.iteration_steps > 0:
        rejected = 0.0
        if drafts > 0:
            rejected = max(0.0, (s.spec_draft_tokens or 0.0) - (s.spec_accepted_tokens or 0.0))
        tokens = max(s.iteration_tokens_mean + rejected / s.iteration_steps, 1.0)
        return _Batch(tokens, _mix(h, tokens), ITERATION_TOKENS, sequences, draft_length)
    if sequences is not None:
        prompts = (s.prompt_tokens_per_second or 0.0) * (s.itl_mean or 0.0) / engines
        tokens = max(sequences * (1.0 + draft_length) + prompts, 1.0)
        return _Batch(tokens, ((1.0, tokens),), RUNNING, sequences, draft_length)
    return _Batch(1.0, ((1.0, 1.0),), "unknown (one token assumed)", sequences, draft_length)


ITERATION_TOKENS = "vllm:iteration_tokens_total"
RUNNING = "vllm:num_requests_running"


@dataclass(frozen=True, slots=True)
class _Step:
    """One step of ``tokens`` tokens: what it reads and computes, and how long it must take."""

    weights: float
    flops: float | None
    memory_s: float
    compute_s: float


def step_roofline(s: Signals, hw: Roofline) -> StepRoofline | None:
    """The window's decode step against its floor; ``None`` without a mean ITL."""
    step = s.itl_mean
    if step is None or step <= 0:
        return None
    left_out: list[str] = []
    engines = max(1, s.engines)
    tp = max(1, hw.tensor_parallel_size)
    batch = _batch(s, engines)
    if batch.source.startswith("unknown"):
        left_out.append("batch size: no iteration_tokens or running requests, one token assumed")
    bandwidth = hw.memory_bandwidth_gb_s * 1e9 * hw.achievable_fraction
    compute = hw.compute_tflops * 1e12 if hw.compute_tflops else None

    usage = s.kv_usage_busy_mean if s.kv_usage_busy_mean is not None else s.kv_usage_mean
    resident = None
    if s.kv_pool_tokens and usage is not None:
        resident = usage * s.kv_pool_tokens / engines
    kv: float | None = None
    if hw.kv_bytes_per_token is None:
        left_out.append("KV reads: model.kv_bytes_per_token unknown")
    elif resident is None:
        left_out.append("KV reads: pool size or usage not exposed (vllm:cache_config_info)")
    else:
        # KV heads split over the GPUs, but never below one head each (they replicate).
        split = min(tp, hw.kv_split) if hw.kv_split else tp
        kv = resident * hw.kv_bytes_per_token / split
    if hw.active_parameters is None or compute is None:
        missing = "model.active_parameters_billion" if compute else "hardware.compute_tflops"
        left_out.append(f"compute: {missing} unknown")

    def at(tokens: float) -> _Step:
        weights = hw.weight_bytes
        if hw.routed_expert_bytes > 0 and hw.num_experts > 0:
            # Uniform routing: T tokens each pick k of E experts, so the step touches
            # E * (1 - (1 - k/E)^T) distinct experts per MoE layer.
            share = 1.0 - (1.0 - hw.experts_per_token / hw.num_experts) ** tokens
            weights += hw.routed_expert_bytes * share
        weights /= tp
        flops: float | None = None
        if hw.active_parameters is not None and compute is not None:
            flops = 2.0 * hw.active_parameters * tokens
            if hw.attention_flops_per_context_token and resident and batch.sequences:
                # Each computed token attends to its sequence's context once.
                per_sequence = resident / batch.sequences
                flops += hw.attention_flops_per_context_token * per_sequence * tokens
            flops /= tp
        memory_s = (weights + (kv or 0.0)) / bandwidth
        compute_s = flops / compute if flops is not None and compute else 0.0
        return _Step(weights, flops, memory_s, compute_s)

    steps = [(p, at(tokens)) for p, tokens in batch.mix]
    target_s = sum(p * max(st.memory_s, st.compute_s) for p, st in steps)
    compute_bound_s = sum(p * st.compute_s for p, st in steps if st.compute_s > st.memory_s)
    weights = sum(p * st.weights for p, st in steps)
    flops = None if steps[0][1].flops is None else sum(p * (st.flops or 0.0) for p, st in steps)
    touched = None
    if hw.routed_expert_bytes > 0 and hw.num_experts > 0:
        touched = (weights * tp - hw.weight_bytes) / hw.routed_expert_bytes

    draft_bytes: float | None = None
    draft_s = 0.0
    if batch.draft_length > 0:
        if hw.draft_weight_bytes is None:
            left_out.append("draft reads: model.draft_parameters_billion unknown")
        else:
            # k draft forwards one after the other, each reading the draft's weights and,
            # for a separate draft model, its own KV cache of every sequence.
            per_forward = hw.draft_weight_bytes / tp
            if hw.draft_weight_bytes > 0 and hw.draft_kv_bytes_per_token is None:
                left_out.append("draft KV reads: model.draft_kv_bytes_per_token unknown")
            elif hw.draft_kv_bytes_per_token and resident is not None:
                split = min(tp, hw.kv_split) if hw.kv_split else tp
                per_forward += resident * hw.draft_kv_bytes_per_token / split
            draft_bytes = per_forward * batch.draft_length
            draft_flops = 2.0 * (hw.draft_parameters or 0.0) * (batch.sequences or 1.0) / tp
            per_s = max(per_forward / bandwidth, draft_flops / compute if compute else 0.0)
            draft_s = batch.draft_length * per_s
    bound: Bound = "compute" if compute_bound_s > target_s / 2 else "memory"
    dominant: Term = "compute"
    if bound == "memory":
        parts: tuple[tuple[float, Term], ...] = (
            (weights, "weights"),
            (kv or 0.0, "kv"),
            (draft_bytes or 0.0, "draft"),
        )
        dominant = max(parts, key=lambda p: p[0])[1]
    return StepRoofline(
        gpu=hw.gpu,
        step_seconds=step,
        floor_seconds=target_s + draft_s,
        bound_by=bound,
        dominant=dominant,
        weight_bytes=weights,
        kv_bytes=kv,
        draft_bytes=draft_bytes,
        flops=flops,
        tokens_per_step=s.decode_tokens_per_step,
        batch_tokens=batch.tokens,
        batch_tokens_source=batch.source,
        sequences=batch.sequences,
        experts_touched_share=touched,
        left_out=tuple(left_out),
    )


#: The settings that size each term: what to check when the floor is impossible.
_SETTINGS: dict[Term, tuple[str, ...]] = {
    "weights": ("model.parameters_billion / model.config_json", "model.dtype"),
    "kv": ("model.kv_bytes_per_token", "model.kv_cache_dtype"),
    "draft": ("model.draft_parameters_billion", "model.draft_kv_bytes_per_token"),
    "compute": ("hardware.compute_tflops", "model.active_parameters_billion"),
}
_HARDWARE = (
    "hardware.tensor_parallel_size",
    "hardware.gpu / hardware.memory_bandwidth_gb_s",
    "hardware.achievable_fraction",
)


def suspect_settings(r: StepRoofline) -> tuple[str, ...]:
    """The settings that could make the floor too long, the dominant term's first."""
    return (*_SETTINGS[r.dominant], *_HARDWARE)


def terms_by_weight(r: StepRoofline) -> tuple[Term, ...]:
    """The terms that cost time in this step, the binding one first, then the memory
    terms by the bytes they read (for ordering what to change)."""
    sized: list[tuple[float, Term]] = [
        (r.weight_bytes, "weights"),
        (r.kv_bytes or 0.0, "kv"),
        (r.draft_bytes or 0.0, "draft"),
    ]
    memory = tuple(term for size, term in sorted(sized, key=lambda p: -p[0]) if size > 0)
    return ("compute", *memory) if r.bound_by == "compute" else memory


def evidence(r: StepRoofline) -> dict[str, EvidenceValue]:
    """The roofline's numbers as evidence (per GPU, per engine step)."""
    return {
        "decode_roofline_ratio": r.ratio,
        "decode_step_seconds": r.step_seconds,
        "decode_step_floor_seconds": r.floor_seconds,
        "decode_bound_by": r.bound_by,
        "decode_dominant_term": r.dominant,
        "decode_kv_read_share": r.kv_read_share,
        "decode_tokens_per_step": r.tokens_per_step,
        "decode_batch_tokens_per_step": r.batch_tokens,
        "decode_batch_tokens_source": r.batch_tokens_source,
        "decode_step_weight_bytes": r.weight_bytes,
        "decode_step_kv_bytes": r.kv_bytes,
        "decode_step_draft_bytes": r.draft_bytes,
        "decode_step_flops": r.flops,
        "decode_experts_touched_share": r.experts_touched_share,
        "decode_roofline_left_out": "; ".join(r.left_out) or None,
    }
