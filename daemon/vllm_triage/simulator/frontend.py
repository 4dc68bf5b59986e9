"""The API server in front of the engines: it renders each request, then picks an engine.

What happens to a request before any engine sees it, in vLLM 0.34:

- **Render.** An API-server process applies the chat template, tokenizes the prompt and
  preprocesses images; that is CPU work, one request at a time per process. The
  simulator charges ``render_overhead_s + render_s_per_token x prompt tokens`` per
  request and serves the requests first come, first served by ``api_server_count``
  processes (``RenderQueue``): a shared queue, as processes that accept from one
  listening socket take the next connection when they are free. Under a load of long
  prompts or images a single process falls behind and requests queue in the frontend.
  ``vllm:request_render_duration_seconds`` (no ``engine`` label) observes each request
  once rendered; the simulator observes the wall time from the request's arrival to the
  end of its render, so the time it waited for a busy process is in it (what a timer
  around an awaited render reads when the process is busy). TTFT and e2e latency count
  from the arrival, so TTFT = render + queue + prefill; the queue histogram starts when
  the engine gets the request.
- **Load balancing** (``Balancer``) with ``data_parallel_size`` > 1: the engine with the
  lowest ``4 x waiting + running``, ties to the lowest rank, from the counts the engines
  last published (every 100 ms while they change, every 5 s otherwise), plus one waiting
  request for each one sent there since. A hung or sleeping engine publishes nothing new,
  so it keeps the score it last had: an idle one that went to sleep looks the least
  loaded of all and is sent requests, which wait.

With ``api_server_count`` > 1 vLLM sums counters and histograms over the processes and
shows gauges as the most recent process wrote them, which reads the same as one process
here. Each process balances with its own view in vLLM; the simulator keeps one view.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from vllm_triage.simulator.buckets import RENDER_V034
from vllm_triage.simulator.spec import Arrival, RequestType, ServerSpec
from vllm_triage.simulator.stats import Histogram

#: The coordinator's publishing intervals: while the counts change, and when they don't.
PUBLISH_S = 0.1
IDLE_PUBLISH_S = 5.0


@dataclass(slots=True)
class FrontendStats:
    """What the API server counts: render time by ``request_type``, each series created
    at its first observation (as vLLM registers the histogram lazily)."""

    created_s: float = 0.0
    render: dict[RequestType, Histogram] = field(default_factory=dict)

    def observe(self, request_type: RequestType, seconds: float) -> None:
        hist = self.render.get(request_type)
        if hist is None:
            hist = self.render[request_type] = Histogram(RENDER_V034)
        hist.observe(seconds)

    def reset(self, at_s: float) -> None:
        """Every series starts again, absent until observed (an in-process reset)."""
        self.created_s = at_s
        self.render = {}


class RenderQueue:
    """``processes`` API-server processes rendering requests first come, first served."""

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError("need at least one API-server process")
        self._free = [0.0] * processes  # when each process is next free (a heap)
        self._done: list[tuple[float, int, Arrival]] = []  # rendered, by end time
        self._count = 0

    def put(self, arrival: Arrival, render_s: float) -> None:
        """Render ``arrival`` on the first process free after it arrived."""
        start = max(arrival.at_s, heapq.heappop(self._free))
        end = start + render_s
        heapq.heappush(self._free, end)
        rendered = dataclasses.replace(arrival, at_s=end, sent_s=arrival.sent_at)
        heapq.heappush(self._done, (end, self._count, rendered))
        self._count += 1

    def take(self, until_s: float) -> Iterator[Arrival]:
        """The requests rendered by ``until_s``, in the order their renders ended."""
        while self._done and self._done[0][0] <= until_s:
            yield heapq.heappop(self._done)[2]


def rendered(clients: Iterable[tuple[Arrival, ServerSpec]], processes: int) -> Iterator[Arrival]:
    """``clients`` (arrivals in time order, each with the server it meets) as the engines
    get them: after their render, in the order the renders end. A render cannot end
    before the next arrival starts being rendered, so each is yielded once no later
    arrival could end first."""
    queue = RenderQueue(processes)
    for arrival, spec in clients:
        yield from queue.take(arrival.at_s)
        queue.put(arrival, spec.render_s(arrival.prompt_tokens))
    yield from queue.take(float("inf"))


class Balancer:
    """vLLM's internal data-parallel load balancing over ``engines`` ranks."""

    def __init__(self, engines: int) -> None:
        self._counts = [[0, 0] for _ in range(engines)]  # [waiting, running] as seen
        self._published: list[tuple[int, int]] = [(0, 0)] * engines
        self._published_at = 0.0
        self._looked_at = 0.0

    def due(self, t: float) -> float | None:
        """The coordinator's last tick at or before ``t``, if not yet looked at: the
        caller brings the engines there and calls ``publish``."""
        tick = min(t, int(t / PUBLISH_S) * PUBLISH_S)
        return tick if tick > self._looked_at else None

    def publish(self, tick: float, loads: list[tuple[int, int]]) -> None:
        """The engines' (waiting, running) at ``tick``; the coordinator sends them when
        they changed, or when it has been quiet for ``IDLE_PUBLISH_S``."""
        self._looked_at = tick
        if loads != self._published or tick - self._published_at >= IDLE_PUBLISH_S:
            self._published = list(loads)
            self._published_at = tick
            self._counts = [[w, r] for w, r in loads]

    def choose(self) -> int:
        """The rank to send the next request to; it counts as waiting there until the
        next publication."""
        scores = [4 * waiting + running for waiting, running in self._counts]
        rank = scores.index(min(scores))
        self._counts[rank][0] += 1
        return rank
