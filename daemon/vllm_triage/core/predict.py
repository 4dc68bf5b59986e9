"""What each fix would do, predicted from the window it was diagnosed in (``docs/physics.md``,
"Predicted effects").

Two pieces of physics, both fed by what the evaluation already measured:

- **The decode step** is its per-step overhead plus its floor (``core.roofline``): the
  overhead is the measured step minus the floor, and a change of bytes (a KV cache or
  weights in fewer bits, the weights spread over more GPUs) or of bandwidth moves only
  the floor. The overhead is taken to stay as it was (it is the host's: scheduling,
  launches, sampling), and ITL percentiles to scale with the mean step.
- **The queue** is graded by its load ratio: arrivals over the service capacity the
  window measured (``queue_state``). At rho = 1 the backlog grows like √t, so a slope test
  would say "fine" at the worst moment; the ratio is judged against its own noise, about
  1/√(arrivals in the window).

Fixes are matched to a change by what their text sets (``CHANGES``); a fix that sets
nothing (a check, a procedure) or whose new value is not said gets a ``why`` instead of a
number. Pure: the same signals and rulebook give the same effects.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from vllm_triage.core.model import Cause, ChangeValue, RemediationEffect, Signals
from vllm_triage.core.roofline.step import StepRoofline
from vllm_triage.core.rulebook import Roofline

#: The changes ``vllm-triage whatif`` takes, and what each means.
CHANGE_KEYS: Mapping[str, str] = {
    "kv_cache_dtype": "KV cache precision (fp8)",
    "dtype": "weight precision (fp8, int8, int4, bfloat16, ...)",
    "max_num_seqs": "vLLM's --max-num-seqs (an integer >= 1)",
    "max_num_batched_tokens": "vLLM's --max-num-batched-tokens (an integer >= 1)",
    "tensor_parallel_size": "GPUs the model is split over (an integer >= 1)",
    "replicas": "identical servers the load is split over (an integer >= 1)",
    "gpu": "a card of rules/gpus.yaml",
    "arrival_rate_scale": "arrivals multiplied by this (a number > 0)",
}

#: Bytes per weight (and per KV element) of the precisions a fix names; the 4-bit ones
#: leave out their scales, as the card table's sizing does.
BYTES_PER_ELEMENT: Mapping[str, float] = {
    "fp32": 4.0,
    "float32": 4.0,
    "bf16": 2.0,
    "bfloat16": 2.0,
    "fp16": 2.0,
    "float16": 2.0,
    "auto": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}

#: How wide a decode-step prediction's range is: the overhead held constant and the
#: percentiles scaled with the mean are each good to about this (docs/physics.md).
STEP_UNCERTAINTY = 0.15

QueueRegime = Literal["stable", "backlogged", "overloaded"]


@dataclass(frozen=True, slots=True)
class Queue:
    """The window's load against what the server served: ``load_ratio`` (rho) is arrivals
    over capacity, ``noise`` about 1/√arrivals, ``regime`` rho graded against that noise,
    and ``replicas_needed`` the identical servers that bring each one's rho below 1 by more
    than the noise."""

    arrivals_per_second: float
    capacity_per_second: float
    capacity_source: str
    load_ratio: float
    noise: float
    regime: QueueRegime
    replicas_needed: int
    seats: float | None


def arrivals_per_second(s: Signals) -> float | None:
    """Requests that arrived per second: those that got a first token plus the growth of
    the queue (what waited at the end and not at the start)."""
    if s.span_seconds <= 0 or (s.ttft_count <= 0 and not s.waiting_last):
        return None
    grew = 0.0
    if s.waiting_first is not None and s.waiting_last is not None:
        grew = s.waiting_last - s.waiting_first
    return max(0.0, s.ttft_count + grew) / s.span_seconds


def _lifetime(s: Signals) -> float | None:
    """Seconds a request holds a seat: its prefill and its decode, as the window saw them."""
    if s.prefill_time_mean is None or s.decode_time_mean is None:
        return None
    life = s.prefill_time_mean + s.decode_time_mean
    return life if life > 0 else None


def kv_seats(s: Signals) -> float | None:
    """Requests the KV pool holds at their final size."""
    if not s.kv_pool_tokens or s.mean_prompt_tokens is None or s.mean_generation_tokens is None:
        return None
    footprint = s.mean_prompt_tokens + s.mean_generation_tokens
    return s.kv_pool_tokens / footprint if footprint > 0 else None


def queue_state(s: Signals) -> Queue | None:
    """The load ratio, its regime and the replicas needed; ``None`` without arrivals.

    Capacity, best first: requests waited all window long, so the server admitted as
    fast as it could and the admission rate *is* its capacity; else the seats it can
    hold (the most that ran while some waited, else what the KV pool holds) over the
    time each request holds one.
    """
    arrivals = arrivals_per_second(s)
    if arrivals is None or arrivals <= 0:
        return None
    admitted = s.ttft_count / s.span_seconds
    life = _lifetime(s)
    seats: float | None = None
    if (s.waiting_max or 0.0) > 0 and s.running_max:
        seats = s.running_max
    pool = kv_seats(s)
    if pool is not None:
        seats = pool if seats is None else min(seats, pool)
    if (s.waiting_max or 0.0) <= 0 and s.running_max and seats is not None:
        # Nothing waited: the server held every request it was sent, so it has at least
        # the seats that ran (the pool's count is of finished sizes, not of mid-life ones).
        seats = max(seats, s.running_max)
    if (s.waiting_min or 0.0) > 0 and admitted > 0:
        capacity, source = admitted, "admissions while requests waited all window"
    elif seats is not None and life is not None:
        capacity, source = seats / life, "seats over the time a request holds one"
    else:
        return None
    if capacity <= 0:
        return None
    ratio = arrivals / capacity
    noise = 1.0 / math.sqrt(max(1.0, arrivals * s.span_seconds))
    regime: QueueRegime
    if ratio > 1.0 + noise:
        regime = "overloaded"
    elif ratio >= 1.0 - noise or (s.waiting_min or 0.0) > 0 or _queue_grew(s):
        # At capacity within the noise the queue random-walks and grows like √t; a queue
        # that never emptied is backlogged whatever the ratio says.
        regime = "backlogged"
    else:
        regime = "stable"
    needed = max(1, math.ceil(ratio * (1.0 + noise)))
    return Queue(arrivals, capacity, source, ratio, noise, regime, needed, seats)


def _queue_grew(s: Signals) -> bool:
    """The queue ended the window longer than it began it, and not empty."""
    first, last = s.waiting_first, s.waiting_last
    return first is not None and last is not None and last > max(first, 0.0) and last >= 1


def queue_evidence(q: Queue | None) -> dict[str, float | int | str]:
    if q is None:
        return {}
    return {
        "load_ratio": round(q.load_ratio, 3),
        "load_ratio_noise": round(q.noise, 3),
        "queue_regime": q.regime,
        "replicas_needed": q.replicas_needed,
        "arrivals_per_second": round(q.arrivals_per_second, 4),
        "service_capacity_per_second": round(q.capacity_per_second, 4),
    }


# -- the decode step ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepChange:
    """A change of the step's physics: factors on the weight and KV bytes per GPU, on the
    FLOPs per GPU, and on the bandwidth and compute."""

    weights: float = 1.0
    kv: float = 1.0
    flops: float = 1.0
    bandwidth: float = 1.0
    compute: float = 1.0


def predicted_step(
    r: StepRoofline, hw: Roofline, change: StepChange, *, batch_follows_step: bool = False
) -> float | None:
    """The mean decode step after ``change``: the overhead (measured step minus floor)
    as it was, the floor scaled by the changed terms. ``None`` when a term the change
    moves is unknown.

    ``batch_follows_step``: the queue is stable, so the batch is what arrives while a
    request is served (Little's law: running = arrivals x time in service, and the time
    is its tokens x the step). A shorter step then also means fewer running requests,
    whose KV reads and FLOPs shrink with it: the step is the fixed point of
    ``step = overhead + floor(batch x step / step now)``. With a full queue (a seat cap
    or a full pool) the batch stays where it is.
    """
    if r.weight_bytes is None and change.weights != 1.0:
        return None
    if r.kv_bytes is None and change.kv != 1.0:
        return None
    bandwidth = hw.memory_bandwidth_gb_s * 1e9 * hw.achievable_fraction
    compute = (hw.compute_tflops or 0.0) * 1e12
    weights, kv = r.weight_bytes or 0.0, r.kv_bytes or 0.0
    if r.bytes_from_vllm and r.vllm_bytes is not None and weights + kv <= 0:
        return None
    memory_s = (weights + kv) / bandwidth
    flops_s = (r.flops or 0.0) / compute if compute > 0 else 0.0
    if max(memory_s, flops_s) <= 0:
        return None
    overhead = max(0.0, r.step_seconds - r.floor_seconds)
    # The floor is a mix of steps: the compute-bound ones (prefill chunks, large batches)
    # scale with FLOPs, the memory-bound ones with bytes, the draft's stays.
    computing = min(r.compute_bound_seconds, r.floor_seconds)
    reading = max(0.0, r.floor_seconds - computing - r.draft_seconds)

    def step_at(batch: float) -> float:
        memory = (weights * change.weights + kv * change.kv * batch) / (
            bandwidth * change.bandwidth
        )
        read = reading * memory / memory_s if memory_s > 0 else reading
        # A compute-bound step's FLOPs are mostly its prompt tokens: the batch's decode
        # tokens do not move them much, so only the change scales them.
        comp = computing * change.flops / change.compute
        return overhead + read + comp + r.draft_seconds

    step = step_at(1.0)
    if batch_follows_step:
        for _ in range(FIXED_POINT_ROUNDS):
            step = 0.5 * step + 0.5 * step_at(step / r.step_seconds)
    return step


def step_after(
    r: StepRoofline, hw: Roofline, change: StepChange, queue: Queue | None
) -> float | None:
    """``predicted_step``, with the batch following the step where the queue is stable
    after the change: a shorter step serves more, so a load that fit before fits better
    (``load_ratio`` x step after / step now below 1 by more than the noise)."""
    after = predicted_step(r, hw, change)
    if after is None or queue is None:
        return after
    if queue.load_ratio * after / r.step_seconds < 1.0 - queue.noise:
        return predicted_step(r, hw, change, batch_follows_step=True)
    return after


#: Rounds of the damped fixed-point iteration in ``predicted_step``: each halves the
#: distance to the fixed point, so 40 leave nothing a millisecond can show.
FIXED_POINT_ROUNDS = 40


# -- fixes to changes -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Match:
    label: str
    pattern: re.Pattern[str]
    key: str  # the change key, or "" for a fix that sets nothing


#: What a fix's text sets, first match wins (rules/remediation.yaml's wording).
CHANGES: tuple[_Match, ...] = (
    _Match("FP8 KV cache", re.compile(r"kv-cache-dtype fp8", re.I), "kv_cache_dtype"),
    _Match("FP8 weights", re.compile(r"quantize the weights", re.I), "dtype"),
    _Match(
        "more tensor parallelism",
        re.compile(r"tensor-parallel-size|more tensor parallelism", re.I),
        "tensor_parallel_size",
    ),
    _Match("more replicas", re.compile(r"add replicas", re.I), "replicas"),
    _Match("more sequences", re.compile(r"raise --max-num-seqs", re.I), "max_num_seqs"),
    _Match("fewer sequences", re.compile(r"fewer sequences per step", re.I), "max_num_seqs"),
    _Match("another card", re.compile(r"a card with more", re.I), "gpu"),
    _Match("step budget", re.compile(r"max-num-batched-tokens", re.I), "max_num_batched_tokens"),
    _Match("pool memory", re.compile(r"gpu-memory-utilization", re.I), ""),
)

#: Why a fix that sets nothing has no predicted effect.
NOT_A_CHANGE = "a check or a procedure, not a setting: nothing to predict"


@functools.lru_cache(maxsize=512)
def _label(text: str) -> _Match | None:
    """The change a fix's text names, if any. Remembered: fixes are the rulebook's few
    texts, matched against every pattern for each breached server and tick (a fleet's)."""
    for m in CHANGES:
        if m.pattern.search(text):
            return m
    return None


@dataclass(frozen=True, slots=True)
class _Context:
    s: Signals
    cause: Cause
    breaches: tuple[str, ...]
    roofline: StepRoofline | None
    hw: Roofline | None
    queue: Queue | None


def _itl(c: _Context) -> float | None:
    return c.s.itl_p99.value if c.s.itl_p99 is not None else None


def _ttft(c: _Context) -> float | None:
    return c.s.ttft_p99.value if c.s.ttft_p99 is not None else None


def short_label(fix: str) -> str:
    """A fix's first words, for a fix with no change of its own."""
    head = re.split(r":\s|\.\s|\.$|\(", fix, maxsplit=1)[0].strip()
    if len(head) <= 40:
        return head
    return head[:40].rsplit(" ", 1)[0] + "…"


def _unsized(fix: str, label: str, metric: str, why: str) -> RemediationEffect:
    return RemediationEffect(fix=fix, label=label, change={}, metric=metric, why=why)


def _step_effect(
    fix: str, label: str, change: dict[str, ChangeValue], step_change: StepChange, c: _Context
) -> RemediationEffect:
    """A change of the step's bytes or bandwidth: its effect on the mean step and ITL p99."""
    metric = "itl_p99_seconds"
    if c.roofline is None or c.hw is None:
        return RemediationEffect(
            fix,
            label,
            change,
            metric,
            _itl(c),
            why="no decode step floor: the card or model "
            "is unknown (set hardware.gpu and the model)",
        )
    after = step_after(c.roofline, c.hw, step_change, c.queue)
    if after is None:
        return RemediationEffect(
            fix,
            label,
            change,
            metric,
            _itl(c),
            why="the term it changes is unknown: "
            + ", ".join(c.roofline.left_out or ("see decode_facts_source",)),
        )
    step = c.roofline.step_seconds
    itl = _itl(c)
    scale = after / step
    predicted = itl * scale if itl is not None else None
    return RemediationEffect(
        fix=fix,
        label=label,
        change=change,
        metric=metric,
        now=itl,
        predicted=predicted,
        low=predicted * (1 - STEP_UNCERTAINTY) if predicted is not None else None,
        high=predicted * (1 + STEP_UNCERTAINTY) if predicted is not None else None,
        step_now=step,
        step_predicted=after,
    )


def _queue_metric(c: _Context) -> str:
    """The breached metric a change of capacity acts on: TTFT where it breached, else
    the queue."""
    if "ttft_p99" in c.breaches and c.s.ttft_p99 is not None:
        return "ttft_p99_seconds"
    return "requests_waiting_mean"


#: The 99th percentile of an exponential over its mean (ln 100): the tail assumed for
#: the first-token time of a server below capacity, whose requests no longer wait.
P99_OVER_MEAN = math.log(100.0)


def _unqueued_ttft(c: _Context) -> float | None:
    """Mean TTFT without the queue: the time from being scheduled to the first token,
    plus the API server's render where it is measured. (Not the mean TTFT minus the mean
    queue time: vLLM observes the queue time when a request finishes, so in a surge the
    two cover different requests.)"""
    if c.s.prefill_time_mean is None:
        return None
    return c.s.prefill_time_mean + (c.s.render_time_mean or 0.0)


def _queue_effect(
    fix: str, label: str, change: dict[str, ChangeValue], ratio: float, c: _Context
) -> RemediationEffect:
    """A change of capacity or load that leaves each server at load ratio ``ratio``."""
    metric = _queue_metric(c)
    now = _ttft(c) if metric == "ttft_p99_seconds" else c.s.waiting_mean
    q = c.queue
    assert q is not None
    if ratio >= 1.0 - q.noise:
        return RemediationEffect(
            fix,
            label,
            change,
            metric,
            now,
            why=f"still at or over capacity (load ratio {ratio:.2f}): the queue keeps growing",
        )
    if metric == "requests_waiting_mean":
        return RemediationEffect(fix, label, change, metric, now, 0.0, 0.0, ratio / (1 - ratio))
    base = _unqueued_ttft(c)
    if base is None:
        return RemediationEffect(
            fix, label, change, metric, now, why="prefill time not measured in the window"
        )
    # Below capacity the queue empties: TTFT is the time to prefill, its p99 an
    # exponential tail over its mean; what still waits adds about rho/(1-rho) of it (an
    # M/M/1 mean wait), the high end of the range. Never above what it is now.
    predicted = base * P99_OVER_MEAN
    high = predicted * (1.0 + ratio / (1.0 - ratio))
    if now is not None:
        predicted, high = min(predicted, now), min(high, now)
    return RemediationEffect(
        fix, label, change, metric, now, predicted, min(base, predicted), max(predicted, high)
    )


def _decide(fix: str, c: _Context) -> RemediationEffect:
    m = _label(fix)
    metric = "itl_p99_seconds" if c.cause == "decode_bound" else _queue_metric(c)
    if m is None:
        return _unsized(fix, short_label(fix), metric, NOT_A_CHANGE)
    label, key = m.label, m.key
    if key == "":
        return _unsized(
            fix, label, metric, "the new value is not said: choose one and run vllm-triage whatif"
        )
    if key == "kv_cache_dtype":
        dtype = (c.s.kv_cache.cache_dtype if c.s.kv_cache is not None else "auto").lower()
        if dtype.startswith("fp8"):
            return _unsized(fix, label, metric, "the KV cache is already fp8")
        factor = 1.0 / BYTES_PER_ELEMENT.get(dtype, 2.0)
        if c.cause in ("kv_pressure", "queue_bound") and c.queue is not None:
            return _pool_effect(fix, label, {key: "fp8"}, 1.0 / factor, c)
        return _step_effect(fix, label, {key: "fp8"}, StepChange(kv=factor), c)
    if key == "dtype":
        now = _weight_bytes_per_parameter(c.hw)
        if now is not None and now <= 1.0:
            return _unsized(fix, label, metric, "the weights are 8-bit or smaller already")
        return _step_effect(fix, label, {key: "fp8"}, StepChange(weights=1.0 / (now or 2.0)), c)
    if key == "tensor_parallel_size":
        tp = c.hw.tensor_parallel_size if c.hw is not None else 1
        split = c.hw.kv_split if c.hw is not None and c.hw.kv_split else None
        kv = 0.5 if split is None or split >= 2 * tp else tp / split if split > tp else 1.0
        return _step_effect(fix, label, {key: 2 * tp}, StepChange(weights=0.5, kv=kv, flops=0.5), c)
    if key == "gpu":
        return _unsized(
            fix,
            label,
            metric,
            "which card is not said: run vllm-triage whatif "
            "--change gpu=NAME with a card of rules/gpus.yaml",
        )
    if key == "replicas":
        if c.queue is None:
            return _unsized(fix, label, metric, "no load ratio: arrivals or capacity unmeasured")
        n = max(2, c.queue.replicas_needed)
        return _queue_effect(fix, label, {key: n}, c.queue.load_ratio / n, c)
    if key == "max_num_seqs":
        return _seats_effect(fix, label, c, raise_cap="raise" in fix.lower())
    return _unsized(
        fix,
        label,
        metric,
        "its effect depends on the prompt mix step by step: "
        "run vllm-triage whatif --change max_num_batched_tokens=N",
    )


def _weight_bytes_per_parameter(hw: Roofline | None) -> float | None:
    if hw is None or hw.weight_bytes is None or not hw.active_parameters:
        return None
    if hw.routed_expert_bytes:
        return None  # a mixture's read bytes are not its active parameters' bytes
    return hw.weight_bytes / hw.active_parameters


def kv_bound(s: Signals) -> bool:
    """Whether the KV pool, not the sequence cap, limited the seats: it filled."""
    return (s.kv_usage_max or 0.0) >= KV_FULL


#: KV usage at which the pool, not ``max_num_seqs``, is what holds requests back.
KV_FULL = 0.9


def capacity_after(
    s: Signals,
    q: Queue,
    roofline: StepRoofline | None,
    hw: Roofline | None,
    *,
    seq_cap: float = 1.0,
    pool: float = 1.0,
    kv_bytes: float = 1.0,
) -> float:
    """Requests per second the server serves after its sequence cap is ``seq_cap`` times
    and its KV pool ``pool`` times what they were (and its KV bytes per token
    ``kv_bytes`` times).

    Seats are the most that ran while requests waited; the pool held them at its fullest
    usage, so it holds ``seats / usage`` of such requests. Whichever limit bound (a full
    pool, else the cap) moves the seats; the other caps them. More seats make a longer
    step (each reads its KV), so capacity grows by the seats over the step
    (``predicted_step``); the time a request holds a seat is its tokens times the step.
    """
    seats = q.seats or s.running_max or 0.0
    if seats <= 0:
        return q.capacity_per_second
    usage = s.kv_usage_max or 0.0
    by_pool = seats / usage if usage > 0 else float("inf")
    after = by_pool * pool if kv_bound(s) else min(seats * seq_cap, by_pool * pool)
    gain = after / seats
    step_factor = 1.0
    if roofline is not None and hw is not None:
        step = predicted_step(roofline, hw, StepChange(kv=gain * kv_bytes, flops=gain))
        if step is not None:
            step_factor = step / roofline.step_seconds
    return q.capacity_per_second * gain / step_factor


def _pool_effect(
    fix: str, label: str, change: dict[str, ChangeValue], pool: float, c: _Context
) -> RemediationEffect:
    """A pool ``pool`` times as large (the KV cache in fewer bits): more seats where the
    pool held them back."""
    q = c.queue
    assert q is not None
    mu = capacity_after(c.s, q, c.roofline, c.hw, pool=pool, kv_bytes=1.0 / pool)
    return _queue_effect(fix, label, change, q.arrivals_per_second / mu, c)


def _seats_effect(fix: str, label: str, c: _Context, *, raise_cap: bool) -> RemediationEffect:
    """Twice (or half) the sequences: capacity follows seats over the step they make."""
    metric = "itl_p99_seconds" if c.cause == "decode_bound" else _queue_metric(c)
    q = c.queue
    running = c.s.running_max
    if not running:
        return _unsized(fix, label, metric, "how many requests run is not exposed")
    cap = int(running * 2) if raise_cap else max(1, int(running / 2))
    change: dict[str, ChangeValue] = {"max_num_seqs": cap}
    factor = cap / running
    if not raise_cap:
        # Fewer sequences read less KV per step (the weights are read all the same).
        return _step_effect(fix, label, change, StepChange(kv=factor, flops=factor), c)
    if q is None:
        return _unsized(fix, label, metric, "no load ratio: arrivals or capacity unmeasured")
    if kv_bound(c.s):
        return _unsized(
            fix,
            label,
            metric,
            "the KV pool, not the sequence cap, is full: more sequences would not fit",
        )
    mu = capacity_after(c.s, q, c.roofline, c.hw, seq_cap=factor)
    return _queue_effect(fix, label, change, q.arrivals_per_second / mu, c)


def effects(
    fixes: Sequence[str],
    s: Signals,
    *,
    cause: Cause,
    breaches: tuple[str, ...],
    roofline: StepRoofline | None,
    hw: Roofline | None,
    queue: Queue | None,
) -> tuple[RemediationEffect, ...]:
    """Each fix with its predicted effect on the breached metric, in the fixes' order."""
    c = _Context(s, cause, breaches, roofline, hw, queue)
    return tuple(_decide(fix, c) for fix in fixes)


def unsized(fixes: Sequence[str], metric: str, why: str) -> tuple[RemediationEffect, ...]:
    """Fixes none of which the physics can size (a hung engine's), each saying why."""
    out = []
    for fix in fixes:
        m = _label(fix)
        out.append(_unsized(fix, m.label if m else short_label(fix), metric, why))
    return tuple(out)


def effect_text(e: RemediationEffect) -> str:
    """One line: ``FP8 KV cache: decode step 9.3 → 7.1 ms, ITL p99 18 → 14 ms``."""
    if e.predicted is None:
        return f"{e.label}: no prediction ({e.why})"
    parts = []
    if e.step_now is not None and e.step_predicted is not None:
        step = f"{_num(e.step_now, e.metric)} → {_num(e.step_predicted, e.metric)}"
        parts.append(f"decode step {step}")
    name = METRIC_WORDS.get(e.metric, e.metric)
    now = "?" if e.now is None else _num(e.now, e.metric)
    parts.append(f"{name} {now} → {_num(e.predicted, e.metric)}")
    sized = ", ".join(f"{k}={v}" for k, v in e.change.items() if isinstance(v, int))
    label = f"{e.label} ({sized})" if sized else e.label
    return f"{label}: " + ", ".join(parts)


METRIC_WORDS = {
    "itl_p99_seconds": "ITL p99",
    "ttft_p99_seconds": "TTFT p99",
    "requests_waiting_mean": "waiting",
    "decode_step_seconds": "decode step",
}


def _num(value: float, metric: str) -> str:
    if metric.endswith("_seconds"):
        return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"
    return f"{value:.3g}"


def effect_dict(e: RemediationEffect) -> dict[str, object]:
    out: dict[str, object] = {
        "fix": e.fix,
        "label": e.label,
        "change": dict(e.change),
        "metric": e.metric,
        "now": _r(e.now),
        "predicted": _r(e.predicted),
        "low": _r(e.low),
        "high": _r(e.high),
    }
    if e.why:
        out["why"] = e.why
    if e.step_now is not None:
        out["decode_step_seconds"] = {"now": _r(e.step_now), "predicted": _r(e.step_predicted)}
    return out


def _r(v: float | None) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return float(f"{v:.4g}")


# -- why a change moves what it moves (``whatif``'s one line per change) -------------------


@dataclass(frozen=True, slots=True)
class ServerTerms:
    """The terms of a decode step and of a server's capacity that a change can move, and
    what the load made of them (the replay's measured batch and step)."""

    kv_bytes_per_token: float
    weight_bytes: float
    pool_tokens: float
    max_num_seqs: int
    max_num_batched_tokens: int
    bandwidth_gb_s: float
    compute_tflops: float
    #: Whether the bytes are the model's (False: a nominal server, no card or model facts).
    facts: bool
    running_mean: float | None = None
    step_seconds: float | None = None


def _ratio(new: float, old: float) -> str:
    r = new / old if old else float("inf")
    if math.isclose(r, 0.5, rel_tol=0.02):
        return "halves"
    if math.isclose(r, 2.0, rel_tol=0.02):
        return "doubles"
    return f"multiplies by {r:.2g}"


def _what_it_makes(before: ServerTerms, after: ServerTerms) -> str:
    """What the load made of the change: the batch and the decode step, replay against
    the changed server's run."""
    run0, run1 = before.running_mean, after.running_mean
    step0, step1 = before.step_seconds, after.step_seconds
    if run0 is None or run1 is None or step0 is None or step1 is None:
        return ""
    step = f"{step0 * 1e3:.3g} → {step1 * 1e3:.3g} ms"
    batch = run1 / run0 if run0 > 0 else 1.0
    if batch >= 1.1:
        more = f"admits {batch:.2g}x the batch ({run0:.3g} → {run1:.3g} running)"
        if step1 > step0 * 1.02:
            return f"; but it {more}, and each step reads more: step {step}"
        return f"; it {more}: step {step}"
    if batch <= 0.9:
        return f"; the batch shrinks to {batch:.2g}x ({run0:.3g} → {run1:.3g} running): step {step}"
    return f"; the batch stays at {run1:.3g} running: step {step}"


def _term(key: str, value: ChangeValue, b: ServerTerms, a: ServerTerms) -> tuple[str, bool]:
    """What ``key=value`` moves, and whether that depends on the model's bytes."""
    pool = f"{a.pool_tokens / b.pool_tokens if b.pool_tokens else 1.0:.2g}x the tokens"
    if key == "kv_cache_dtype":
        moved = _ratio(a.kv_bytes_per_token, b.kv_bytes_per_token)
        text = (
            f"KV cache in {value}: {moved} the KV bytes each step reads per token, and "
            f"the pool holds {pool}"
        )
        return text, True
    if key == "dtype":
        moved = _ratio(a.weight_bytes, b.weight_bytes)
        text = (
            f"weights in {value}: {moved} the weight bytes each step reads, and the "
            f"memory freed gives the pool {pool}"
        )
        return text, True
    if key == "tensor_parallel_size":
        weights, kv = a.weight_bytes / b.weight_bytes, a.kv_bytes_per_token / b.kv_bytes_per_token
        text = (
            f"tensor parallelism {value}: each GPU reads {weights:.2g}x the weight bytes "
            f"and {kv:.2g}x the KV bytes per step (the all-reduce between GPUs is not "
            "modelled)"
        )
        return text, True
    if key == "gpu":
        text = (
            f"card {value}: memory bandwidth {b.bandwidth_gb_s:.4g} → "
            f"{a.bandwidth_gb_s:.4g} GB/s (the step's bytes are read that much faster), "
            f"compute {b.compute_tflops:.4g} → {a.compute_tflops:.4g} TFLOPS (the prefill), "
            f"pool {pool}"
        )
        return text, True
    if key == "max_num_seqs":
        text = (
            f"max_num_seqs {value}: the batch cap {b.max_num_seqs} → {a.max_num_seqs} "
            "sequences per step: more sequences share each step's weight reads and each adds "
            "its KV reads"
        )
        return text, False
    if key == "max_num_batched_tokens":
        text = (
            f"max_num_batched_tokens {value}: each step's token budget "
            f"{b.max_num_batched_tokens} → {a.max_num_batched_tokens}: bigger prefill chunks "
            "per step (quicker first tokens, slower steps for the streams beside them)"
        )
        return text, False
    if key == "replicas":
        return f"{value} replicas: the arrivals split over {value} servers", False
    if key == "arrival_rate_scale":
        return f"arrivals x{value}: the same server under {value}x the load", False
    return f"{key}={value}", False


def change_reason(key: str, value: ChangeValue, before: ServerTerms, after: ServerTerms) -> str:
    """One line: which term of the step or of the capacity ``key=value`` moves, by how
    much, and what the replayed load made of it (the batch it admitted, the step it
    took), e.g. "KV cache in fp8: halves the KV bytes each step reads per token, and the
    pool holds 2x the tokens; but it admits 2.1x the batch, and each step reads more"."""
    term, by_bytes = _term(key, value, before, after)
    nominal = " (no card or model facts: only the capacity moves)"
    return term + (nominal if by_bytes and not before.facts else "") + _what_it_makes(before, after)
