"""The built-in demo: each simulated situation, diagnosed by the same core as a live run.

No GPU and no vLLM needed: ``vllm_triage.simulator`` steps a physically modelled vLLM server
in virtual time and renders its /metrics exactly as vLLM does; each scrape goes through
the parser, the window, the classifier and the incident tracker, as ``replay`` would
take it. Each scenario runs on its own hardware (from rules/gpus.yaml), and the core is
told that hardware, so the decode ceiling in the evidence is the simulated card's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_triage.assemble import build_evaluator
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.core.drive import Driver, Unusable
from vllm_triage.core.model import Cause, Transition
from vllm_triage.demo.expectations import Event, problems, segments
from vllm_triage.recording.files import write_scrape
from vllm_triage.rules import runtime_table
from vllm_triage.simulator import Scenario, get_scenario, record

#: The demo's order: a healthy baseline, then one scenario per cause (the hang included:
#: the cause vLLM's own health check cannot see).
DEFAULT_SCENARIOS = (
    "healthy",
    "prefill_bound",
    "decode_bound",
    "queue_bound",
    "kv_pressure",
    "stalled",
)
EXPECTED: dict[str, Cause | None] = {
    "healthy": None,
    "stalled": "stalled",
    "prefill_bound": "prefill_bound",
    "decode_bound": "decode_bound",
    "queue_bound": "queue_bound",
    "kv_pressure": "kv_pressure",
}
#: 2026-01-01T00:00:00Z: a fixed start, so every run of the demo prints the same thing.
START_AT = 1_767_225_600.0
#: Simulated seconds of a single-phase scenario: long enough to fire and persist.
SINGLE_PHASE_S = 300.0
#: After a scenario of several phases: long enough for its last incident to resolve.
TAIL_S = 60.0


def default_duration(scenario: Scenario) -> float:
    """How long the offline demo plays ``scenario`` unless told: a single-phase one for
    ``SINGLE_PHASE_S``, one of several phases (the ``tour``) whole, plus ``TAIL_S``."""
    if len(scenario.phases) == 1:
        return SINGLE_PHASE_S
    return scenario.duration_s + TAIL_S


def scenario_facts(scenario: Scenario) -> dict[str, Any]:
    """What a user would tell the daemon about the simulated server: its card (bandwidth,
    and the compute its kernels reach) and its model (weights, KV bytes per token, a
    draft model), so the decode roofline has every term the simulator's step pays for.
    Empty for a scenario that swaps cards between phases: no one card is true for all of
    it. A mixture of experts is left to its ``config.json`` (the scenario holds no config
    file to point at), so only its non-routed weights are said here."""
    if any(p.spec is not None for p in scenario.phases):
        return {}
    spec = scenario.spec
    hardware: dict[str, Any] = {
        "gpu": spec.gpu or None,
        "memory_bandwidth_gb_s": spec.memory_bandwidth_gb_s,
        "compute_tflops": spec.compute_tflops * spec.compute_efficiency,
    }
    model: dict[str, Any] = {
        "parameters_billion": spec.weight_bytes / 2 / 1e9,
        "dtype": "bfloat16",
        "kv_bytes_per_token": spec.kv_bytes_per_token,
    }
    if spec.draft_weight_bytes > 0:
        model["draft_parameters_billion"] = spec.draft_weight_bytes / 2 / 1e9
        model["draft_kv_bytes_per_token"] = spec.draft_kv_bytes_per_token or None
    return {"hardware": hardware, "model": model}


def scenario_settings(scenario: Scenario, config: str | None) -> Settings:
    """The settings a scenario is judged with: its own ``slo:`` over the defaults, then
    the user's ``config`` file and ``VLLM_TRIAGE_*`` variables, which win; the simulated
    server's card and model (``scenario_facts``) over everything, since they are the
    truth of what is simulated."""
    base = {"slo": dict(scenario.slo)} if scenario.slo else None
    return load_settings(config, scenario_facts(scenario) or None, base=base)


def events_of(transitions: list[Transition], start_at: float) -> list[Event]:
    """Transitions as the self-check reads them: seconds since the scenario began."""
    return [Event(t.at - start_at, t.event, t.cause) for t in transitions]


def describe(scenario: Scenario) -> str:
    spec = scenario.spec
    load = scenario.phases[0].workload
    server = (
        f"{spec.gpu or f'{spec.memory_bandwidth_gb_s:g} GB/s'}, {scenario.model_name} "
        f"(16-bit), max_num_seqs {spec.max_num_seqs}, KV pool {spec.kv_pool_tokens:,} tokens"
    )
    if len(scenario.phases) > 1:
        text = f"{server}; {len(scenario.phases)} phases of load, {scenario.duration_s:g} s"
    else:
        text = (
            f"{server}; {load.arrival_rate_per_s:g} requests/s, prompts "
            f"~{load.prompt_tokens:,} tokens, outputs ~{load.output_tokens:,} tokens"
        )
    if scenario.slo:
        text += "; its own SLO: " + ", ".join(f"{k} {v:g}" for k, v in scenario.slo.items())
    return text


@dataclass(frozen=True, slots=True)
class ScenarioRun:
    name: str
    description: str
    transitions: list[Transition]
    scrapes: int
    #: What went differently from what the scenario was built to show (empty: as built).
    problems: tuple[str, ...] = ()

    @property
    def fired(self) -> list[Cause]:
        return [t.cause for t in self.transitions if t.event == "firing"]


def run_scenario(
    name: str,
    settings: Settings,
    *,
    duration_s: float,
    interval_s: float = 5.0,
    record_to: Path | None = None,
) -> ScenarioRun:
    """Simulate one scenario and diagnose every scrape of it, then check the transitions
    against what each phase was built to show (``demo.expectations``)."""
    scenario = get_scenario(name)
    evaluator = build_evaluator(settings)
    driver = Driver(evaluator, runtime_table())
    transitions: list[Transition] = []
    scrapes = 0
    if record_to is not None:
        record_to.mkdir(parents=True, exist_ok=True)
    for at, body in record(
        scenario, start_at=START_AT, interval_s=interval_s, duration_s=duration_s
    ):
        scrapes += 1
        if record_to is not None:
            write_scrape(record_to, round(at * 1000), body.encode())
        fed = driver.feed(body.encode(), at)
        if isinstance(fed, Unusable):  # the simulator writes what the parser reads
            raise fed.error
        transitions.extend(fed.evaluation.transitions)
    still = [a.cause for a in evaluator.incidents.active()]
    segs = segments(scenario, default=expected_of(name))
    found = problems(segs, events_of(transitions, START_AT), still_firing=still) if segs else []
    return ScenarioRun(name, describe(scenario), transitions, scrapes, tuple(found))


def expected_of(name: str) -> str | None:
    """A bundled single-cause scenario's cause (``healthy`` for ``healthy``), else None."""
    if name not in EXPECTED:
        return None
    return EXPECTED[name] or "healthy"


def run_demo(
    config: str | None,
    names: tuple[str, ...] = DEFAULT_SCENARIOS,
    *,
    duration_s: float | None = None,
    record_dir: Path | None = None,
) -> Iterator[ScenarioRun]:
    """Each scenario in turn, with its own settings (``scenario_settings``), for
    ``duration_s`` or its ``default_duration``."""
    for name in names:
        scenario = get_scenario(name)
        yield run_scenario(
            name,
            scenario_settings(scenario, config),
            duration_s=duration_s or default_duration(scenario),
            record_to=record_dir / name if record_dir is not None else None,
        )
