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

from dataclasses import dataclass
from typing import Literal

from vllm_triage.core.model import EvidenceValue, Signals
from vllm_triage.core.roofline import sources
from vllm_triage.core.roofline.batch import ITERATION_TOKENS, RUNNING, Batch, batch_of
from vllm_triage.core.roofline.sources import KVFigure, VllmEstimate
from vllm_triage.core.rulebook import Ceiling, Roofline

__all__ = [
    "ITERATION_TOKENS",
    "RUNNING",
    "StepRoofline",
    "evidence",
    "step_roofline",
    "suspect_settings",
    "terms_by_weight",
    "weights_only",
]

Bound = Literal["memory", "compute"]
Term = Literal["weights", "kv", "draft", "compute"]


@dataclass(frozen=True, slots=True)
class StepRoofline:
    """One evaluation's decode step against its floor. Bytes, FLOPs and seconds are per
    GPU and per engine step; ``None`` terms were unknown and are named in ``left_out``.
    ``gaps`` names, for each unknown term that could close the gap between the floor and
    the step, the setting that would size it: while there is one, the ratio is only a
    lower bound (``docs/physics.md``, "Where each fact comes from")."""

    gpu: str
    step_seconds: float
    floor_seconds: float
    bound_by: Bound
    dominant: Term
    weight_bytes: float | None
    kv_bytes: float | None
    draft_bytes: float | None
    flops: float | None
    tokens_per_step: float
    batch_tokens: float
    batch_tokens_source: str
    sequences: float | None
    experts_touched_share: float | None
    left_out: tuple[str, ...] = ()
    gaps: tuple[str, ...] = ()
    #: KV bytes per token per GPU, as used (its source is in ``facts_source``).
    kv_bytes_per_token: float | None = None
    facts_source: str = ""
    #: vLLM's own estimate of the step's bytes and FLOPs per GPU, when it exports one.
    vllm_bytes: float | None = None
    vllm_flops: float | None = None
    #: Whether the floor's bytes are vLLM's estimate (the facts ranked below it).
    bytes_from_vllm: bool = False
    disagreement: str | None = None
    #: The part of ``floor_seconds`` spent in compute-bound steps of the batch mix (the
    #: rest is memory-bound, or the draft's): a change of bytes moves only the rest.
    compute_bound_seconds: float = 0.0
    draft_seconds: float = 0.0

    @property
    def ratio(self) -> float:
        """Floor over the observed step: near 1 at the hardware's limit; well above 1 is
        impossible (the settings describe a slower card or a bigger model than served)."""
        return self.floor_seconds / self.step_seconds

    @property
    def lower_bound(self) -> bool:
        """Whether a term that could close the gap is unknown: the ratio is then a bound."""
        return bool(self.gaps)

    @property
    def kv_read_share(self) -> float | None:
        if self.kv_bytes is None:
            return None
        total = (self.weight_bytes or 0.0) + self.kv_bytes + (self.draft_bytes or 0.0)
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
class _Step:
    """One step of ``tokens`` tokens: what it reads and computes, and how long it must
    take. ``memory`` and ``flops`` are the arithmetic's; the seconds may be vLLM's."""

    weights: float
    memory: float
    flops: float | None
    memory_s: float
    compute_s: float


@dataclass(frozen=True, slots=True)
class _Kv:
    """The step's KV reads: the figure per token, the tokens resident per engine, and
    whether the running sequences may hold context (an unknown pool counts as may)."""

    figure: KVFigure | None
    resident: float | None
    bytes: float | None
    context: bool


def _kv(s: Signals, hw: Roofline, batch: Batch, engines: int, left_out: list[str]) -> _Kv:
    usage = s.kv_usage_busy_mean if s.kv_usage_busy_mean is not None else s.kv_usage_mean
    resident = None
    if s.kv_pool_tokens and usage is not None:
        resident = usage * s.kv_pool_tokens / engines
    figure = sources.resolve_kv_bytes_per_token(s, hw)
    kv: float | None = None
    if figure is None:
        # Neither given, nor exported (kv_cache_memory_bytes), nor in a model row, nor
        # estimable from the pool: the setting is what settles it.
        left_out.append("KV reads: model.kv_bytes_per_token unknown")
    elif resident is None:
        left_out.append("KV reads: pool size or usage not exposed (vllm:cache_config_info)")
    else:
        kv = resident * figure.bytes / figure.split
    running = batch.sequences is not None and batch.sequences > 0
    context = resident > 0 if resident is not None else running
    return _Kv(figure, resident, kv, context)


