"""The bundled scenarios, recorded (and run through the offline demo) once per session.

``vllm_triage.simulator.record`` steps a physically modelled server in virtual time: the
tour's fifteen minutes take seconds of CPU, and many tests record the same scenario over
the same window. ``recorded`` keeps each recording (the scrapes' times and texts, which
are the same for the same inputs: the simulator is deterministic) for the session, so
that equal inputs are simulated once per test process.
"""

from __future__ import annotations

from pathlib import Path

from vllm_triage.demo.offline import ScenarioRun, run_scenario, scenario_settings
from vllm_triage.simulator import Naming, Scenario, get_scenario, record

#: 2026-01-01T00:00:00Z: the start of the recordings written by ``write_recording``.
START = 1_767_225_600.0

Recording = tuple[tuple[float, str], ...]


#: Recordings by their inputs. A scenario's key is its repr: scenarios are frozen
#: dataclasses, but one holds a dict (its SLOs), so they cannot be hashed themselves.
_RECORDINGS: dict[tuple[str, float, float, float | None, str, int], Recording] = {}


def recorded(
    scenario: str | Scenario,
    *,
    start_at: float,
    interval_s: float,
    duration_s: float | None = None,
    naming: Naming = "v1",
    engines: int = 1,
) -> Recording:
    """``record``'s scrapes, ``(unix seconds, /metrics text)``, simulated once per session
    for equal inputs. A scenario is named (a bundled one, or a YAML file's path) or given
    (scenarios are frozen dataclasses: equal ones share the recording)."""
    chosen = get_scenario(scenario) if isinstance(scenario, str) else scenario
    key = (repr(chosen), float(start_at), float(interval_s), duration_s, naming, engines)
    if key not in _RECORDINGS:
        _RECORDINGS[key] = tuple(
            record(
                chosen,
                start_at=start_at,
                interval_s=interval_s,
                duration_s=duration_s,
                naming=naming,
                engines=engines,
            )
        )
    return _RECORDINGS[key]


#: The offline demo's runs by (scenario, duration).
_RUNS: dict[tuple[str, float], ScenarioRun] = {}


def offline_run(name: str, *, duration_s: float) -> ScenarioRun:
    """``demo.offline.run_scenario`` under the scenario's own settings (as ``demo
    --offline`` runs it), once per session for each (scenario, duration). Read it only."""
    key = (name, float(duration_s))
    if key not in _RUNS:
        settings = scenario_settings(get_scenario(name), None)
        _RUNS[key] = run_scenario(name, settings, duration_s=duration_s)
    return _RUNS[key]


def write_recording(
    directory: Path,
    scenario: str | Scenario,
    *,
    duration: float = 300.0,
    naming: Naming = "v1",
    start: float = START,
    interval: float = 5.0,
) -> Path:
    """The scenario recorded into ``directory`` as ``vllm-triage record`` writes it: one
    ``<unix ms>.prom`` file per scrape."""
    directory.mkdir(parents=True, exist_ok=True)
    rec = recorded(
        scenario, start_at=start, interval_s=interval, duration_s=duration, naming=naming
    )
    for at, body in rec:
        (directory / f"{round(at * 1000)}.prom").write_text(body, encoding="utf-8")
    return directory
