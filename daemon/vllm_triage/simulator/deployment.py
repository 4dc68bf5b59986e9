"""One vLLM server as deployed: its API server and its data-parallel engines, driven
through a scenario's phases in virtual time.

``simulation`` holds one per scenario (or one per share of the load with its
``engines=`` split). Each ``advance_to`` takes the events up to the instant in time
order: a phase's start (a server swap, hangs, sleeps, aborts, stale gauges, a counter
reset, for each engine as the phase says) and each request as an engine gets it, after
the API server rendered it (``frontend.rendered``, when the server models render time)
and picked an engine (``frontend.Balancer``, with several engines). Then every engine
steps to the instant.
"""

from __future__ import annotations

from collections.abc import Iterator

from vllm_triage.simulator.engine import Engine
from vllm_triage.simulator.frontend import Balancer, FrontendStats, rendered
from vllm_triage.simulator.scenarios import EnginePhase, Phase, Scenario
from vllm_triage.simulator.spec import Arrival, ServerSpec


def _clients(scenario: Scenario, part: int, parts: int) -> Iterator[tuple[Arrival, ServerSpec]]:
    """Every phase's arrivals in time order, each with the server it meets."""
    start = 0.0
    for index, phase in enumerate(scenario.phases):
        end = start + phase.duration_s
        spec = phase.spec or scenario.spec
        key = f"{scenario.name}/{index}"
        for arrival in phase.workload.arrivals(start, end, key=key, part=part, parts=parts):
            yield arrival, spec
        start = end


def _catch_up(engine: Engine, start: float) -> None:
    """Step ``engine`` to a phase's ``start`` before changing it (not back in time)."""
    engine.advance_to(max(start, engine.now))


class Deployment:
    """A scenario's server: ``data_parallel_size`` engines behind one API server.

    ``part`` of ``parts`` takes that share of the scenario's arrivals (``Simulation``'s
    static split; one engine each then). ``frontend`` may be shared by the parts of
    one model, whose render histograms are one.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        part: int = 0,
        parts: int = 1,
        keep_records: bool = False,
        frontend: FrontendStats | None = None,
    ) -> None:
        spec = scenario.spec
        size = spec.data_parallel_size
        if parts > 1 and size > 1:
            raise ValueError("split the load over engines with data_parallel_size, not both")
        self.scenario = scenario
        self.engines = [Engine(spec, keep_records=keep_records) for _ in range(size)]
        self.frontend = frontend if frontend is not None else FrontendStats()
        self._balancer = Balancer(size) if size > 1 else None
        self._renders = any((p.spec or spec).renders for p in scenario.phases)
        clients = _clients(scenario, part, parts)
        self._arrivals: Iterator[Arrival] = (
            rendered(clients, spec.api_server_count)
            if self._renders
            else (arrival for arrival, _ in clients)
        )
        self._next: Arrival | None = None
        self._done = False  # no arrival left
        self._starts: list[tuple[float, Phase]] = []
        start = 0.0
        for phase in scenario.phases:
            self._starts.append((start, phase))
            start += phase.duration_s
        # What each engine was last told: its server, hang, sleep level, stale gauges.
        self._specs = [spec] * size
        self._states = [EnginePhase(rank) for rank in range(size)]

    def advance_to(self, t: float) -> None:
        """Take every event up to ``t`` in time order, then step every engine to ``t``."""
        while True:
            arrival = self._peek()
            phase_at = self._starts[0][0] if self._starts else float("inf")
            if phase_at <= t and (arrival is None or phase_at <= arrival.at_s):
                self._enter(*self._starts.pop(0))
            elif arrival is not None and arrival.at_s <= t:
                self._next = None
                self._dispatch(arrival)
            else:
                break
        for engine in self.engines:
            engine.advance_to(t)

    def _peek(self) -> Arrival | None:
        if self._next is None and not self._done:
            self._next = next(self._arrivals, None)
            self._done = self._next is None
        return self._next

    def _dispatch(self, arrival: Arrival) -> None:
        if self._renders:
            self.frontend.observe(arrival.request_type, arrival.at_s - arrival.sent_at)
        rank = 0
        if self._balancer is not None:
            tick = self._balancer.due(arrival.at_s)
            if tick is not None:
                for engine in self.engines:
                    engine.advance_to(max(tick, engine.now))
                self._balancer.publish(tick, [e.published_load for e in self.engines])
            rank = self._balancer.choose()
        self.engines[rank].submit(arrival)

    def _enter(self, start: float, phase: Phase) -> None:
        """Apply what changes at a phase's start, engine by engine, in this order: the
        server, a hang, a counter reset, stale gauges (before the aborts, so that they
        keep the values from before), aborts, sleep."""
        spec = phase.spec or self.scenario.spec
        if phase.reset_counters:
            self.frontend.reset(start)
        for rank, engine in enumerate(self.engines):
            was, now = self._states[rank], phase.engine(rank)
            self._states[rank] = now
            if spec != self._specs[rank]:
                _catch_up(engine, start)
                engine.reconfigure(spec)
                self._specs[rank] = spec
            if now.hang != engine.hung:
                _catch_up(engine, start)
                if now.hang:
                    engine.hang()
                else:
                    engine.resume()
            if phase.reset_counters:
                _catch_up(engine, start)
                engine.reset_stats()
            if now.stale_gauges != was.stale_gauges:
                _catch_up(engine, start)
                if now.stale_gauges:
                    engine.freeze_gauges()
                else:
                    engine.thaw_gauges()
            if now.abort_fraction > 0:
                _catch_up(engine, start)
                engine.abort(now.abort_fraction)
            if now.sleep_level != was.sleep_level:
                _catch_up(engine, start)
                engine.sleep(now.sleep_level)
