"""Running scenarios: engines fed their phases' arrivals, and ``record``, scrapes in virtual time.

Kept apart from ``scenarios`` (what a scenario is) and ``scenario_files`` (reading them
from YAML) so that each stays small: this module only turns a ``Scenario`` into
``/metrics`` text at chosen instants, for ``record`` (a recording, no waiting) and for
``vllm_triage.simulator.serve`` (a live endpoint that follows the wall clock).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from vllm_triage.simulator.engine import Arrival, Engine, ServerSpec
from vllm_triage.simulator.exposition import Naming, render
from vllm_triage.simulator.scenario_files import get_scenario
from vllm_triage.simulator.scenarios import Scenario


class _Feed:
    """One engine's arrivals over all phases, pulled up to an instant."""

    def __init__(self, scenario: Scenario, part: int, parts: int) -> None:
        self._streams: list[tuple[float, ServerSpec, bool, Iterator[Arrival]]] = []
        start = 0.0
        for index, phase in enumerate(scenario.phases):
            end = start + phase.duration_s
            key = f"{scenario.name}/{index}"
            stream = phase.workload.arrivals(start, end, key=key, part=part, parts=parts)
            self._streams.append((start, phase.spec or scenario.spec, phase.hang, stream))
            start = end
        self._next: Arrival | None = None
        self._spec = scenario.spec

    def drive(self, engine: Engine, t: float) -> None:
        """Submit what arrives by ``t`` and step ``engine`` to ``t``, swapping servers and
        hanging or resuming the engine on time."""
        while self._streams and self._streams[0][0] <= t:
            start, spec, hang, stream = self._streams[0]
            if spec != self._spec:
                engine.advance_to(max(start, engine.now))
                engine.reconfigure(spec)
                self._spec = spec
            if hang != engine.hung:
                engine.advance_to(max(start, engine.now))
                if hang:
                    engine.hang()
                else:
                    engine.resume()
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
