"""Running scenarios: engines fed their phases' arrivals, and ``record``, scrapes in virtual time.

Kept apart from ``scenarios`` (what a scenario is) and ``scenario_files`` (reading them
from YAML) so that each stays small: this module only turns a ``Scenario`` into
``/metrics`` text at chosen instants, for ``record`` (a recording, no waiting) and for
``vllm_triage.simulator.serve`` (a live endpoint that follows the wall clock).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from vllm_triage.simulator.deployment import Deployment
from vllm_triage.simulator.engine import Engine
from vllm_triage.simulator.exposition import Naming, render
from vllm_triage.simulator.frontend import FrontendStats
from vllm_triage.simulator.scenario_files import get_scenario
from vllm_triage.simulator.scenarios import Scenario


class Simulation:
    """Scenarios (one model each) run side by side, each a ``Deployment``.

    A scenario's server has ``data_parallel_size`` engines, which its API server feeds
    by load. ``engines`` > 1 instead splits each scenario's arrivals statically over
    that many one-engine deployments (a 1/engines share each, as an even external load
    balancer would); the two do not combine. ``advance_to`` then ``render`` gives one
    scrape.
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
        self.frontends: list[tuple[str, FrontendStats]] = []
        self._deployments: list[Deployment] = []
        for sc in chosen:
            frontend = FrontendStats()
            self.frontends.append((sc.model_name, frontend))
            for part in range(engines):
                deployment = Deployment(
                    sc, part=part, parts=engines, keep_records=keep_records, frontend=frontend
                )
                self._deployments.append(deployment)
                self.engines.extend((sc.model_name, engine) for engine in deployment.engines)

    @property
    def duration_s(self) -> float:
        return max(s.duration_s for s in self.scenarios)

    def advance_to(self, t: float) -> None:
        """Step every engine to virtual time ``t`` (seconds since the start)."""
        for deployment in self._deployments:
            deployment.advance_to(t)

    def render(self, *, created_at: float, naming: Naming = "v1") -> str:
        """The ``/metrics`` text now; ``created_at`` is the unix time of t = 0."""
        return render(self.engines, created_at=created_at, naming=naming, frontends=self.frontends)


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
    minutes take seconds of CPU. A name is looked up with ``get_scenario`` (a bundled
    scenario or a path to a YAML file).
    """
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    chosen = get_scenario(scenario) if isinstance(scenario, str) else scenario
    sim = Simulation(chosen, engines=engines)
    end = sim.duration_s if duration_s is None else duration_s
    if math.isinf(end):
        raise ValueError("an endless scenario needs a duration_s to record")
    tick = 0
    while tick * interval_s <= end + 1e-9:
        t = tick * interval_s
        sim.advance_to(t)
        yield start_at + t, sim.render(created_at=start_at, naming=naming)
        tick += 1
