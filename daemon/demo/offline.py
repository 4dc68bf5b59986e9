"""The built-in demo: each simulated situation, diagnosed by the same core as a live run.

No GPU and no vLLM needed: ``daemon.simulator`` steps a physically modelled vLLM server
in virtual time and renders its /metrics exactly as vLLM does; each scrape goes through
the parser, the window, the classifier and the incident tracker, as ``replay`` would
take it. Each scenario runs on its own hardware (from rules/gpus.yaml), and the core is
told that hardware, so the decode ceiling in the evidence is the simulated card's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from daemon.assemble import build_evaluator, build_rulebook
from daemon.ceiling.resolve import build_ceiling
from daemon.core.model import Cause, Transition
from daemon.core.parse import SnapshotParser
from daemon.core.rulebook import Ceiling
from daemon.recording import write_atomically
from daemon.settings import Settings
from daemon.simulator import Scenario, get_scenario, record

#: The demo's order: a healthy baseline, then one scenario per cause.
DEFAULT_SCENARIOS = ("healthy", "prefill_bound", "decode_bound", "queue_bound", "kv_pressure")
EXPECTED: dict[str, Cause | None] = {
    "healthy": None,
    "prefill_bound": "prefill_bound",
    "decode_bound": "decode_bound",
    "queue_bound": "queue_bound",
    "kv_pressure": "kv_pressure",
}
#: 2026-01-01T00:00:00Z: a fixed start, so every run of the demo prints the same thing.
START_AT = 1_767_225_600.0


def describe(scenario: Scenario) -> str:
    spec = scenario.spec
    load = scenario.phases[0].workload
    return (
        f"{spec.gpu or f'{spec.memory_bandwidth_gb_s:g} GB/s'}, {scenario.model_name} "
        f"(16-bit), max_num_seqs {spec.max_num_seqs}, KV pool {spec.kv_pool_tokens:,} tokens; "
        f"{load.arrival_rate_per_s:g} requests/s, prompts ~{load.prompt_tokens:,} tokens, "
        f"outputs ~{load.output_tokens:,} tokens"
    )


def ceiling_of(scenario: Scenario) -> Ceiling:
    spec = scenario.spec
    return build_ceiling(spec.gpu or None, spec.memory_bandwidth_gb_s, spec.weight_bytes)


@dataclass(frozen=True, slots=True)
class ScenarioRun:
    name: str
    description: str
    transitions: list[Transition]
    scrapes: int

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
    """Simulate one scenario and diagnose every scrape of it."""
    scenario = get_scenario(name)
    rulebook = dataclasses.replace(build_rulebook(settings), ceiling=ceiling_of(scenario))
    evaluator = build_evaluator(settings, rulebook)
    parser = SnapshotParser()
    transitions: list[Transition] = []
    scrapes = 0
    if record_to is not None:
        record_to.mkdir(parents=True, exist_ok=True)
    for at, body in record(
        scenario, start_at=START_AT, interval_s=interval_s, duration_s=duration_s
    ):
        scrapes += 1
        if record_to is not None:
            write_atomically(record_to, round(at * 1000), body.encode())
        transitions.extend(evaluator.step(parser.parse(body, at)).transitions)
    return ScenarioRun(name, describe(scenario), transitions, scrapes)


def run_demo(
    settings: Settings,
    names: tuple[str, ...] = DEFAULT_SCENARIOS,
    *,
    duration_s: float = 300.0,
    record_dir: Path | None = None,
) -> Iterator[ScenarioRun]:
    for name in names:
        yield run_scenario(
            name,
            settings,
            duration_s=duration_s,
            record_to=record_dir / name if record_dir is not None else None,
        )