def _measured(
    hw: Roofline, kv: _Kv, estimate: VllmEstimate | None, compute: float | None
) -> tuple[float | None, float | None]:
    """The bytes and FLOPs per step taken from vLLM's estimate: where it exists and the
    arithmetic's own figure rests on something less than what the user set (the model
    table, an estimate, an unknown), since the metrics rank above those."""
    if estimate is None:
        return None, None
    kv_given = not kv.context or (
        kv.bytes is not None and kv.figure is not None and kv.figure.source.given
    )
    weights_given = hw.weight_bytes is not None and sources.source_of(hw, "weights").given
    flops_given = (
        hw.active_parameters is not None and sources.source_of(hw, "active_parameters").given
    )
    measured_bytes = None if weights_given and kv_given else estimate.bytes_per_step
    measured_flops = None if flops_given or compute is None else estimate.flops_per_step
    return measured_bytes, measured_flops


def step_roofline(s: Signals, hw: Roofline) -> StepRoofline | None:
    """The window's decode step against its floor; ``None`` without a mean ITL, or when
    nothing a step reads is known (no weights, no KV, no estimate from vLLM)."""
    step = s.decode_step_seconds
    if step is None or step <= 0:
        return None
    left_out: list[str] = []
    engines = max(1, s.engines)
    tp = max(1, hw.tensor_parallel_size)
    batch = batch_of(s, engines)
    if batch.source.startswith("unknown"):
        left_out.append("batch size: no iteration_tokens or running requests, one token assumed")
    bandwidth = hw.memory_bandwidth_gb_s * 1e9 * hw.achievable_fraction
    compute = hw.compute_tflops * 1e12 if hw.compute_tflops else None
    kv = _kv(s, hw, batch, engines, left_out)
    if hw.weight_bytes is None:
        left_out.append("weights: the model's size unknown")
    estimate = sources.vllm_estimate(s)
    measured_bytes, measured_flops = _measured(hw, kv, estimate, compute)
    if compute is None:
        left_out.append("compute: hardware.compute_tflops unknown")
    elif hw.active_parameters is None and measured_flops is None:
        left_out.append("compute: model.active_parameters_billion unknown")

    def at(tokens: float) -> _Step:
        weights = hw.weight_bytes or 0.0
        if hw.routed_expert_bytes > 0 and hw.num_experts > 0:
            # Uniform routing: T tokens each pick k of E experts, so the step touches
            # E * (1 - (1 - k/E)^T) distinct experts per MoE layer.
            share = 1.0 - (1.0 - hw.experts_per_token / hw.num_experts) ** tokens
            weights += hw.routed_expert_bytes * share
        weights /= tp
        flops: float | None = None
        if hw.active_parameters is not None and compute is not None:
            flops = 2.0 * hw.active_parameters * tokens
            if hw.attention_flops_per_context_token and kv.resident and batch.sequences:
                # Each computed token attends to its sequence's context once.
                per_sequence = kv.resident / batch.sequences
                flops += hw.attention_flops_per_context_token * per_sequence * tokens
            flops /= tp
        memory = weights + (kv.bytes or 0.0)
        memory_s = (measured_bytes if measured_bytes is not None else memory) / bandwidth
        used = flops if measured_flops is None else measured_flops * tokens / batch.tokens
        compute_s = used / compute if used is not None and compute else 0.0
        return _Step(weights, memory, flops, memory_s, compute_s)

    steps = [(p, at(tokens)) for p, tokens in batch.mix]
    target_s = sum(p * max(st.memory_s, st.compute_s) for p, st in steps)
    compute_bound_s = sum(p * st.compute_s for p, st in steps if st.compute_s > st.memory_s)
    weights = sum(p * st.weights for p, st in steps)
    flops = None if steps[0][1].flops is None else sum(p * (st.flops or 0.0) for p, st in steps)
    if measured_flops is not None:
        flops = measured_flops
    touched = None
    if hw.routed_expert_bytes > 0 and hw.num_experts > 0 and hw.weight_bytes is not None:
        touched = (weights * tp - hw.weight_bytes) / hw.routed_expert_bytes

    draft_bytes: float | None = None
    draft_s = 0.0
    gaps: list[str] = []
    if batch.draft_length > 0:
        if hw.draft_weight_bytes is None:
            left_out.append("draft reads: model.draft_parameters_billion unknown")
            gaps.append(sources.SETTLE_DRAFT)
        else:
            # k draft forwards one after the other, each reading the draft's weights and,
            # for a separate draft model, its own KV cache of every sequence.
            per_forward = hw.draft_weight_bytes / tp
            if hw.draft_weight_bytes > 0 and hw.draft_kv_bytes_per_token is None:
                left_out.append("draft KV reads: model.draft_kv_bytes_per_token unknown")
                gaps.append(sources.SETTLE_DRAFT_KV)
            elif hw.draft_kv_bytes_per_token and kv.resident is not None:
                per_forward += kv.resident * hw.draft_kv_bytes_per_token / sources.kv_split(hw)
            draft_bytes = per_forward * batch.draft_length
            draft_flops = 2.0 * (hw.draft_parameters or 0.0) * (batch.sequences or 1.0) / tp
            per_s = max(per_forward / bandwidth, draft_flops / compute if compute else 0.0)
            draft_s = batch.draft_length * per_s
    if measured_bytes is None:
        if kv.bytes is None and kv.context:
            gaps.insert(0, sources.SETTLE_KV if kv.figure is None else sources.SETTLE_POOL)
        if hw.weight_bytes is None:
            gaps.insert(0, sources.SETTLE_WEIGHTS)
    if target_s + draft_s <= 0:
        return None
    bound: Bound = "compute" if compute_bound_s > target_s / 2 else "memory"
    dominant: Term = "compute"
    if bound == "memory":
        read = weights
        if hw.weight_bytes is None and measured_bytes is not None:
            read = max(0.0, measured_bytes - (kv.bytes or 0.0))  # what vLLM's estimate implies
        parts: tuple[tuple[float, Term], ...] = (
            (read, "weights"),
            (kv.bytes or 0.0, "kv"),
            (draft_bytes or 0.0, "draft"),
        )
        dominant = max(parts, key=lambda p: p[0])[1]
    complete = hw.weight_bytes is not None and (kv.bytes is not None or not kv.context)
    arithmetic_bytes = sum(p * st.memory for p, st in steps) if complete else None
    arithmetic_flops = (
        None if steps[0][1].flops is None else sum(p * (st.flops or 0.0) for p, st in steps)
    )
    return StepRoofline(
        gpu=hw.gpu,
        step_seconds=step,
        floor_seconds=target_s + draft_s,
        bound_by=bound,
        dominant=dominant,
        weight_bytes=weights if hw.weight_bytes is not None else None,
        kv_bytes=kv.bytes,
        draft_bytes=draft_bytes,
        flops=flops,
        tokens_per_step=s.decode_tokens_per_step,
        batch_tokens=batch.tokens,
        batch_tokens_source=batch.source,
        sequences=batch.sequences,
        experts_touched_share=touched,
        left_out=tuple(left_out),
        gaps=tuple(gaps),
        kv_bytes_per_token=kv.figure.per_gpu if kv.figure is not None else None,
        facts_source=sources.facts_source(
            hw,
            s,
            kv.figure,
            vllm_bytes=measured_bytes is not None,
            vllm_flops=measured_flops is not None,
        ),
        vllm_bytes=estimate.bytes_per_step if estimate is not None else None,
        vllm_flops=estimate.flops_per_step if estimate is not None else None,
        bytes_from_vllm=measured_bytes is not None,
        disagreement=sources.disagreement(estimate, arithmetic_bytes, arithmetic_flops),
        compute_bound_seconds=compute_bound_s,
        draft_seconds=draft_s,
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
        (r.weight_bytes or 0.0, "weights"),
        (r.kv_bytes or 0.0, "kv"),
        (r.draft_bytes or 0.0, "draft"),
    ]
    memory: tuple[Term, ...] = tuple(
        term for size, term in sorted(sized, key=lambda p: -p[0]) if size > 0
    )
    first: tuple[Term, ...] = ("compute",) if r.bound_by == "compute" else ()
    return (*first, *memory)


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
        "decode_roofline_ratio_is_lower_bound": True if r.lower_bound else None,
        "decode_roofline_needs": r.gaps[0] if r.gaps else None,
        "decode_kv_bytes_per_token": r.kv_bytes_per_token,
        "decode_step_bytes_vllm": r.vllm_bytes,
        "decode_step_flops_vllm": r.vllm_flops,
        "decode_vllm_estimate_disagrees": r.disagreement,
        "decode_facts_source": r.facts_source or None,
    }
