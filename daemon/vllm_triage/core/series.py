"""The one chart accumulator: a model's evaluations as columns of numbers, bounded.

The live status page keeps the last hour of each model in one (``state.History``), the
post-mortem report a whole recording (its capacity is the recording's length). A ring of
fixed capacity is allocated once: a float64 column of times, one column per charted key
and one reference per point to its cause (an interned string). The status page keeps its
columns as float32 (``typecode="f"``: 13 keys at a 5 s interval is about 50 KB per model
for an hour, and it never grows); the report keeps float64, so that what it prints is the
evaluation's number to the last digit.

Pure: no lock (the caller that shares one across threads holds its own), no clock.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class ChartPoints:
    """A copy of a ring's points since some time, oldest first (None where unknown).
    ``step``: the seconds one point stands for when the ring keeps one per step
    (``Ring.amend``); 0 when every evaluation is a point."""

    times: list[float]
    columns: dict[str, list[float | None]]
    causes: list[str | None]
    step: float = 0.0


class Ring:
    """The last ``capacity`` points of one model.

    Every column lives in one array (key after key, ``capacity`` points each): a fleet
    keeps a ring per server, and an array per column cost a header and a dict entry each
    (about 1.5 KB a ring of 13 keys at 61 points)."""

    __slots__ = ("_causes", "_next", "_size", "_times", "_values", "capacity", "keys")

    def __init__(self, keys: tuple[str, ...], capacity: int, *, typecode: str = "f") -> None:
        if capacity < 1:
            raise ValueError("a ring holds at least one point")
        self.keys = keys
        self.capacity = capacity
        self._times = array("d", [NAN]) * capacity
        self._values = array(typecode, [NAN]) * (capacity * len(keys))
        self._causes: list[str | None] = [None] * capacity
        self._next = 0  # where the next point goes
        self._size = 0

    def append(self, at: float, values: Mapping[str, float], cause: str | None) -> None:
        i = self._next
        self._write(i, at, values)
        self._causes[i] = cause
        self._next = (i + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def amend(self, at: float, values: Mapping[str, float], cause: str | None) -> None:
        """Replace the newest point by a later evaluation of the same step (a ring that
        keeps one point per step): its time and numbers become the later one's; its cause
        too, unless the later one has none, so that a breach inside the step stays shown
        (as ``timeline.for_display`` keeps a thinned slice's last cause)."""
        if self._size == 0:
            self.append(at, values, cause)
            return
        i = (self._next - 1) % self.capacity
        self._write(i, at, values)
        if cause is not None:
            self._causes[i] = cause

    def _write(self, i: int, at: float, values: Mapping[str, float]) -> None:
        self._times[i] = at
        column, capacity = self._values, self.capacity
        for n, key in enumerate(self.keys):
            column[n * capacity + i] = values.get(key, NAN)

    @property
    def newest(self) -> float | None:
        return None if self._size == 0 else self._times[(self._next - 1) % self.capacity]

    def __len__(self) -> int:
        return self._size

    def window(self, since: float = -math.inf, *, step: float = 0.0) -> ChartPoints:
        start = (self._next - self._size) % self.capacity
        order = [(start + j) % self.capacity for j in range(self._size)]
        order = [i for i in order if self._times[i] >= since]
        return ChartPoints(
            times=[self._times[i] for i in order],
            columns={k: self._column(n, order) for n, k in enumerate(self.keys)},
            causes=[self._causes[i] for i in order],
            step=step,
        )

    def _column(self, n: int, order: list[int]) -> list[float | None]:
        """Key ``n``'s points at ``order`` (None where unknown)."""
        base, values = n * self.capacity, self._values
        points = [values[base + i] for i in order]
        return [None if math.isnan(v) else v for v in points]

    @property
    def nbytes(self) -> int:
        """Bytes of the columns (preallocated: the same from the first point on)."""
        per_point = self._times.itemsize + len(self.keys) * self._values.itemsize + 8
        return per_point * self.capacity
