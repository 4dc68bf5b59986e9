"""Named servers under named loads, and ``record``: scrapes of them in virtual time.

Each preset makes one cause of ``/work/shared/domain.md`` happen for the physical
reason the diagnosis names (see ``design.md``, "Diagnosis"), so a test or a demo can ask
for "KV pressure" and get the metrics a real server under KV pressure sends:

- ``healthy``: an 8B model on an H100 under light traffic: TTFT tens of ms, ITL ~7 ms.
- ``prefill_bound``: ~20k-token prompts on an L40S: each prefill takes seconds of
  compute while the queue, the sequence cap and the KV pool all have room.
- ``decode_bound``: the seed table's CPU row (8B at 16 bits, 90 GB/s, 6 tokens/s): every
  token waits for 16 GB to stream. On a single GPU a step reads at most the card's whole
  memory, so ITL cannot pass ~80 ms from bandwidth alone; a CPU (or offloaded weights)
  is where "at the hardware limit" really breaches an ITL SLO.
- ``queue_bound``: an H100 capped at ``max_num_seqs=16`` with a fifth more arrivals
  than it can finish: requests wait while the KV pool stays nearly empty.
- ``kv_pressure``: ~4k-token conversations in a 32k-token pool (an 80 GB card run at a
  low ``--gpu-memory-utilization``): the pool fills, requests wait and get preempted.
- ``tour``: healthy, then each cause in turn, with healthy gaps between. The causes need
  different servers, so each fault phase swaps the hardware under the running engine
  (``Engine.reconfigure``); counters carry on, as they would on one long recording.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from daemon.gpus import find_gpu
from daemon.simulator.engine import Arrival, Engine, ServerSpec, Workload
from daemon.simulator.exposition import Naming, render

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def llama_8b(
    gpu: str,
    *,
    num_gpu_blocks: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    max_num_seqs: int = 256,
    gpu_memory_utilization: float = 0.9,
) -> ServerSpec:
    """Llama-3.1-8B at bf16 on a card from rules/gpus.yaml (the table the diagnosis
    uses too: one source of truth): 8.03e9 parameters at 2 bytes; KV per token
    2 x 32 layers x 8 KV heads x 128 head_dim x 2 bytes = 131,072 (domain.md)."""
    card = find_gpu(gpu)
    if card.bf16_dense_tflops is None:
        raise ValueError(f"{card.name} has no compute figure in rules/gpus.yaml")
    return ServerSpec(
        gpu=card.name,
        memory_bandwidth_gb_s=card.memory_bandwidth_gb_s,
        compute_tflops=card.bf16_dense_tflops,
        weight_bytes=16.06e9,
        parameters=8.03e9,
        kv_bytes_per_token=131072.0,
        num_layers=32,
        hidden_size=4096,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
    )


#: H100 SXM (3,350 GB/s, 989 dense bf16 TFLOPS), ~52 GB of KV at 0.9 utilisation.
H100_8B = llama_8b(
    "NVIDIA H100 SXM",
    num_gpu_blocks=25000,
    max_num_batched_tokens=8192,
    max_model_len=32768,
)
#: L40S (864 GB/s, 362 dense bf16 TFLOPS, 48 GB: ~25 GB of KV); vLLM's 2048-token
#: default step budget on cards under 70 GB.
L40S_8B = llama_8b(
    "NVIDIA L40S",
    num_gpu_blocks=12000,
    max_num_batched_tokens=2048,
    max_model_len=32768,
)
#: domain.md's CPU row: dual-channel DDR5-5600, 90 GB/s (compute from rules/gpus.yaml, a
#: rough figure); vLLM's CPU default of 4 GiB of KV (2048 blocks of 2 MiB).
CPU_8B = llama_8b(
    "CPU, dual-channel DDR5-5600",
    num_gpu_blocks=2048,
    max_num_batched_tokens=2048,
    max_model_len=8192,
)
#: A100 80 GB SXM (2,039 GB/s, 312 TFLOPS) at ``--gpu-memory-utilization`` ~0.27:
#: 4.3 GB of KV, 2048 blocks, 32k tokens.
A100_SMALL_POOL_8B = llama_8b(
    "NVIDIA A100 80GB SXM",
    num_gpu_blocks=2048,
    max_num_batched_tokens=8192,
    max_model_len=8192,
    gpu_memory_utilization=0.27,
)
#: The healthy H100 with ``--max-num-seqs 16``: plenty of KV, few seats.
H100_FEW_SEQS_8B = llama_8b(
    "NVIDIA H100 SXM",
    num_gpu_blocks=25000,
    max_num_batched_tokens=8192,
    max_model_len=32768,
    max_num_seqs=16,
)


@dataclass(frozen=True, slots=True)
class Phase:
    """``duration_s`` of ``workload``, on ``spec`` (``None``: the scenario's server)."""

    duration_s: float
    workload: Workload
    spec: ServerSpec | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    """A server, a model name and the phases of load it sees, back to back from t = 0."""

    name: str
    spec: ServerSpec
    phases: tuple[Phase, ...]
    model_name: str = LLAMA_8B

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)


HEALTHY_LOAD = Workload(arrival_rate_per_s=3.0, prompt_tokens=600, output_tokens=180, spread=0.5)
PREFILL_LOAD = Workload(arrival_rate_per_s=0.15, prompt_tokens=20000, output_tokens=24, seed=1)
DECODE_LOAD = Workload(arrival_rate_per_s=0.04, prompt_tokens=48, output_tokens=400, seed=2)
QUEUE_LOAD = Workload(arrival_rate_per_s=10.0, prompt_tokens=400, output_tokens=250, seed=3)
KV_LOAD = Workload(arrival_rate_per_s=0.6, prompt_tokens=3000, output_tokens=1200, seed=4)

