"""A virtual-time model of one vLLM V1 engine: continuous batching, chunked prefill, KV blocks.

Why a model and not a recording: the daemon's whole claim is the physics of
``docs/physics.md`` (prefill is compute-bound, decode is bandwidth-bound, the KV
pool is a fixed number of blocks), so its tests need payloads whose numbers *follow* that
physics under any load we choose, not only the loads someone happened to capture.

Each step, as vLLM V1's scheduler does it:

1. running requests, oldest admission first, take tokens from the step's budget
   (``max_num_batched_tokens``): one each while decoding, a chunk while prefilling
   (chunked prefill). A decoding request that crosses a block boundary needs a new KV
   block; with none free, the most recently admitted running request is preempted: its
   blocks are freed and it goes back to the front of the queue, to recompute
   prompt + generated tokens later (the mid-stream stall users see);
2. if nothing was preempted, waiting requests are admitted first come, first served,
   while ``running < max_num_seqs``, budget is left and the pool has blocks for the
   request's whole prefill.

An engine can also hang (``hang``/``resume``), as a real one does when a collective waits
for a peer that never comes: it stops stepping, the step in flight finishes only after
``resume``, requests keep arriving, and what a scrape sees is frozen at the last update
(vLLM writes its gauges and counters only when a step completes).

The step lasts ``step_overhead + max(compute, memory)``: compute is 2 x parameters FLOPs
per token plus the attention term 4 x layers x hidden per (query, key) pair, at
``compute_efficiency`` x the card's dense bf16 rate; memory is every weight plus the KV of
every scheduled token's context, at the card's bandwidth. Tokens come out at the end of
the step. Time is virtual (no clock, no sleeps) and randomness is a seeded
``random.Random``, so the same inputs always give the same metrics.

Two refinements model what the decode step roofline must account for
(``docs/physics.md``, "The decode roofline"):

- **Mixture of experts.** ``routed_expert_bytes`` are read only for the experts the
  step's tokens are routed to: each token draws ``experts_per_token`` of
  ``num_experts`` at random (uniform routing), and the step reads the distinct experts
  drawn, so a batch reads more of them than one token does.
- **Speculative decoding.** A decoding request verifies ``num_speculative_tokens`` draft
  tokens: the step computes 1 + k tokens for it, and draft position i is accepted with
  probability ``draft_acceptance`` if every earlier one was (a chain draft). It emits the
  accepted tokens plus one, at one instant: one inter-token latency sample per step, as
  vLLM observes it. The step also runs k draft forwards one after the other, each reading
  ``draft_weight_bytes``. vLLM's ``spec_decode_*`` counters count what happened.

The engine keeps its own truth: ``EngineStats.floor_s`` (each step without its overhead)
and, weighted by the decoding requests of each step as the ITL histogram weighs them,
``decode_floor_s`` and ``decode_step_s``.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from vllm_triage.simulator.stats import EngineStats, FinishedReason, RequestRecord

SizeDistribution = Literal["uniform", "lognormal"]


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One vLLM server: the card's two limits, the model's bytes and FLOPs, vLLM's caps.

    Plain numbers on purpose (``vllm_triage.ceiling.hardware`` has a GPU table): ``weight_bytes`` is
    what one decode step reads (per GPU under tensor parallelism, active experts only for
    a mixture of experts), ``parameters`` what one token multiplies through.
    """

    memory_bandwidth_gb_s: float
    compute_tflops: float
    weight_bytes: float
    parameters: float
    kv_bytes_per_token: float
    num_layers: int = 32
    hidden_size: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    num_gpu_blocks: int = 8192
    block_size: int = 16
    max_model_len: int = 8192
    compute_efficiency: float = 0.5
    step_overhead_s: float = 0.002
    kv_watermark: float = 0.01
    gpu_memory_utilization: float = 0.9
    #: The card's name in rules/gpus.yaml, when the spec was built from the table.
    gpu: str = ""
    #: Mixture of experts: all routed experts' bytes (``weight_bytes`` is the rest), read
    #: for the distinct experts a step's tokens are routed to.
    routed_expert_bytes: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    #: Speculative decoding: draft tokens per step (k), each accepted with probability
    #: ``draft_acceptance`` after an accepted one; the draft model's bytes and parameters.
    num_speculative_tokens: int = 0
    draft_acceptance: float = 0.0
    draft_weight_bytes: float = 0.0
    draft_parameters: float = 0.0
    draft_kv_bytes_per_token: float = 0.0

    def __post_init__(self) -> None:
        positive = (
            self.memory_bandwidth_gb_s,
            self.compute_tflops,
            self.weight_bytes,
            self.parameters,
            self.kv_bytes_per_token,
            self.compute_efficiency,
        )
        if min(positive) <= 0:
            raise ValueError("bandwidth, compute, weights, parameters and KV bytes must be > 0")
        counts = (self.num_layers, self.hidden_size, self.max_num_seqs, self.num_gpu_blocks)
        if min(counts) < 1 or self.block_size < 1 or self.max_model_len < 2:
            raise ValueError("layers, hidden size, seqs, blocks and lengths must be positive")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs (as vLLM requires)")
        if self.kv_pool_tokens < self.max_model_len:
            # vLLM refuses to start here too: one full-length request could never run.
            raise ValueError("the KV pool must hold at least one max_model_len request")
        if not 0 <= self.kv_watermark < 1 or self.step_overhead_s < 0:
            raise ValueError("kv_watermark must be in [0, 1) and step_overhead_s >= 0")
        if self.routed_expert_bytes < 0 or (self.routed_expert_bytes > 0) != (
            0 < self.experts_per_token <= self.num_experts
        ):
            raise ValueError("routed experts need 1 <= experts_per_token <= num_experts")
        draft = (self.draft_weight_bytes, self.draft_parameters, self.draft_kv_bytes_per_token)
        if self.num_speculative_tokens < 0 or min(draft) < 0:
            raise ValueError("speculative tokens and draft sizes must be >= 0")
        if not 0 <= self.draft_acceptance < 1:
            raise ValueError("draft_acceptance must be in [0, 1)")

    @property
    def kv_pool_tokens(self) -> int:
        """Tokens the KV pool holds: ``num_gpu_blocks x block_size``."""
        return self.num_gpu_blocks * self.block_size

    @property
    def decode_ceiling_tokens_per_s(self) -> float:
        """The single-stream ceiling (docs/physics.md): bandwidth / weight bytes."""
        return self.memory_bandwidth_gb_s * 1e9 / self.weight_bytes


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request as the client sends it: when, how long the prompt, how many tokens back."""

    at_s: float
    prompt_tokens: int
    output_tokens: int
    finished_reason: FinishedReason = "length"


@dataclass(frozen=True, slots=True)
class Workload:
    """Traffic for one phase: Poisson arrivals and/or a burst at the phase's start.

    Prompt and output lengths scatter around their means by ``spread``: uniform in
    mean x [1 - spread, 1 + spread], or lognormal with sigma = spread and the same mean.
    ``stop_fraction`` of requests end on a stop token (``finished_reason="stop"``), the
    rest at their length limit.
    """

    arrival_rate_per_s: float = 0.0
    prompt_tokens: int = 512
    output_tokens: int = 128
    spread: float = 0.25
    distribution: SizeDistribution = "uniform"
    burst: int = 0
    stop_fraction: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arrival_rate_per_s < 0 or self.burst < 0:
            raise ValueError("arrival rate and burst must be >= 0")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError("prompt and output means must be >= 1 token")
        if self.spread < 0 or (self.distribution == "uniform" and self.spread >= 1):
            raise ValueError("spread must be >= 0 (and < 1 for uniform)")
        if not 0 <= self.stop_fraction <= 1:
            raise ValueError("stop_fraction must be in [0, 1]")

    def arrivals(
        self, start_s: float, end_s: float, *, key: str = "", part: int = 0, parts: int = 1
    ) -> Iterator[Arrival]:
        """Requests arriving in [start_s, end_s), in time order.

        ``part`` of ``parts`` is one data-parallel engine's share: a 1/parts thinning of the
        Poisson stream (still Poisson) and every parts-th request of the burst. ``key``
        separates the random streams of phases and engines; the seed string is hashed
        (SHA-512), so it does not depend on ``PYTHONHASHSEED``.
        """
        rng = random.Random(f"{self.seed}/{key}/{part}/{parts}")
        for index in range(self.burst):
            if index % parts == part:
                yield self._arrival(rng, start_s)
        rate = self.arrival_rate_per_s / parts
        if rate <= 0:
            return
        at = start_s
        while True:
            at += rng.expovariate(rate)
            if at >= end_s:
                return
            yield self._arrival(rng, at)

    def _arrival(self, rng: random.Random, at: float) -> Arrival:
        reason: FinishedReason = "stop" if rng.random() < self.stop_fraction else "length"
        return Arrival(
            at, self._size(rng, self.prompt_tokens), self._size(rng, self.output_tokens), reason
        )

    def _size(self, rng: random.Random, mean: int) -> int:
        if self.spread == 0:
            return mean
        if self.distribution == "uniform":
            factor = rng.uniform(1 - self.spread, 1 + self.spread)
        else:
            factor = math.exp(rng.gauss(-(self.spread**2) / 2, self.spread))
        return max(1, round(mean * factor))


class _Request:
    """A request inside the engine; mutable and private, updated once per step."""

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
        "target",
    )

    def __init__(self, arrival: Arrival, prompt: int, output: int) -> None:
        self.arrival = arrival.at_s
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
class _Step:
    """A scheduled step: decided at its start, its tokens come out at ``end``.

    ``decode`` pairs each decoding request with the draft tokens it verifies; ``floor``
    is the step without its fixed overhead (what the hardware needed).
    """

    end: float
    prefill: list[tuple[_Request, int]]
    decode: list[tuple[_Request, int]]
    floor: float = 0.0


class Engine:
    """One vLLM engine in virtual time: ``submit`` arrivals, ``advance_to`` an instant, read.

    At the instant of the last ``advance_to`` the gauges (``num_running``, ``num_waiting``,
    ``kv_usage``) and ``stats`` are what a scrape would see: a step in flight has been
    scheduled (its admissions, blocks and preemptions happened at its start) but has not
    yet produced its tokens.
    """

    def __init__(self, spec: ServerSpec, *, keep_records: bool = False) -> None:
        self.spec = spec
        #: vLLM sizes the token-count histograms from max_model_len once, at start.
        self.token_buckets_max_len = spec.max_model_len
        self.stats = EngineStats()
        self.records: list[RequestRecord] = []
        self._keep_records = keep_records
        self._now = 0.0  # start of the step in flight, or of the next one
        self._horizon = 0.0  # the instant the gauges describe
        self._pending: deque[_Request] = deque()  # submitted, not yet arrived at _now
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._free_blocks = spec.num_gpu_blocks
        self._inflight: _Step | None = None
        self._next_spec: ServerSpec | None = None
        # Expert routing and draft acceptance: seeded, so runs repeat exactly.
        self._rng = random.Random("vllm-triage/engine")
        #: While hung: when it hung, and the gauges as they were then.
        self._hung: tuple[float, int, int, float] | None = None

    @property
    def now(self) -> float:
        """The virtual instant (seconds since start) the engine's state describes."""
        return self._horizon

    @property
    def hung(self) -> bool:
        return self._hung is not None

    @property
    def num_running(self) -> int:
        if self._hung is not None:
            return self._hung[1]
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        if self._hung is not None:
            return self._hung[2]
        arrived = sum(1 for r in self._pending if r.arrival <= self._horizon)
        return len(self._waiting) + arrived

    @property
    def kv_usage(self) -> float:
        """Used blocks / all blocks, as ``vllm:kv_cache_usage_perc`` (a fraction, not %)."""
        if self._hung is not None:
            return self._hung[3]
        return 1.0 - self._free_blocks / self.spec.num_gpu_blocks

    def hang(self) -> None:
        """Stop stepping at ``now``: gauges and counters stay as they are until ``resume``."""
        if self._hung is None:
            self._hung = (self._horizon, self.num_running, self.num_waiting, self.kv_usage)

    def resume(self) -> None:
        """Step again from ``now``: the step that was in flight when the engine hung takes
        the rest of its time from here, and what arrived meanwhile is scheduled."""
        if self._hung is None:
            return
        shift = self._horizon - self._hung[0]
        self._hung = None
        if self._inflight is not None:
            self._inflight.end += shift
            self._now += shift
        else:
            self._now = max(self._now, self._horizon)

    def submit(self, arrival: Arrival) -> None:
        """Queue a request; arrivals come in time order, none before ``now``.

        Lengths are cut to fit ``max_model_len`` (vLLM would reject a longer prompt and cap
        ``max_tokens``); the simulator keeps the request instead.
        """
        last = self._pending[-1].arrival if self._pending else self._horizon
        if arrival.at_s < last:
            raise ValueError(f"arrival at {arrival.at_s} is before {last}: submit in time order")
        limit = (self._next_spec or self.spec).max_model_len
        prompt = max(1, min(arrival.prompt_tokens, limit - 1))
        output = max(1, min(arrival.output_tokens, limit - prompt))
        self._pending.append(_Request(arrival, prompt, output))

    def reconfigure(self, spec: ServerSpec) -> None:
        """Swap the server under the running engine (takes effect at the next step).

        No real server does this; ``scenarios`` uses it so one recording can walk through
        causes that need different hardware. Requests that no longer fit ``max_model_len``
        are aborted; if the pool shrank below what is in use, the newest are preempted.
        """
        self._next_spec = spec

    def advance_to(self, t: float) -> None:
        """Run every step that starts before ``t``; steps that end by ``t`` produce tokens."""
        if t < self._horizon:
            raise ValueError(f"time runs forward: {t} < {self._horizon}")
        while self._hung is None:
            step = self._inflight
            if step is not None:
                if step.end > t:
                    break
                self._inflight = None
                self._commit(step)
                self._now = step.end
            if self._next_spec is not None:
                self._apply_spec(self._next_spec)
            while self._pending and self._pending[0].arrival <= self._now:
                self._waiting.append(self._pending.popleft())
            if not self._running and not self._waiting:
                if not self._pending or self._pending[0].arrival > t:
                    break
                # max: after a hang, requests that arrived meanwhile start at the resume.
                self._now = max(self._now, self._pending[0].arrival)
                continue
            self._inflight = self._schedule()
        self._horizon = t

    # -- scheduling ----------------------------------------------------------------------

    def _schedule(self) -> _Step:
        spec = self.spec
        block = spec.block_size
        budget = spec.max_num_batched_tokens
        running = self._running
        prefill: list[tuple[_Request, int]] = []
        decode: list[tuple[_Request, int]] = []
        preempted = False
        index = 0
        while index < len(running) and budget > 0:
            req = running[index]
            if req.computed < req.target:  # still prefilling: next chunk
                chunk = min(req.target - req.computed, budget)
                prefill.append((req, chunk))
                budget -= chunk
            else:  # decoding: one token plus its drafts, maybe more blocks
                drafts = min(
                    spec.num_speculative_tokens, budget - 1, req.output - req.generated - 1
                )
                drafts = max(drafts, 0)
                needed = -(-(req.computed + 1 + drafts) // block)
                while req.blocks < needed:
                    if self._free_blocks > 0:
                        self._free_blocks -= 1
                        req.blocks += 1
                        continue
                    victim = running.pop()  # most recently admitted, not yet scheduled
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        break
                if req.blocks < needed:
                    break
                decode.append((req, drafts))
                budget -= 1 + drafts
            index += 1
        if not preempted:  # as vLLM V1: no admissions in a step that preempted
            self._admit(budget, prefill)
        if not prefill and not decode:
            raise RuntimeError("scheduler stalled: a waiting request can never be admitted")
        floor = self._floor(prefill, decode)
        return _Step(self._now + (spec.step_overhead_s + floor), prefill, decode, floor)

    def _admit(self, budget: int, prefill: list[tuple[_Request, int]]) -> None:
        spec = self.spec
        watermark = int(spec.kv_watermark * spec.num_gpu_blocks)
        while self._waiting and budget > 0 and len(self._running) < spec.max_num_seqs:
            req = self._waiting[0]
            target = req.prompt + req.generated  # a preempted request recomputes its output
            needed = -(-target // spec.block_size)
            # The watermark keeps room for decodes to grow; an empty engine ignores it.
            reserve = watermark if self._running else 0
            if self._free_blocks - needed < reserve:
                break
            self._waiting.popleft()
            self._free_blocks -= needed
            req.blocks = needed
            req.target = target
            req.computed = 0
            if req.scheduled is None:
                req.scheduled = self._now
            self._running.append(req)
            chunk = min(target, budget)
            prefill.append((req, chunk))
            budget -= chunk

    def _preempt(self, req: _Request) -> None:
        self._free_blocks += req.blocks
        req.blocks = 0
        req.computed = 0
        req.target = 0
        req.preemptions += 1
        self._waiting.appendleft(req)
        self.stats.preemptions += 1

    def _floor(
        self, prefill: list[tuple[_Request, int]], decode: list[tuple[_Request, int]]
    ) -> float:
        """``max(FLOPs / compute, bytes / bandwidth)`` of the target's forward, plus the
        draft forwards (one per draft token, one after the other): the step without its
        fixed overhead."""
        spec = self.spec
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
        weights = spec.weight_bytes + self._experts_read(tokens)
        memory_s = (weights + spec.kv_bytes_per_token * context) / bandwidth
        floor = max(flops / compute, memory_s)
        draft_len = max((d for _, d in decode), default=0)
        if draft_len:
            # Each draft forward reads the draft's weights and its KV of every drafter.
            draft_bytes = spec.draft_weight_bytes + spec.draft_kv_bytes_per_token * drafted_context
            forward = max(draft_bytes / bandwidth, 2 * spec.draft_parameters * drafting / compute)
            floor += draft_len * forward
        return floor

    def _experts_read(self, tokens: int) -> float:
        """Bytes of the routed experts the step's ``tokens`` are routed to: each draws
        ``experts_per_token`` distinct experts uniformly; the step reads every expert drawn
        at least once (one layer drawn, standing for every MoE layer)."""
        spec = self.spec
        if spec.routed_expert_bytes <= 0:
            return 0.0
        experts, k = spec.num_experts, spec.experts_per_token
        if tokens * k >= 40 * experts:
            touched = experts  # missing one expert has odds below e**-40 per expert
        else:
            drawn: set[int] = set()
            pool = range(experts)
            for _ in range(tokens):
                drawn.update(self._rng.sample(pool, k))
                if len(drawn) == experts:
                    break
            touched = len(drawn)
        return spec.routed_expert_bytes * touched / experts

    # -- outputs -------------------------------------------------------------------------

    def _commit(self, step: _Step) -> None:
        end = step.end
        stats = self.stats
        finished = False
        emitted = prompts = 0
        for req, chunk in step.prefill:
            req.computed += chunk
            if req.computed == req.target:
                prompts += req.prompt if req.first_token is None else 0
                finished |= self._emit(req, end, 1)
                emitted += 1
        # A plain token mid-answer is the hot path (a step of a large batch has hundreds):
        # it is ``_emit`` inlined, one ITL observation, the same arithmetic in the same
        # order (so the same sums, to the last bit); first and last tokens, and steps with
        # drafts, go through ``_emit``.
        itl = stats.itl
        bounds, counts = itl.bounds, itl.counts
        seen, index = math.nan, 0
        inline = not self._keep_records
        for req, drafts in step.decode:
            plain = not drafts and req.first_token is not None
            if inline and plain and req.generated + 1 < req.output:
                req.computed += 1
                req.generated += 1
                stats.generation_tokens += 1
                value = end - req.last_token
                if value != seen:  # most of a step's requests share their last token's time
                    seen, index = value, bisect.bisect_left(bounds, value)
                counts[index] += 1
                itl.sum += value
                itl.count += 1
                req.last_token = end
                emitted += 1
                continue
            accepted = 0
            while accepted < drafts and self._rng.random() < self.spec.draft_acceptance:
                accepted += 1
            if drafts:
                stats.spec_drafts += 1
                stats.spec_draft_tokens += drafts
                stats.spec_accepted_tokens += accepted
                for position in range(accepted):
                    stats.spec_accepted_per_position[position] = (
                        stats.spec_accepted_per_position.get(position, 0) + 1
                    )
            # The KV of the input token and of the accepted drafts is now cached; the
            # step emits the accepted drafts plus the target's own next token.
            req.computed += 1 + accepted
            count = min(1 + accepted, req.output - req.generated)
            finished |= self._emit(req, end, count)
            emitted += count
        if finished:
            self._running = [r for r in self._running if r.generated < r.output]
        # As vLLM: prompt tokens of the prefills completed in the step plus its output.
        stats.iteration_tokens.observe(prompts + emitted)
        stats.steps += 1
        stats.busy_s += end - self._now
        stats.floor_s += step.floor
        stats.decode_floor_s += len(step.decode) * step.floor
        stats.decode_step_s += len(step.decode) * (end - self._now)

    def _emit(self, req: _Request, at: float, count: int) -> bool:
        """``count`` output tokens for ``req`` at ``at`` (one inter-token latency: they
        come out of one step); True when that finished it."""
        stats = self.stats
        req.generated += count
        stats.generation_tokens += count
        if req.first_token is None:
            req.first_token = at
            stats.prompt_tokens += req.prompt
            stats.ttft.observe(at - req.arrival)
        else:
            itl = at - req.last_token
            stats.itl.observe(itl)
            if self._keep_records:
                req.itl.append(itl)
        req.last_token = at
        if req.generated < req.output:
            return False
        self._free_blocks += req.blocks
        req.blocks = 0
        scheduled = req.scheduled if req.scheduled is not None else req.arrival
        stats.e2e.observe(at - req.arrival)
        stats.queue.observe(scheduled - req.arrival)
        stats.prefill.observe(req.first_token - scheduled)
        stats.decode.observe(at - req.first_token)
        stats.request_prompt_tokens.observe(req.prompt)
        stats.request_generation_tokens.observe(req.generated)
        stats.finished[req.reason] += 1
        if self._keep_records:
            self.records.append(
                RequestRecord(
                    req.arrival,
                    scheduled,
                    req.first_token,
                    at,
                    req.prompt,
                    req.generated,
                    req.preemptions,
                    req.reason,
                    tuple(req.itl),
                )
            )
        return True

    def _apply_spec(self, spec: ServerSpec) -> None:
        used = self.spec.num_gpu_blocks - self._free_blocks
        self.spec = spec
        self._next_spec = None
        self._free_blocks = spec.num_gpu_blocks - used

        def fits(req: _Request) -> bool:
            if req.prompt + req.output <= spec.max_model_len:
                return True
            self._free_blocks += req.blocks
            self.stats.finished["abort"] += 1
            return False

        self._running = [r for r in self._running if fits(r)]
        self._waiting = deque(r for r in self._waiting if fits(r))
        self._pending = deque(r for r in self._pending if fits(r))
        while self._free_blocks < 0:
            self._preempt(self._running.pop())
