"""The simulator calibrated to a recording's window, and the same load on a changed server.

What is taken from the window (``docs/physics.md``, "Predicted effects"):

- the server: the card's bandwidth and compute, the model's bytes and FLOPs per GPU (the
  rulebook's roofline facts, as the diagnosis used them), the KV pool (blocks and block
  size from ``vllm:cache_config_info``), ``max_num_seqs`` (the most that ran while
  requests waited with the pool not full; else vLLM's default of 256);
- the load: arrivals scrape interval by scrape interval (their burstiness at that
  resolution), the mean prompt and output lengths, the queue the window began with;
- the per-step overhead: the measured mean decode step minus the simulated floor, refit
  until the replay's decode step matches the measured one (``FIT_ROUNDS``).

A warm-up at the window's admission rate comes first (so the batch is full, as it was,
when the window opens); then the window's intervals play, and the replay is measured by
the same core that measured the recording. Without the card or the model (a CPU
recording, a server the tables lack) the floor is left out and the whole step is
overhead; prompts then cost what the window's prefill time says they cost.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from vllm_triage.ceiling.gpus import find_gpu
from vllm_triage.ceiling.pool import GIB
from vllm_triage.ceiling.sizing import bytes_per_param
from vllm_triage.core.drive import Driver, Fed
from vllm_triage.core.evaluate import Evaluator
from vllm_triage.core.model import ChangeValue, Signals
from vllm_triage.core.predict import ServerTerms, change_reason
from vllm_triage.core.roofline import step as roofline
from vllm_triage.core.rulebook import Roofline
from vllm_triage.rules import runtime_table
from vllm_triage.simulator import Phase, Scenario, ServerSpec, Simulation, Workload
from vllm_triage.whatif.budget import (
    MIN_STEP_SECONDS,
    Budget,
    BudgetError,
    implausible,
    merged,
    replay_interval,
)
from vllm_triage.whatif.window import Observed

METRICS = (
    "ttft_p99_seconds",
    "itl_p99_seconds",
    "decode_step_seconds",
    "requests_waiting_mean",
    "kv_usage_mean",
    "generation_tokens_per_second",
)

#: Rounds of fitting the per-step overhead to the measured decode step: the step grows
#: with the batch and the batch with the step (Little's law), so one subtraction is not
#: enough; two or three bring the replay within a few percent.
FIT_ROUNDS = 3
FIT_TOLERANCE = 0.03

#: A metric whose calibrated replay misses the measured value by more than this share
#: is flagged, and its predicted ``after`` marked: the model does not reproduce what it
#: is asked to change. Where the measured value is small, a miss must also exceed the
#: metric's own floor (a tenth of a request waiting is not a 20 % error worth a warning).
CALIBRATION_TOLERANCE = 0.20
MISS_FLOOR: dict[str, float] = {"requests_waiting_mean": 1.0, "kv_usage_mean": 0.05}

#: vLLM's defaults where the window does not show the setting.
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


def measured(s: Signals | None) -> dict[str, float | None]:
    """The six numbers before and after are compared on, as the core measured them."""
    if s is None:
        return dict.fromkeys(METRICS)
    return {
        "ttft_p99_seconds": s.ttft_p99.value if s.ttft_p99 is not None else None,
        "itl_p99_seconds": s.itl_p99.value if s.itl_p99 is not None else None,
        "decode_step_seconds": s.itl_mean,
        "requests_waiting_mean": s.waiting_mean,
        "kv_usage_mean": s.kv_usage_mean,
        "generation_tokens_per_second": s.generation_tokens_per_second,
    }


@dataclass(frozen=True, slots=True)
class Server:
    """A calibrated server: the simulator's spec, and what a change needs besides it."""

    spec: ServerSpec
    tensor_parallel_size: int = 1
    kv_split: int | None = None
    memory_gb: float | None = None
    bytes_per_weight: float = 2.0
    kv_bytes_per_element: float = 2.0
    achievable_fraction: float = 1.0
    notes: tuple[str, ...] = ()


def _hardware(obs: Observed) -> Roofline | None:
    hw = obs.rules.roofline
    if hw is None and obs.rules.ceiling is not None:
        hw = roofline.weights_only(obs.rules.ceiling)
    return hw


