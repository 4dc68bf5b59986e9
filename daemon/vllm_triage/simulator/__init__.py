"""A deterministic vLLM server simulator in virtual time, for tests and demos.

``spec`` says what a server and its load are, ``engine`` models continuous batching on a
card's compute and bandwidth limits (``docs/physics.md``; ``step`` prices a step,
``faults`` adds sleep, aborts, stale gauges and counter resets to the hang), ``stats``
holds what it counts, ``frontend`` is the API server in front of the engines (render
time, the data-parallel load balancer), ``deployment`` drives one server's engines
through a scenario, ``exposition`` writes what vLLM's ``/metrics`` would show (V1 or V0
names; ``deployed_families`` the sleep and render series, ``textformat`` the text
format), ``scenarios`` says what a scenario is, ``scenario_files`` reads them from YAML
(the bundled ones in ``rules/scenarios/``, each producing one diagnosis, or a user's
file), ``simulation`` runs them and records scrapes, and ``serve`` puts one behind a live
``/metrics`` endpoint. Apart from ``serve``: no clock, no network, no globals, and the
same seed gives the same text.
"""

from vllm_triage.simulator.deployment import Deployment
from vllm_triage.simulator.engine import Arrival, Engine, ServerSpec, Workload
from vllm_triage.simulator.exposition import Naming, format_value, render
from vllm_triage.simulator.frontend import FrontendStats
from vllm_triage.simulator.scenario_files import (
    SCENARIOS,
    get_scenario,
    load_scenario_file,
    parse_scenario,
    scenario_names,
)
from vllm_triage.simulator.scenarios import (
    LLAMA_8B,
    EnginePhase,
    Phase,
    Scenario,
    hold_last_phase,
    llama_8b,
    server_spec,
)
from vllm_triage.simulator.simulation import Simulation, record
from vllm_triage.simulator.stats import (
    FINISHED_REASONS,
    EngineStats,
    FinishedReason,
    Histogram,
    RequestRecord,
)

__all__ = [
    "FINISHED_REASONS",
    "LLAMA_8B",
    "SCENARIOS",
    "Arrival",
    "Deployment",
    "Engine",
    "EnginePhase",
    "EngineStats",
    "FinishedReason",
    "FrontendStats",
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
    "hold_last_phase",
    "llama_8b",
    "load_scenario_file",
    "parse_scenario",
    "record",
    "render",
    "scenario_names",
    "server_spec",
]
