"""What a simulated engine counts: vLLM's counters and histograms, and per-request timelines.

Kept apart from the scheduling model in ``engine`` because these are the quantities the
daemon reads back through ``/metrics``; ``exposition`` renders them in either era.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Literal

from vllm_triage.simulator.buckets import REQUEST_LATENCY_V1, grid

FinishedReason = Literal["stop", "length", "abort", "error", "repetition"]
#: The ``finished_reason`` label values vLLM V1 pre-creates, in its order.
FINISHED_REASONS: tuple[FinishedReason, ...] = ("stop", "length", "abort", "error", "repetition")


class Histogram:
    """Cumulative observations in fixed buckets (``le`` semantics), plus sum and count.

    Buckets are the finest bounds any rendered era uses; ``cumulative`` re-reads them at
    any subset of those bounds, exactly.
    """

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is (bounds[-1], +Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self, bounds: tuple[float, ...]) -> list[int]:
        """Counts ``<= b`` for each ``b`` in ``bounds`` (a subset of ours), then +Inf."""
        running: list[int] = []
        total = 0
        for count in self.counts:
            total += count
            running.append(total)
        try:
            return [running[self.bounds.index(b)] for b in bounds] + [total]
        except ValueError:
            raise ValueError(f"bounds {bounds} are not a subset of {self.bounds}") from None


def _latency() -> Histogram:
    return Histogram(REQUEST_LATENCY_V1)


def _on(field_name: str) -> Histogram:
    """A histogram counted on the grid of the vocabulary's ``field_name``."""
    return Histogram(grid(field_name))


@dataclass(slots=True)
class EngineStats:
    """What vLLM counts, cumulative since ``created_s`` (the engine's start, or the last
    in-process reset): counters never go down in between."""

    #: Virtual seconds when these counters were created (``_created`` in /metrics).
    created_s: float = 0.0
    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[FinishedReason, int] = field(
        default_factory=lambda: dict.fromkeys(FINISHED_REASONS, 0)
    )
    ttft: Histogram = field(default_factory=lambda: _on("ttft"))
    itl: Histogram = field(default_factory=lambda: _on("itl"))
    e2e: Histogram = field(default_factory=_latency)
    queue: Histogram = field(default_factory=lambda: _on("queue_time"))
    prefill: Histogram = field(default_factory=lambda: _on("prefill_time"))
    decode: Histogram = field(default_factory=lambda: _on("decode_time"))
    request_prompt_tokens: Histogram = field(default_factory=lambda: _on("prompt_length"))
    request_generation_tokens: Histogram = field(default_factory=lambda: _on("generation_length"))
    iteration_tokens: Histogram = field(default_factory=lambda: _on("iteration_tokens"))
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: dict[int, int] = field(default_factory=dict)
    steps: int = 0
    busy_s: float = 0.0
    #: What other engines observe differently (``dialects``): TTFT observed when a
    #: request finishes and each request's mean gap (TensorRT-LLM), queue time observed
    #: when a request is first scheduled (SGLang), the token counters at a request's end
    #: (TensorRT-LLM, SGLang's), prompt tokens computed as steps compute them; and the
    #: inter-token observations of steps that emitted several tokens, as one gap per step
    #: (``itl_multi``) and as that gap over each token (``itl_per_token``): SGLang's
    #: histogram is ``itl`` less the first plus the second.
    ttft_finish: Histogram = field(default_factory=lambda: _on("ttft"))
    tpot: Histogram = field(default_factory=lambda: _on("itl"))
    queue_start: Histogram = field(default_factory=lambda: _on("queue_time"))
    prompt_tokens_finished: int = 0
    generation_tokens_finished: int = 0
    prefill_computed: int = 0
    itl_multi: Histogram = field(default_factory=lambda: _on("itl"))
    itl_per_token: Histogram = field(default_factory=lambda: _on("itl"))
    #: The last step's duration, and the tokens it gave each decoding request.
    last_step_s: float = 0.0
    last_step_tokens: float = 1.0
    #: The engine's own truth, not exposed by vLLM: the hardware's share of each step
    #: (``floor_s``: the steps without their overhead), and the same weighted by the
    #: requests decoding in each step as vLLM's ITL histogram weighs steps:
    #: ``decode_floor_s / decode_step_s`` is the roofline ratio the daemon estimates.
    floor_s: float = 0.0
    decode_floor_s: float = 0.0
    decode_step_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request's timeline (kept only with ``Engine(keep_records=True)``);
    ``arrival_s`` is when the engine got it."""

    arrival_s: float
    scheduled_s: float
    first_token_s: float
    finished_s: float
    prompt_tokens: int
    output_tokens: int
    preemptions: int
    finished_reason: FinishedReason
    inter_token_s: tuple[float, ...]
    #: When the client sent it: ``arrival_s`` (when the engine got it) less the render.
    sent_s: float | None = None

    @property
    def render_s(self) -> float:
        """Time in the API server: waiting for a process, then rendering."""
        return 0.0 if self.sent_s is None else self.arrival_s - self.sent_s

    @property
    def queue_s(self) -> float:
        return self.scheduled_s - self.arrival_s

    @property
    def ttft_s(self) -> float:
        """From the client's send: render + queue + prefill."""
        return self.first_token_s - (self.arrival_s if self.sent_s is None else self.sent_s)

    @property
    def prefill_s(self) -> float:
        return self.first_token_s - self.scheduled_s

    @property
    def decode_s(self) -> float:
        return self.finished_s - self.first_token_s
