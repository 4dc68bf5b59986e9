"""Targets as their scrape loop leaves them, built in virtual time from a bundled
simulator scenario: for the exporter, the API, the listener and the demo's view."""

from __future__ import annotations

from vllm_triage.assemble import build_target
from vllm_triage.config.load import load_settings
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.demo.offline import START_AT, scenario_facts
from vllm_triage.rules import runtime_table
from vllm_triage.simulator import get_scenario
from vllm_triage.state import TargetState

from support.scenarios import recorded

#: Every bundled scenario serves this one model.
MODEL = get_scenario("kv_pressure").model_name


def watched(
    scenario: str, *, name: str | None = None, duration_s: float = 60.0, facts: bool = True
) -> TargetState:
    """A target's state as its scrape loop leaves it after scraping the simulated
    ``scenario`` every 5 s for ``duration_s`` (the core told the scenario's hardware, as
    the demo does)."""
    sc = get_scenario(scenario)
    settings = load_settings(None, (scenario_facts(sc) if facts else None) or None)
    target = build_target(
        settings, name or scenario, f"http://127.0.0.1:1/{scenario}", notifier=None
    )
    parser = SnapshotParser(runtime_table())
    for at, body in recorded(sc, start_at=START_AT, interval_s=5.0, duration_s=duration_s):
        target.state.attempted(at, 0.012)
        target.consume(parser.parse(body, at))
        assert target.state.view is not None and target.state.view.evaluation.accepted
    return target.state
