"""Time that moves only when told: for code that takes a ``clock`` and a ``sleep`` (a
recording, ``check``, the probe), and for a simulated server that follows the same clock
(``support.harness.simulated_on``), so that a test of what they decide waits for nothing."""

from __future__ import annotations

import asyncio


class FakeClock:
    """Unix seconds, starting at ``start``; ``sleep`` moves them on at once (``asleep``
    for asyncio code, yielding to the loop once), and ``slept`` keeps every wait asked."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)