def _lengths(s: Signals) -> tuple[int, int]:
    prompt = s.mean_prompt_tokens
    if prompt is None and s.prompt_tokens_per_second and s.ttft_count:
        prompt = s.prompt_tokens_per_second * s.span_seconds / s.ttft_count
    output = s.mean_generation_tokens
    if output is None and s.decode_time_mean and s.itl_mean:
        output = s.decode_time_mean / s.itl_mean + 1
    return max(1, round(prompt or 128)), max(1, round(output or 128))


def _seats(s: Signals, engines: int) -> int:
    """``max_num_seqs``: the most that ran while some waited with the pool not full (a
    sequence cap showing itself); vLLM's default otherwise."""
    running = (s.running_max or 0.0) / engines
    kv_room = s.kv_usage_max is None or s.kv_usage_max < 0.9
    if (s.waiting_max or 0.0) >= 1 and kv_room and running >= 1:
        return max(1, round(running))
    return max(DEFAULT_MAX_NUM_SEQS, math.ceil(running))


def base_server(obs: Observed) -> Server:
    """The server the window shows, before the overhead is fitted."""
    s = obs.signals
    engines = max(1, s.engines)
    hw = _hardware(obs)
    notes: list[str] = []
    if s.runtime.name != "vllm":
        # The simulator schedules as vLLM does; the physics (a step's bytes, the pool,
        # the batch cap) is the same, the names of the settings are not.
        notes.append(
            f"a recording of {s.runtime.shown}: replayed through the simulator's continuous "
            "batching (vLLM's scheduler); each change key stands for the engine's own "
            "setting (max_num_seqs: its cap on running requests, max_num_batched_tokens: "
            "its prefill chunk)"
        )
    prompt, output = _lengths(s)
    block = (s.kv_cache.block_size if s.kv_cache else None) or 16
    pool_tokens = (s.kv_pool_tokens or 0) // engines
    if pool_tokens <= 0:
        pool_tokens = max(1_000_000, 8 * (prompt + output))
        notes.append("KV pool not exposed: taken as unlimited")
    seqs = _seats(s, engines)
    spec_fields: dict[str, float | int] = {}
    r = roofline.step_roofline(s, hw) if hw is not None else None
    tp, split, memory, per_weight = 1, None, None, 2.0
    if hw is not None and hw.weight_bytes is not None:
        tp = max(1, hw.tensor_parallel_size)
        split = hw.kv_split
        memory = hw.memory_gb
        params = hw.active_parameters or hw.weight_bytes / 2
        if hw.active_parameters and not hw.routed_expert_bytes:
            per_weight = hw.weight_bytes / hw.active_parameters
        kv = r.kv_bytes_per_token if r is not None and r.kv_bytes_per_token else None
        if kv is None:
            kv = 1.0
            notes.append("KV bytes per token unknown: KV reads left out of the floor")
        attention = hw.attention_flops_per_context_token or 0.0
        spec_fields = {
            "memory_bandwidth_gb_s": hw.memory_bandwidth_gb_s * hw.achievable_fraction,
            "compute_tflops": hw.compute_tflops or 1e9,
            "weight_bytes": hw.weight_bytes / tp,
            "parameters": params / tp,
            "kv_bytes_per_token": kv,
            "num_layers": 1,
            "hidden_size": max(1, round(attention / 4 / tp)),
            "routed_expert_bytes": hw.routed_expert_bytes / tp,
            "num_experts": hw.num_experts,
            "experts_per_token": hw.experts_per_token,
        }
        if not hw.compute_tflops:
            notes.append("the card's compute unknown: prefill costs only its bytes")
    else:
        # No floor: the whole step is overhead, and a prompt token costs what the
        # window's prefill time says (a nominal 1e9-parameter model on a fitted compute).
        notes.append("no card or model facts: the whole decode step is overhead")
        prefill = (s.prefill_time_mean or 0.0) - (s.itl_mean or 0.0)
        tflops = 1e9
        if prefill > 0:
            tflops = 2e9 * prompt / (prefill * 1e12)
        spec_fields = {
            "memory_bandwidth_gb_s": 1e9,
            "compute_tflops": tflops,
            "weight_bytes": 1.0,
            "parameters": 1e9,
            "kv_bytes_per_token": 1.0,
            "num_layers": 1,
            "hidden_size": 1,
        }
    max_len = max(2, min(pool_tokens, max(2048, 4 * (prompt + output))))
    spec = ServerSpec(
        **spec_fields,  # type: ignore[arg-type]
        max_num_seqs=seqs,
        max_num_batched_tokens=max(DEFAULT_MAX_NUM_BATCHED_TOKENS, seqs),
        num_gpu_blocks=max(1, pool_tokens // block),
        block_size=block,
        max_model_len=min(max_len, max(1, pool_tokens // block) * block),
        step_overhead_s=0.0,
        # The rulebook's compute is what the card achieves (the roofline divides by it
        # as it is), so the simulator takes it whole.
        compute_efficiency=1.0,
        data_parallel_size=engines,
        gpu=hw.gpu if hw is not None else "",
    )
    kv_dtype = (s.kv_cache.cache_dtype if s.kv_cache else "auto").lower()
    return Server(
        spec=spec,
        tensor_parallel_size=tp,
        kv_split=split,
        memory_gb=memory,
        bytes_per_weight=per_weight,
        kv_bytes_per_element=1.0 if kv_dtype.startswith("fp8") else 2.0,
        achievable_fraction=hw.achievable_fraction if hw is not None else 1.0,
        notes=tuple(notes),
    )


def _floor_estimate(obs: Observed) -> float:
    hw = _hardware(obs)
    r = roofline.step_roofline(obs.signals, hw) if hw is not None else None
    return r.floor_seconds if r is not None else 0.0


# -- the load ------------------------------------------------------------------------------


def scenario(
    obs: Observed, server: Server, *, scale: float = 1.0, replicas: int = 1, backlog: bool = True
) -> Scenario:
    """The window's load on ``server``: a warm-up, then the window's arrivals interval by
    interval (``scale`` x, over ``replicas`` servers).

    With ``backlog`` (the server as it was, or only its load scaled) the warm-up runs at
    the admission rate and the queue the window began with arrives at its start: the
    replay starts where the recording stood. Without (a server changed in capacity), the
    warm-up runs at the window's arrival rate and builds whatever queue the changed
    server builds: a server with twice the capacity would not have had the old backlog.
    """
    s = obs.signals
    prompt, output = _lengths(s)
    share = scale / replicas
    admitted = s.ttft_count / s.span_seconds if s.span_seconds > 0 else 0.0
    life = (s.prefill_time_mean or 0.0) + (s.decode_time_mean or 0.0)
    warm = min(120.0, max(10.0, 3.0 * life))

    def load(rate: float, seed: int, burst: int = 0) -> Workload:
        return Workload(
            arrival_rate_per_s=max(0.0, rate),
            prompt_tokens=prompt,
            output_tokens=output,
            spread=0.25,
            burst=burst,
            seed=seed,
        )

    arriving = obs.arrivals / obs.span_seconds if obs.span_seconds > 0 else admitted
    phases = [Phase(warm, load((admitted if backlog else arriving) * share, 0))]
    queued = round(obs.waiting_first * share) if backlog else 0
    for index, (seconds, arrivals) in enumerate(merged(obs.intervals)):
        phases.append(
            Phase(seconds, load(arrivals / seconds * share, index + 1, 0 if index else queued))
        )
    return Scenario(name="whatif", spec=server.spec, phases=tuple(phases), model_name=obs.model)


def expected_requests(sc: Scenario) -> float:
    """The requests a scenario's replay simulates, on average: every phase's bursts and
    Poisson arrivals."""
    return sum(p.workload.burst + p.workload.arrival_rate_per_s * p.duration_s for p in sc.phases)


#: A replay steps its simulation this many virtual seconds at a time between looks at
#: the budget, whatever its scrape interval: one look costs nothing, and an engine at its
#: fastest step (``MIN_STEP_SECONDS``) takes at most 5,000 steps in between.
_LOOK_EVERY_S = 0.5


def replay(
    obs: Observed,
    server: Server,
    evaluator: Callable[[], Evaluator],
    *,
    scale: float = 1.0,
    replicas: int = 1,
    backlog: bool = True,
    budget: Budget | None = None,
) -> Signals | None:
    """The load on ``server``, measured as the recording was: the last window's signals.
    ``budget`` refuses a replay that would cost more than it may (``whatif.budget``)."""
    budget = budget or Budget()
    sc = scenario(obs, server, scale=scale, replicas=replicas, backlog=backlog)
    why = f"{obs.arrivals:,.0f} arrivals in the window" + (f" x {scale:g}" if scale != 1 else "")
    budget.requests(expected_requests(sc), why=why)
    budget.replays += 1
    interval = replay_interval(obs.span_seconds, len(obs.intervals))
    driver = Driver(evaluator(), runtime_table())
    last: Signals | None = None
    start = obs.at - sc.duration_s
    sim = Simulation(sc)
    engines = [engine for _, engine in sim.engines]
    tick, now = 0, 0.0
    while tick * interval <= sc.duration_s + 1e-9:
        t = tick * interval
        while now < t:
            now = min(t, now + _LOOK_EVERY_S)
            sim.advance_to(now)
            budget.spend(
                steps=sum(e.stats.steps for e in engines),
                tokens=sum(e.stats.prompt_tokens + e.stats.generation_tokens for e in engines),
            )
        fed = driver.feed(sim.render(created_at=start).encode(), start + t)
        if isinstance(fed, Fed):
            last = fed.evaluation.signals.get(obs.model, last)
        tick += 1
    return last


@dataclass(frozen=True, slots=True)
class Calibration:
    server: Server
    replay: Signals | None
    rounds: int
    overhead_s: float


def calibrate(
    obs: Observed, evaluator: Callable[[], Evaluator], budget: Budget | None = None
) -> Calibration:
    """Fit the per-step overhead so that the replay's mean decode step is the measured one.
    The overhead is at least ``MIN_STEP_SECONDS``: no engine steps faster, and a step of
    no time would never let the simulation's clock move."""
    server = base_server(obs)
    target = obs.signals.itl_mean
    overhead = max(MIN_STEP_SECONDS, (target or 0.0) - _floor_estimate(obs))
    sim: Signals | None = None
    rounds = 0
    for rounds in range(1, FIT_ROUNDS + 1):  # noqa: B007 - the count is reported
        server = dataclasses.replace(
            server, spec=dataclasses.replace(server.spec, step_overhead_s=overhead)
        )
        sim = replay(obs, server, evaluator, budget=budget)
        got = sim.itl_mean if sim is not None else None
        if target is None or got is None or abs(got / target - 1) <= FIT_TOLERANCE:
            break
        overhead = max(MIN_STEP_SECONDS, overhead + (target - got))
    return Calibration(server, sim, rounds, overhead)


# -- changes ------------------------------------------------------------------------------


def _pool_with(server: Server, spec: ServerSpec, freed_bytes: float, kv_bytes: float) -> int:
    """Blocks after a change: the pool's bytes plus ``freed_bytes`` per GPU, over the new
    KV bytes per token."""
    pool_bytes = server.spec.num_gpu_blocks * spec.block_size * server.spec.kv_bytes_per_token
    return max(1, int((pool_bytes + freed_bytes) // (kv_bytes * spec.block_size)))


def changed(server: Server, changes: Mapping[str, ChangeValue]) -> tuple[Server, list[str]]:
    """``server`` under ``changes`` (the load's own changes, replicas and arrival scale,
    are the caller's). The overhead stays as fitted: it is the host's, not the card's."""
    spec = server.spec
    notes: list[str] = []
    fields: dict[str, float | int] = {}
    facts = spec.weight_bytes > 1.0  # a nominal spec has no bytes to change
    if "kv_cache_dtype" in changes:
        new = 1.0 if str(changes["kv_cache_dtype"]).startswith("fp8") else 2.0
        factor = new / server.kv_bytes_per_element
        kv = spec.kv_bytes_per_token * factor
        fields["kv_bytes_per_token"] = kv
        fields["num_gpu_blocks"] = max(1, round(spec.num_gpu_blocks / factor))
        if not facts:
            notes.append("kv_cache_dtype: the KV bytes are unknown, only the pool grows")
    if "dtype" in changes:
        factor = bytes_per_param(str(changes["dtype"])) / server.bytes_per_weight
        weights = spec.weight_bytes * factor
        fields["weight_bytes"] = weights
        fields["routed_expert_bytes"] = spec.routed_expert_bytes * factor
        if facts:
            freed = (spec.weight_bytes - weights) + (spec.routed_expert_bytes * (1 - factor))
            kv = float(fields.get("kv_bytes_per_token", spec.kv_bytes_per_token))
            fields["num_gpu_blocks"] = _pool_with(server, spec, freed, kv)
        else:
            notes.append("dtype: the weights' bytes are unknown: no effect modelled")
        notes.append("dtype: compute kept at the 16-bit rate (FP8 tensor cores may be faster)")
    if "tensor_parallel_size" in changes:
        n = int(changes["tensor_parallel_size"])
        k = n / server.tensor_parallel_size
        split = server.kv_split or max(n, server.tensor_parallel_size)
        kv_factor = min(server.tensor_parallel_size, split) / min(n, split)
        weights = float(fields.get("weight_bytes", spec.weight_bytes))
        kv = float(fields.get("kv_bytes_per_token", spec.kv_bytes_per_token)) * kv_factor
        fields.update(
            weight_bytes=weights / k,
            routed_expert_bytes=float(fields.get("routed_expert_bytes", spec.routed_expert_bytes))
            / k,
            parameters=spec.parameters / k,
            hidden_size=max(1, round(spec.hidden_size / k)),
            kv_bytes_per_token=kv,
        )
        if facts:
            fields["num_gpu_blocks"] = _pool_with(server, spec, weights - weights / k, kv)
        notes.append("tensor_parallel_size: all-reduce time between GPUs not modelled")
    if "gpu" in changes:
        card = find_gpu(str(changes["gpu"]))
        fields["memory_bandwidth_gb_s"] = card.memory_bandwidth_gb_s * server.achievable_fraction
        if card.bf16_dense_tflops:
            fields["compute_tflops"] = card.bf16_dense_tflops
        fields["gpu"] = card.name  # type: ignore[assignment]
        if server.memory_gb and card.memory_gb and facts:
            util = spec.gpu_memory_utilization
            extra = (card.memory_gb - server.memory_gb) * GIB * util
            kv = float(fields.get("kv_bytes_per_token", spec.kv_bytes_per_token))
            blocks = int(fields.get("num_gpu_blocks", spec.num_gpu_blocks))
            fields["num_gpu_blocks"] = max(1, blocks + int(extra // (kv * spec.block_size)))
        elif not facts:
            notes.append("gpu: no card or model facts for the recording: no effect modelled")
    if "max_num_seqs" in changes:
        fields["max_num_seqs"] = int(changes["max_num_seqs"])
    if "max_num_batched_tokens" in changes:
        fields["max_num_batched_tokens"] = int(changes["max_num_batched_tokens"])
    seqs = int(fields.get("max_num_seqs", spec.max_num_seqs))
    batched = int(fields.get("max_num_batched_tokens", spec.max_num_batched_tokens))
    if batched < seqs:
        if "max_num_batched_tokens" in changes:
            fields["max_num_seqs"] = batched
            notes.append("max_num_seqs lowered to max_num_batched_tokens, as vLLM requires")
        else:
            fields["max_num_batched_tokens"] = seqs
    blocks = int(fields.get("num_gpu_blocks", spec.num_gpu_blocks))
    fields["max_model_len"] = min(spec.max_model_len, blocks * spec.block_size)
    new_spec = dataclasses.replace(spec, **fields)  # type: ignore[arg-type]
    tp = int(changes.get("tensor_parallel_size", server.tensor_parallel_size))
    kv_el = server.kv_bytes_per_element
    if "kv_cache_dtype" in changes:
        kv_el = 1.0 if str(changes["kv_cache_dtype"]).startswith("fp8") else 2.0
    return (
        dataclasses.replace(
            server, spec=new_spec, tensor_parallel_size=tp, kv_bytes_per_element=kv_el
        ),
        notes,
    )


def misses(
    before: Mapping[str, float | None], replay: Mapping[str, float | None]
) -> dict[str, float]:
    """The metrics the calibrated replay misses by more than ``CALIBRATION_TOLERANCE``
    (and their floor): metric -> replay / measured - 1."""
    out = {}
    for key, want in before.items():
        got = replay.get(key)
        if want is None or got is None or want <= 0:
            continue
        error = got / want - 1
        if abs(error) > CALIBRATION_TOLERANCE and abs(got - want) > MISS_FLOOR.get(key, 0.0):
            out[key] = error
    return out


def terms(server: Server, s: Signals | None) -> ServerTerms:
    """``server``'s step and capacity terms, with what a run on it measured."""
    spec = server.spec
    return ServerTerms(
        kv_bytes_per_token=spec.kv_bytes_per_token,
        weight_bytes=spec.weight_bytes,
        pool_tokens=spec.num_gpu_blocks * spec.block_size,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        bandwidth_gb_s=spec.memory_bandwidth_gb_s,
        compute_tflops=spec.compute_tflops,
        facts=spec.weight_bytes > 1.0,
        running_mean=s.running_mean if s is not None else None,
        step_seconds=s.itl_mean if s is not None else None,
    )


@dataclass(frozen=True, slots=True)
class Result:
    """``before`` measured; ``replay`` the calibrated model's own run of the window;
    ``after`` the changed server's (one server's, under ``replicas``). ``off``: the
    metrics the replay misses by more than ``CALIBRATION_TOLERANCE`` (their ``after`` is
    not to be trusted); ``reasons``: one line per change, the term it moves and why."""

    obs: Observed
    changes: Mapping[str, ChangeValue]
    before: dict[str, float | None]
    replay: dict[str, float | None]
    after: dict[str, float | None]
    overhead_s: float
    rounds: int
    notes: list[str] = field(default_factory=list)
    off: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)


def check_window(obs: Observed) -> None:
    """``BudgetError`` for a window that claims more than its engines could do."""
    s = obs.signals
    prompt, output = s.mean_prompt_tokens, s.mean_generation_tokens
    rate = obs.arrivals / obs.span_seconds if obs.span_seconds > 0 else 0.0
    peak = max((a / sec for sec, a in obs.intervals if sec > 0), default=0.0)
    why = implausible(
        engines=s.engines,
        running_max=max(s.running_max or 0.0, obs.running_first),
        waiting_max=max(s.waiting_max or 0.0, obs.waiting_first),
        arrivals_per_second=max(rate, peak),
        itl_mean=s.itl_mean,
        prompt_tokens=prompt,
        output_tokens=output,
        span_seconds=obs.span_seconds,
    )
    if why is not None:
        raise BudgetError(
            f"refused: the window ending {obs.offset_seconds:g} s into the recording is "
            f"implausible: {why}; its metrics cannot be simulated (pick another with --at)"
        )


def whatif(
    obs: Observed,
    evaluator: Callable[[], Evaluator],
    changes: Mapping[str, ChangeValue],
    budget: Budget | None = None,
) -> Result:
    """The window replayed as it was and as changed, within ``budget`` (default: its
    bounds without a wall-time one); ``BudgetError`` for a window or a change that would
    cost more (``whatif.budget``)."""
    budget = budget or Budget()
    check_window(obs)
    cal = calibrate(obs, evaluator, budget)
    notes = list(cal.server.notes)
    own = measured(cal.replay)
    reasons: list[str] = []
    if not changes:
        after = own
    else:
        server, more = changed(cal.server, changes)
        notes.extend(more)
        scale = float(changes.get("arrival_rate_scale", 1.0))
        replicas = int(changes.get("replicas", 1))
        same = set(changes) <= {"arrival_rate_scale"}
        run = replay(
            obs,
            server,
            evaluator,
            scale=scale,
            replicas=replicas,
            backlog=same,
            budget=budget,
        )
        after = measured(run)
        was, now = terms(cal.server, cal.replay), terms(server, run)
        # Each line names the term its change moves; what the load made of them all
        # together (the batch, the step) is said once, on the last.
        bare = dataclasses.replace(now, running_mean=None, step_seconds=None)
        items = list(changes.items())
        reasons = [change_reason(k, v, was, bare) for k, v in items[:-1]]
        reasons.append(change_reason(*items[-1], was, now))
    before = measured(obs.signals)
    return Result(
        obs=obs,
        changes=dict(changes),
        before=before,
        replay=own,
        after=after,
        overhead_s=cal.overhead_s,
        rounds=cal.rounds,
        notes=notes,
        off=misses(before, own),
        reasons=reasons,
    )
