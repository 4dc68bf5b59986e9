"""What a scenario is: a server, a model name and phases of load, back to back from t = 0.

The named scenarios are data, in ``rules/scenarios/*.yaml`` (read by
``scenario_files``): each makes one cause of ``docs/physics.md`` happen for the
physical reason the diagnosis names (``docs/physics.md``, "The four causes"), so a test or a
demo can ask for "KV pressure" and get the metrics a real server under KV pressure
sends, and a user can copy one to write their own. This module holds the types and
``server_spec``, which turns a card from ``rules/gpus.yaml`` and a model's size into
the plain numbers the engine runs on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from vllm_triage.ceiling.gpus import find_gpu
from vllm_triage.ceiling.pool import GIB, card_memory_bytes
from vllm_triage.ceiling.sizing import bytes_per_param
from vllm_triage.simulator.spec import ServerSpec, Workload

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"

#: What a phase is built to make the diagnosis say: a cause, or ``healthy`` (nothing).
#: Plain strings here (the simulator does not import the core); ``demo.expectations``
#: checks them against what fired.
Expectation = Literal[
    "healthy", "stalled", "prefill_bound", "decode_bound", "queue_bound", "kv_pressure"
]


#: What the simulated profile run keeps out of the pool besides the weights: a constant
#: plus a share of the card (activations at vLLM's batch defaults, CUDA graphs, buffers),
#: 5 GiB on an H100, inside the 4.4 to 7.9 GiB vLLM logs there (docs/physics.md, "Where
#: each fact comes from"), and not the estimator's own nominal figure.
PROFILE_RESERVE = (1.0 * GIB, 0.05)


def profiled_blocks(
    memory_gb: float,
    gpu_memory_utilization: float,
    weight_bytes_per_gpu: float,
    kv_bytes_per_token_per_gpu: float,
    block_size: int,
) -> int:
    """The pool vLLM sizes itself when not told its bytes: what is left of the card's
    memory (as PyTorch reports it) x ``gpu_memory_utilization`` once the weights and the
    profile run's peak are taken out, in whole blocks."""
    total = card_memory_bytes(memory_gb)[0]
    constant, share = PROFILE_RESERVE
    pool = total * gpu_memory_utilization - weight_bytes_per_gpu - (constant + share * total)
    blocks = int(pool // (kv_bytes_per_token_per_gpu * block_size))
    if blocks < 1:
        raise ValueError("the weights leave no room for a KV pool on this card")
    return blocks


def server_spec(
    gpu: str,
    *,
    num_gpu_blocks: int | None = None,
    max_num_batched_tokens: int,
    max_model_len: int,
    parameters_billion: float = 8.03,
    dtype: str = "bfloat16",
    num_layers: int = 32,
    hidden_size: int = 4096,
    kv_bytes_per_token: float = 131072.0,
    memory_bandwidth_gb_s: float | None = None,
    compute_tflops: float | None = None,
    routed_experts_billion: float = 0.0,
    num_experts: int = 0,
    experts_per_token: int = 0,
    draft_parameters_billion: float = 0.0,
    draft_kv_bytes_per_token: float = 0.0,
    tensor_parallel_size: int = 1,
    kv_heads: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    **caps: Any,
) -> ServerSpec:
    """A model (Llama-3.1-8B at bf16 unless told otherwise) on a card of rules/gpus.yaml.

    The card's bandwidth and dense bf16 compute come from the table the diagnosis uses
    too (one source of truth); ``memory_bandwidth_gb_s`` / ``compute_tflops`` replace
    them, and with both given ``gpu`` is only a label (a card the table lacks). Every
    weight is read per decode step: ``parameters x bytes per weight`` (docs/physics.md);
    ``caps`` are ``ServerSpec``'s other fields (``max_num_seqs``, ``block_size``, ...).

    A mixture of experts puts ``routed_experts_billion`` of its ``parameters_billion`` in
    ``num_experts`` routed experts, ``experts_per_token`` of them per token; a draft model
    of ``draft_parameters_billion`` is stored like the model, its KV cache holding
    ``draft_kv_bytes_per_token``. Under tensor parallelism
    the spec is one GPU's: its share of the weights and FLOPs, and of the KV cache
    (``kv_heads`` split over the GPUs, replicated below one head each).

    The KV pool is ``num_gpu_blocks`` when given; else ``kv_cache_memory_bytes`` per GPU
    (``--kv-cache-memory-bytes``, shown in ``vllm:cache_config_info``) in whole blocks;
    else sized as vLLM's profile run sizes it from the card's memory (``profiled_blocks``).

    Raises ``ConfigError`` for an unknown card or dtype, ``ValueError`` for numbers vLLM
    would refuse.
    """
    name = gpu
    if memory_bandwidth_gb_s is None or compute_tflops is None:
        card = find_gpu(gpu)
        name = card.name
        if memory_bandwidth_gb_s is None:
            memory_bandwidth_gb_s = card.memory_bandwidth_gb_s
        if compute_tflops is None:
            compute_tflops = card.bf16_dense_tflops
        if compute_tflops is None:
            raise ValueError(
                f"{card.name} has no compute figure in rules/gpus.yaml; give compute_tflops"
            )
    if not 0 <= routed_experts_billion < parameters_billion or tensor_parallel_size < 1:
        raise ValueError("routed experts must be part of the parameters; TP must be >= 1")
    # A whole number of parameters, so that 8.03 billion is exactly 8,030,000,000.
    parameters = float(round(parameters_billion * 1e9))
    routed = float(round(routed_experts_billion * 1e9))
    active = parameters - routed + (routed * experts_per_token / num_experts if routed else 0.0)
    size = bytes_per_param(dtype)
    draft = float(round(draft_parameters_billion * 1e9))
    tp = tensor_parallel_size
    kv_split = min(tp, kv_heads) if kv_heads else tp
    block = int(caps.get("block_size", 16))
    kv_per_gpu = kv_bytes_per_token / kv_split
    if num_gpu_blocks is None and kv_cache_memory_bytes is not None:
        num_gpu_blocks = int(kv_cache_memory_bytes // (kv_per_gpu * block))
    elif num_gpu_blocks is None:
        memory = find_gpu(gpu).memory_gb
        if memory is None:
            raise ValueError(f"{gpu} has no memory_gb in rules/gpus.yaml; give num_gpu_blocks")
        utilization = float(caps.get("gpu_memory_utilization", 0.9))
        weights = parameters * size / tp
        num_gpu_blocks = profiled_blocks(memory, utilization, weights, kv_per_gpu, block)
    return ServerSpec(
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        gpu=name,
        memory_bandwidth_gb_s=memory_bandwidth_gb_s,
        compute_tflops=compute_tflops,
        weight_bytes=(parameters - routed) * size / tp,
        parameters=active / tp,
        kv_bytes_per_token=kv_bytes_per_token / kv_split,
        routed_expert_bytes=routed * size / tp,
        num_experts=num_experts,
        experts_per_token=experts_per_token,
        draft_weight_bytes=draft * size / tp,
        draft_parameters=draft / tp,
        draft_kv_bytes_per_token=draft_kv_bytes_per_token / kv_split,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_gpu_blocks=num_gpu_blocks,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        **caps,
    )


def llama_8b(
    gpu: str,
    *,
    num_gpu_blocks: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    max_num_seqs: int = 256,
    gpu_memory_utilization: float = 0.9,
) -> ServerSpec:
    """Llama-3.1-8B at bf16 on a card from rules/gpus.yaml: 8.03e9 parameters at 2 bytes;
    KV per token 2 x 32 layers x 8 KV heads x 128 head_dim x 2 bytes = 131,072 (docs/physics.md)."""
    return server_spec(
        gpu,
        num_gpu_blocks=num_gpu_blocks,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=gpu_memory_utilization,
    )


@dataclass(frozen=True, slots=True)
class EnginePhase:
    """What one data-parallel engine (``rank``) does during a phase, faults included.

    ``hang``, ``sleep_level`` (1: weights offloaded, 2: discarded; the server needs
    ``enable_sleep_mode``) and ``stale_gauges`` (the running, waiting and KV gauges
    stop at their values while the engine serves on) last for the phase; at its start,
    clients abort ``abort_fraction`` of the engine's requests. An engine a phase does
    not list is awake, stepping, and its gauges move.
    """

    rank: int
    hang: bool = False
    sleep_level: int = 0
    abort_fraction: float = 0.0
    stale_gauges: bool = False

    def __post_init__(self) -> None:
        if self.rank < 0 or self.sleep_level not in (0, 1, 2):
            raise ValueError("rank must be >= 0 and sleep_level 0, 1 or 2")
        if not 0 <= self.abort_fraction <= 1:
            raise ValueError("abort_fraction must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class Phase:
    """``duration_s`` of ``workload``, on ``spec`` (``None``: the scenario's server);
    ``label`` says what the phase shows (the live demo prints it). With ``hang`` every
    engine stops stepping for the whole phase while ``/metrics`` still answers, frozen
    (``Engine.hang``); the workload's requests still arrive, and wait. ``engines`` says
    what single engines do (``EnginePhase``); ``reset_counters`` starts every counter
    and histogram again from 0 at the phase's start, in the live process. ``expect``
    says what the diagnosis should say while it plays (``None``: not stated)."""

    duration_s: float
    workload: Workload
    spec: ServerSpec | None = None
    label: str = ""
    hang: bool = False
    expect: Expectation | None = None
    engines: tuple[EnginePhase, ...] = ()
    reset_counters: bool = False

    def __post_init__(self) -> None:
        ranks = [e.rank for e in self.engines]
        if len(set(ranks)) != len(ranks):
            raise ValueError("each engine rank may be listed once per phase")

    def engine(self, rank: int) -> EnginePhase:
        """What engine ``rank`` does in this phase (a phase-wide ``hang`` included)."""
        own = next((e for e in self.engines if e.rank == rank), EnginePhase(rank))
        return dataclasses.replace(own, hang=True) if self.hang else own


@dataclass(frozen=True, slots=True)
class Scenario:
    """A server, a model name and the phases of load it sees, back to back from t = 0."""

    name: str
    spec: ServerSpec
    phases: tuple[Phase, ...]
    model_name: str = LLAMA_8B
    #: SLO settings the scenario is built for (``ttft_p99_seconds``, ``itl_p99_seconds``);
    #: the demo applies them under the user's own settings. Empty: the defaults.
    slo: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """What one server cannot do: a rank it lacks, sleep without sleep mode, or a
        deployment that changes between phases."""
        size = self.spec.data_parallel_size
        for phase in self.phases:
            spec = phase.spec or self.spec
            if _deployment(spec) != _deployment(self.spec):
                raise ValueError(
                    "data_parallel_size, api_server_count and enable_sleep_mode are the "
                    "server's: a phase cannot change them"
                )
            for engine in phase.engines:
                if engine.rank >= size:
                    raise ValueError(f"engine rank {engine.rank} >= data_parallel_size {size}")
                if engine.sleep_level and not spec.enable_sleep_mode:
                    raise ValueError("an engine sleeps only with enable_sleep_mode")

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    def phase_at(self, t: float) -> Phase:
        """The phase playing at ``t`` simulated seconds (the last one goes on for ever)."""
        end = 0.0
        for phase in self.phases:
            end += phase.duration_s
            if t < end:
                return phase
        return self.phases[-1]


def _deployment(spec: ServerSpec) -> tuple[int, int, bool]:
    return spec.data_parallel_size, spec.api_server_count, spec.enable_sleep_mode


def hold_last_phase(scenario: Scenario, until_s: float = math.inf) -> Scenario:
    """``scenario`` with its last phase lasting until ``until_s`` (default: for ever).

    A served simulation outlives its scenario; rather than fall idle (or restart, which
    resets every counter as a real restart would), the last load goes on: an incident
    stays an incident, and ``tour`` ends healthy. The arrivals before the old end are
    unchanged (the random stream does not depend on the phase's length).
    """
    extra = until_s - scenario.duration_s
    if extra <= 0:
        return scenario
    *head, last = scenario.phases
    longer = dataclasses.replace(last, duration_s=last.duration_s + extra)
    return dataclasses.replace(scenario, phases=(*head, longer))