_FAULTS: tuple[tuple[str, ServerSpec, Workload], ...] = (
    ("prefill_bound", L40S_8B, PREFILL_LOAD),
    ("decode_bound", CPU_8B, DECODE_LOAD),
    ("queue_bound", H100_FEW_SEQS_8B, QUEUE_LOAD),
    ("kv_pressure", A100_SMALL_POOL_8B, KV_LOAD),
)


def _tour(fault_s: float = 120.0, gap_s: float = 60.0) -> Scenario:
    phases: list[Phase] = [Phase(gap_s, HEALTHY_LOAD)]
    for _name, spec, load in _FAULTS:
        phases += [Phase(fault_s, load, spec), Phase(gap_s, HEALTHY_LOAD)]
    return Scenario("tour", H100_8B, tuple(phases))


SCENARIOS: dict[str, Scenario] = {
    "healthy": Scenario("healthy", H100_8B, (Phase(600.0, HEALTHY_LOAD),)),
    **{name: Scenario(name, spec, (Phase(600.0, load),)) for name, spec, load in _FAULTS},
    "tour": _tour(),
}


def get_scenario(name: str) -> Scenario:
    """The preset called ``name``; a ``KeyError`` lists the names there are."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"no scenario {name!r}; there are: {', '.join(SCENARIOS)}") from None


class _Feed:
    """One engine's arrivals over all phases, pulled up to an instant."""

    def __init__(self, scenario: Scenario, part: int, parts: int) -> None:
        self._streams: list[tuple[float, ServerSpec, Iterator[Arrival]]] = []
        start = 0.0
        for index, phase in enumerate(scenario.phases):
            end = start + phase.duration_s
            key = f"{scenario.name}/{index}"
            stream = phase.workload.arrivals(start, end, key=key, part=part, parts=parts)
            self._streams.append((start, phase.spec or scenario.spec, stream))
            start = end
        self._next: Arrival | None = None
        self._spec = scenario.spec

    def drive(self, engine: Engine, t: float) -> None:
        """Submit what arrives by ``t`` and step ``engine`` to ``t``, swapping servers on time."""
        while self._streams and self._streams[0][0] <= t:
            start, spec, stream = self._streams[0]
            if spec != self._spec:
                engine.advance_to(max(start, engine.now))
                engine.reconfigure(spec)
                self._spec = spec
            self._submit(engine, stream, t)
            if self._next is not None:  # the phase goes on past t
                break
            self._streams.pop(0)
        engine.advance_to(t)

    def _submit(self, engine: Engine, stream: Iterator[Arrival], t: float) -> None:
        while True:
            arrival = self._next if self._next is not None else next(stream, None)
            self._next = None
            if arrival is None:
                return
            if arrival.at_s > t:
                self._next = arrival
                return
            engine.submit(arrival)


class Simulation:
    """Scenarios (one model each) run side by side, ``engines`` data-parallel engines each.

    Each engine gets its 1/engines share of the arrivals, as vLLM's data-parallel load
    balancer spreads them. ``advance_to`` then ``render`` gives one scrape.
    """

    def __init__(
        self,
        scenarios: Scenario | Sequence[Scenario],
        *,
        engines: int = 1,
        keep_records: bool = False,
    ) -> None:
        chosen = (scenarios,) if isinstance(scenarios, Scenario) else tuple(scenarios)
        if not chosen or engines < 1:
            raise ValueError("need at least one scenario and one engine")
        if len({s.model_name for s in chosen}) != len(chosen):
            raise ValueError("each scenario in one payload needs its own model_name")
        self.scenarios = chosen
        self.engines: list[tuple[str, Engine]] = []
        self._feeds: list[_Feed] = []
        for sc in chosen:
            for part in range(engines):
                self.engines.append((sc.model_name, Engine(sc.spec, keep_records=keep_records)))
                self._feeds.append(_Feed(sc, part, engines))

    @property
    def duration_s(self) -> float:
        return max(s.duration_s for s in self.scenarios)

    def advance_to(self, t: float) -> None:
        """Step every engine to virtual time ``t`` (seconds since the start)."""
        for (_, engine), feed in zip(self.engines, self._feeds, strict=True):
            feed.drive(engine, t)

    def render(self, *, created_at: float, naming: Naming = "v1") -> str:
        """The ``/metrics`` text now; ``created_at`` is the unix time of t = 0."""
        return render(self.engines, created_at=created_at, naming=naming)


def record(
    scenario: Scenario | Sequence[Scenario] | str,
    *,
    start_at: float,
    interval_s: float,
    duration_s: float | None = None,
    naming: Naming = "v1",
    engines: int = 1,
) -> Iterator[tuple[float, str]]:
    """Scrapes every ``interval_s`` of virtual time: ``(unix seconds, /metrics text)``.

    The first scrape is at ``start_at`` (t = 0, all counters zero), the last at or before
    ``duration_s`` (default: the longest scenario). Nothing sleeps: ten simulated
    minutes take seconds of CPU.
    """
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    chosen = get_scenario(scenario) if isinstance(scenario, str) else scenario
    sim = Simulation(chosen, engines=engines)
    end = sim.duration_s if duration_s is None else duration_s
    tick = 0
    while tick * interval_s <= end + 1e-9:
        t = tick * interval_s
        sim.advance_to(t)
        yield start_at + t, sim.render(created_at=start_at, naming=naming)
        tick += 1
