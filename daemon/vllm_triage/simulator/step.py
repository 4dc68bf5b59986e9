"""One engine step's parts: the requests it schedules and what it costs the hardware.

Split from ``engine`` (the scheduler) to keep each module small. ``step_floor`` is the
step without its fixed overhead, ``max(compute, memory)`` of the target's forward plus
the draft forwards (``engine``'s docstring has the model); ``Request`` and ``Step`` are
the engine's working state, not part of the simulator's interface.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from vllm_triage.simulator.spec import Arrival, ServerSpec
from vllm_triage.simulator.stats import FinishedReason


class Request:
    """A request inside the engine; mutable, updated once per step (the engine's own)."""

    __slots__ = (
        "arrival",
        "blocks",
        "computed",
        "first_token",
        "generated",
        "itl",
        "last_token",
        "output",
        "preemptions",
        "prompt",
        "reason",
        "scheduled",
        "sent",
        "target",
    )

    def __init__(self, arrival: Arrival, prompt: int, output: int) -> None:
        self.arrival = arrival.at_s  # when the engine got it
        self.sent = arrival.sent_at  # when the client sent it (TTFT counts from here)
        self.prompt = prompt
        self.output = output
        self.reason: FinishedReason = arrival.finished_reason
        self.generated = 0  # output tokens produced so far
        self.computed = 0  # tokens whose KV is in the cache
        self.target = 0  # tokens to compute before the next token comes out
        self.blocks = 0
        self.scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token = 0.0
        self.preemptions = 0
        self.itl: list[float] = []


@dataclass(slots=True)
class Step:
    """A scheduled step: decided at its start, its tokens come out at ``end``.

    ``decode`` pairs each decoding request with the draft tokens it verifies; ``floor``
    is the step without its fixed overhead (what the hardware needed).
    """

    end: float
    prefill: list[tuple[Request, int]]
    decode: list[tuple[Request, int]]
    floor: float = 0.0


def step_floor(
    spec: ServerSpec,
    prefill: list[tuple[Request, int]],
    decode: list[tuple[Request, int]],
    rng: random.Random,
) -> float:
    """``max(FLOPs / compute, bytes / bandwidth)`` of the target's forward, plus the
    draft forwards (one per draft token, one after the other): the step without its
    fixed overhead."""
    compute = spec.compute_tflops * 1e12 * spec.compute_efficiency
    bandwidth = spec.memory_bandwidth_gb_s * 1e9
    tokens = 0
    pairs = 0.0  # (query, key) pairs attention multiplies
    context = 0  # tokens whose KV the step reads or writes
    for req, chunk in prefill:
        tokens += chunk
        pairs += chunk * req.computed + chunk * (chunk + 1) / 2
        context += req.computed + chunk
    drafting = drafted_context = 0
    for req, drafts in decode:
        # The token and its drafts, each attending to what came before it.
        tokens += 1 + drafts
        pairs += (1 + drafts) * (req.computed + 1) + drafts * (drafts + 1) / 2
        context += req.computed + 1 + drafts
        if drafts:
            drafting += 1
            drafted_context += req.computed + 1
    flops = 2 * spec.parameters * tokens + 4 * spec.num_layers * spec.hidden_size * pairs
    weights = spec.weight_bytes + experts_read(spec, tokens, rng)
    memory_s = (weights + spec.kv_bytes_per_token * context) / bandwidth
    floor = max(flops / compute, memory_s)
    draft_len = max((d for _, d in decode), default=0)
    if draft_len:
        # Each draft forward reads the draft's weights and its KV of every drafter.
        draft_bytes = spec.draft_weight_bytes + spec.draft_kv_bytes_per_token * drafted_context
        forward = max(draft_bytes / bandwidth, 2 * spec.draft_parameters * drafting / compute)
        floor += draft_len * forward
    return floor


def experts_read(spec: ServerSpec, tokens: int, rng: random.Random) -> float:
    """Bytes of the routed experts the step's ``tokens`` are routed to: each draws
    ``experts_per_token`` distinct experts uniformly; the step reads every expert drawn
    at least once (one layer drawn, standing for every MoE layer)."""
    if spec.routed_expert_bytes <= 0:
        return 0.0
    experts, k = spec.num_experts, spec.experts_per_token
    if tokens * k >= 40 * experts:
        touched = experts  # missing one expert has odds below e**-40 per expert
    else:
        drawn: set[int] = set()
        pool = range(experts)
        for _ in range(tokens):
            drawn.update(rng.sample(pool, k))
            if len(drawn) == experts:
                break
        touched = len(drawn)
    return spec.routed_expert_bytes * touched / experts
