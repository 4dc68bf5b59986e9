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

The other faults of a deployed server (sleep, aborts, stale gauges, a counter reset) are
in ``faults``; ``simulation`` applies them by phase.

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

from vllm_triage.simulator.faults import EngineFaults
from vllm_triage.simulator.spec import Arrival, ServerSpec, SizeDistribution, Workload
from vllm_triage.simulator.stats import EngineStats, RequestRecord
from vllm_triage.simulator.step import Request, Step, experts_read, step_floor

__all__ = ["Arrival", "Engine", "ServerSpec", "SizeDistribution", "Workload"]


class Engine(EngineFaults):
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
        self._pending: deque[Request] = deque()  # submitted, not yet arrived at _now
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._free_blocks = spec.num_gpu_blocks
        self._inflight: Step | None = None
        self._next_spec: ServerSpec | None = None
        # Expert routing and draft acceptance: seeded, so runs repeat exactly.
        self._rng = random.Random("vllm-triage/engine")
        #: While hung: when it hung, and the gauges as they were then.
        self._hung: tuple[float, int, int, float] | None = None
        #: 0 awake, else the sleep level; and a sleep asked for, taken after the step.
        self.sleep_level = 0
        self._sleep_asked = 0
        #: The gauges as they were when the engine fell asleep, or when they went stale.
        self._asleep: tuple[int, int, float] | None = None
        self._stale: tuple[int, int, float] | None = None
        self._abort_asked = 0.0  # the share of requests to abort after the step in flight

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
        frozen = self._asleep or self._stale
        return len(self._running) if frozen is None else frozen[0]

    @property
    def num_waiting(self) -> int:
        if self._hung is not None:
            return self._hung[2]
        frozen = self._asleep or self._stale
        return self._queued() if frozen is None else frozen[1]

    @property
    def kv_usage(self) -> float:
        """Used blocks / all blocks, as ``vllm:kv_cache_usage_perc`` (a fraction, not %)."""
        if self._hung is not None:
            return self._hung[3]
        frozen = self._asleep or self._stale
        return 1.0 - self._free_blocks / self.spec.num_gpu_blocks if frozen is None else frozen[2]

    def _gauges(self) -> tuple[int, int, float]:
        return self.num_running, self.num_waiting, self.kv_usage

    def _queued(self) -> int:
        arrived = sum(1 for r in self._pending if r.arrival <= self._horizon)
        return len(self._waiting) + arrived

    @property
    def published_load(self) -> tuple[int, int]:
        """(waiting, running) as the engine last reported them to the API server's load
        balancer: its real queue while it steps (stale gauges or not, the scheduler's
        counts are right), what it last said while hung or asleep."""
        if self._hung is not None:
            return self._hung[2], self._hung[1]
        if self._asleep is not None:
            return self._asleep[1], self._asleep[0]
        return self._queued(), len(self._running)

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
        self._pending.append(Request(arrival, prompt, output))

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
        while self._hung is None and not self.asleep:
            step = self._inflight
            if step is not None:
                if step.end > t:
                    break
                self._inflight = None
                self._commit(step)
                self._now = step.end
                if self._abort_asked:
                    self._apply_abort(self._now)
                if self._sleep_asked:
                    self._fall_asleep()
                    break
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

    def _schedule(self) -> Step:
        spec = self.spec
        block = spec.block_size
        budget = spec.max_num_batched_tokens
        running = self._running
        prefill: list[tuple[Request, int]] = []
        decode: list[tuple[Request, int]] = []
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
        floor = step_floor(spec, prefill, decode, self._rng)
        return Step(self._now + (spec.step_overhead_s + floor), prefill, decode, floor)

    def _admit(self, budget: int, prefill: list[tuple[Request, int]]) -> None:
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
                self.stats.queue_start.observe(self._now - req.arrival)
            self._running.append(req)
            chunk = min(target, budget)
            prefill.append((req, chunk))
            budget -= chunk

    def _preempt(self, req: Request) -> None:
        self._free_blocks += req.blocks
        req.blocks = 0
        req.computed = 0
        req.target = 0
        req.preemptions += 1
        self._waiting.appendleft(req)
        self.stats.preemptions += 1

    def _experts_read(self, tokens: int) -> float:
        """``step.experts_read`` with this engine's spec and random stream."""
        return experts_read(self.spec, tokens, self._rng)

    # -- outputs -------------------------------------------------------------------------

    def _commit(self, step: Step) -> None:
        end = step.end
        stats = self.stats
        finished = False
        emitted = prompts = 0
        for req, chunk in step.prefill:
            req.computed += chunk
            stats.prefill_computed += chunk
            if req.computed == req.target:
                prompts += req.prompt if req.first_token is None else 0
                finished |= self._emit(req, end, 1)
                emitted += 1
        firsts = emitted
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
        stats.last_step_s = end - self._now
        decoding = len(step.decode)
        stats.last_step_tokens = (emitted - firsts) / decoding if decoding else 1.0
        stats.steps += 1
        stats.busy_s += end - self._now
        stats.floor_s += step.floor
        stats.decode_floor_s += len(step.decode) * step.floor
        stats.decode_step_s += len(step.decode) * (end - self._now)

    def _emit(self, req: Request, at: float, count: int) -> bool:
        """``count`` output tokens for ``req`` at ``at`` (one inter-token latency: they
        come out of one step); True when that finished it."""
        stats = self.stats
        req.generated += count
        stats.generation_tokens += count
        if req.first_token is None:
            req.first_token = at
            stats.prompt_tokens += req.prompt
            stats.ttft.observe(at - req.sent)
        else:
            itl = at - req.last_token
            stats.itl.observe(itl)
            if count > 1:
                stats.itl_multi.observe(itl)
                for _ in range(count):
                    stats.itl_per_token.observe(itl / count)
            if self._keep_records:
                req.itl.append(itl)
        req.last_token = at
        if req.generated < req.output:
            return False
        self._free_blocks += req.blocks
        req.blocks = 0
        scheduled = req.scheduled if req.scheduled is not None else req.arrival
        stats.e2e.observe(at - req.sent)
        stats.queue.observe(scheduled - req.arrival)
        stats.prefill.observe(req.first_token - scheduled)
        stats.decode.observe(at - req.first_token)
        stats.request_prompt_tokens.observe(req.prompt)
        stats.request_generation_tokens.observe(req.generated)
        stats.finished[req.reason] += 1
        stats.ttft_finish.observe(req.first_token - req.sent)
        if req.generated > 1:
            stats.tpot.observe((at - req.first_token) / (req.generated - 1))
        stats.prompt_tokens_finished += req.prompt
        stats.generation_tokens_finished += req.generated
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
                    req.sent,
                )
            )
        return True

    def _apply_spec(self, spec: ServerSpec) -> None:
        used = self.spec.num_gpu_blocks - self._free_blocks
        self.spec = spec
        self._next_spec = None
        self._free_blocks = spec.num_gpu_blocks - used

        def fits(req: Request) -> bool:
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
