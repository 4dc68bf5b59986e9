"""The faults of a deployed engine besides a hang, as an ``Engine`` mixin.

Kept apart from ``engine`` (the scheduler) to keep each module small; ``simulation``
applies them by scenario phase.

- **Sleep** (``sleep``/``wake``, ``--enable-sleep-mode``): after the step in flight the
  engine stops stepping; level 1 offloads the weights, level 2 discards them, and both
  drop the KV cache, so requests that were running go back to the front of the queue and
  recompute on wake. Its gauges and counters stay where the last step left them;
  requests sent to it wait.
- **Aborts** (``abort``): clients cancel a share of the requests, the longest waiting
  first, between two steps; they count as ``finished_reason="abort"`` and in no
  per-request histogram.
- **Stale gauges** (``freeze_gauges``): vLLM issues #22545 and #29928, where after mass
  aborts the running, waiting and KV gauges keep their values while the engine goes on
  serving, its counters and histograms moving.
- **Counter reset** (``reset_stats``): every counter and histogram starts again from 0
  inside the live process, as when vLLM re-creates its stat loggers (elastic
  expert-parallel scale-up).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from vllm_triage.simulator.stats import EngineStats
from vllm_triage.simulator.step import Request, Step

Gauges = tuple[int, int, float]


class EngineFaults:
    """Sleep, aborts, stale gauges and a counter reset; ``Engine`` holds the state."""

    stats: EngineStats
    sleep_level: int
    _sleep_asked: int
    _asleep: Gauges | None
    _stale: Gauges | None
    _abort_asked: float
    _hung: tuple[float, int, int, float] | None
    _inflight: Step | None
    _now: float
    _horizon: float
    _free_blocks: int
    _pending: deque[Request]
    _waiting: deque[Request]
    _running: list[Request]
    #: What a scrape sees now: running, waiting, KV usage (``Engine``'s method).
    _gauges: Callable[[], Gauges]

    @property
    def asleep(self) -> bool:
        return self.sleep_level > 0

    def sleep(self, level: int) -> None:
        """Fall asleep at ``level`` (1 or 2) once the step in flight is done (at once if
        none is); asleep already: only the level changes. Level 0 is ``wake``."""
        if level == 0:
            self.wake()
        elif self.asleep:
            self.sleep_level = level
        else:
            self._sleep_asked = level
            if self._inflight is None and self._hung is None:
                self._fall_asleep()

    def wake(self) -> None:
        """Step again from ``now``, and drop a sleep not yet taken."""
        self._sleep_asked = 0
        if self.asleep:
            self.sleep_level = 0
            self._asleep = None
            self._now = max(self._now, self._horizon)

    def _fall_asleep(self) -> None:
        self._asleep = self._gauges()
        self.sleep_level, self._sleep_asked = self._sleep_asked, 0
        for req in reversed(self._running):  # the KV cache is dropped: recompute on wake
            self._free_blocks += req.blocks
            req.blocks = req.computed = req.target = 0
            self._waiting.appendleft(req)
        self._running = []

    def abort(self, share: float) -> None:
        """Clients cancel ``share`` of the requests here (running, waiting), the longest
        waiting first, once the step in flight is done (at once if none is)."""
        self._abort_asked = max(self._abort_asked, share)
        if self._inflight is None and self._hung is None:
            self._apply_abort(self._horizon)

    def _apply_abort(self, at: float) -> None:
        arrived = [r for r in self._pending if r.arrival <= at]
        present = sorted([*self._running, *self._waiting, *arrived], key=lambda r: r.arrival)
        gone = {id(r) for r in present[: round(self._abort_asked * len(present))]}
        self._abort_asked = 0.0
        for req in present:
            if id(req) in gone:
                self._free_blocks += req.blocks
                req.blocks = 0
                self.stats.finished["abort"] += 1
        self._running = [r for r in self._running if id(r) not in gone]
        self._waiting = deque(r for r in self._waiting if id(r) not in gone)
        self._pending = deque(r for r in self._pending if id(r) not in gone)

    def freeze_gauges(self) -> None:
        """The running, waiting and KV gauges keep their values from now on, however the
        engine goes (#22545, #29928); ``thaw_gauges`` lets them move again."""
        if self._stale is None:
            self._stale = self._gauges()

    def thaw_gauges(self) -> None:
        self._stale = None

    def reset_stats(self) -> None:
        """Every counter and histogram starts again from 0, now (the process lives on)."""
        self.stats = EngineStats(created_s=self._horizon)
