"""Time that moves only when told: for code that takes a ``clock`` and a ``sleep`` (a
recording, ``check``, the probe), and for a simulated server that follows the same clock
(``support.harness.simulated_on``), so that a test of what they decide waits for nothing."""

from __future__ import annotations


class FakeClock:
    """Unix seconds, starting at ``start``; ``sleep`` moves them on at once."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
