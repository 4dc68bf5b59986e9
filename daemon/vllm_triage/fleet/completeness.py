"""Whether a tick's answers can be judged as whole (``docs/deploy.md``, "Answers that
may be missing data").

A server whose answers may be missing data is "cannot tell" this tick: not judged, so
no incident opens or resolves from data that did not come; its last verdict stands.
The reasons, as ``vllm_triage_fleet_servers_cannot_tell`` labels them:

- ``partial``: an answer of its piece (or an index call) said it is partial
  (``fleet.answers``);
- ``series_drop``: the tick's rows fell far below the last judged tick's (``SeriesDrop``);
- ``duplicated``: one of its engines has two series or more (``copies`` query);
- ``split``: its series came in two pieces (they changed shard bucket in the window).
"""

from __future__ import annotations

from dataclasses import dataclass

REASONS = ("partial", "series_drop", "duplicated", "split")


@dataclass(slots=True)
class SeriesDrop:
    """A tick's row count against the last judged tick's. A count below ``ratio`` times
    the baseline is a drop: data missing that no answer said was missing (a store that
    answered empty, a querier that lost a replica), unless it holds: the ``ticks``-th
    such tick in a row is a real scale-down and becomes the baseline."""

    ratio: float
    ticks: int
    baseline: int | None = None
    #: Consecutive ticks below the baseline so far.
    low: int = 0

    def dropped(self, rows: int) -> bool:
        """Whether ``rows`` must not be judged; otherwise it is the new baseline."""
        base = self.baseline
        if base is not None and rows < self.ratio * base:
            self.low += 1
            if self.low < self.ticks:
                return True
        self.baseline, self.low = rows, 0
        return False
