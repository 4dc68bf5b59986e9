"""A deterministic vLLM server simulator in virtual time, for tests and demos.

``engine`` models continuous batching on a card's compute and bandwidth limits
(``/work/shared/domain.md``), ``stats`` holds what it counts, ``exposition`` writes
what vLLM's ``/metrics`` would show (V1 or V0 names), ``scenarios`` names loads that
produce each diagnosis and records scrapes of them. No clock, no network, no globals:
the same seed gives the same text.
"""

from daemon.simulator.engine import Arrival, Engine, ServerSpec, Workload
from daemon.simulator.exposition import Naming, format_value, render
from daemon.simulator.scenarios import (
    SCENARIOS,
    Phase,
    Scenario,
    Simulation,
    get_scenario,
    llama_8b,
    record,
)
from daemon.simulator.stats import (
    FINISHED_REASONS,
    EngineStats,
    FinishedReason,
    Histogram,
    RequestRecord,
)

__all__ = [
    "FINISHED_REASONS",
    "SCENARIOS",
    "Arrival",
    "Engine",
    "EngineStats",
    "FinishedReason",
    "Histogram",
    "Naming",
    "Phase",
    "RequestRecord",
    "Scenario",
    "ServerSpec",
    "Simulation",
    "Workload",
    "format_value",
    "get_scenario",
    "llama_8b",
    "record",
    "render",
]
