"""The status page's and the report's incidents (daemon/vllm_triage/core/timeline.py) from a
simulated incident, judged as the daemon judges it (the pure parts: tests/core/test_timeline.py)."""

from __future__ import annotations

from vllm_triage.assemble import build_evaluator
from vllm_triage.config.load import load_settings
from vllm_triage.core.model import Transition
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.core.timeline import breach_began, incidents, point_values
from vllm_triage.rules import runtime_table

from support.scenarios import recorded


def test_a_simulated_incident_from_end_to_end() -> None:
    """The simulator's kv_pressure scenario through the real core: the incident's breach
    began before it fired (open_after evaluations), and the points show the KV cache."""
    settings = load_settings()
    evaluator = build_evaluator(settings)
    parser = SnapshotParser(runtime_table())
    times: list[float] = []
    causes: list[str | None] = []
    usage: list[float | None] = []
    transitions: list[Transition] = []
    for at, body in recorded("kv_pressure", start_at=0.0, interval_s=5.0, duration_s=300):
        ev = evaluator.step(parser.parse(body, at))
        for model, d in ev.diagnoses.items():
            times.append(at)
            causes.append(d.cause)
            usage.append(
                point_values(ev.measurements[model], ("kv_usage_max",)).get("kv_usage_max")
            )
        transitions.extend(ev.transitions)
    (first, *_) = incidents(transitions)
    assert first.cause == "kv_pressure"
    began = breach_began(times, causes, first.started_at)
    assert began is not None
    assert first.started_at - began >= 5.0 * (settings.incident.open_after - 1)
    assert max(u for u in usage if u is not None) > 0.9
