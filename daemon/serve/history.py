"""The status page's memory: the last hour of evaluations per target and model, bounded.

Each model of a target gets a ring of fixed capacity (``history_seconds`` / the scrape
interval, plus one), allocated once: a float64 column of times, one float32 column per
charted key and one reference per point to its cause (an interned string). At a 5 s
interval and the 13 keys of ``rules/report.yaml`` that is 721 points of 8 + 13 x 4 + 8
bytes, about 50 KB per model, and it never grows (``nbytes`` says what it holds; the
README's "Status page" states the bound). A model that stops reporting is forgotten one
``history_seconds`` after its last point.

The event loop appends; the HTTP thread reads. A lock keeps a reader from seeing a point
half written; both sides hold it for microseconds.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vllm_triage.core.evaluate import Evaluation
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.core.timeline import point_values

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class Window:
    """A copy of a ring's points since some time, oldest first (None where unknown)."""

    times: list[float]
    columns: dict[str, list[float | None]]
    causes: list[str | None]


class Ring:
    """The last ``capacity`` points of one model."""

    def __init__(self, keys: tuple[str, ...], capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a ring holds at least one point")
        self.keys = keys
        self.capacity = capacity
        self._times = array("d", [NAN]) * capacity
        self._columns = {k: array("f", [NAN]) * capacity for k in keys}
        self._causes: list[str | None] = [None] * capacity
        self._next = 0  # where the next point goes
        self._size = 0

    def append(self, at: float, values: dict[str, float], cause: str | None) -> None:
        i = self._next
        self._times[i] = at
        for key, column in self._columns.items():
            column[i] = values.get(key, NAN)
        self._causes[i] = cause
        self._next = (i + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    @property
    def newest(self) -> float | None:
        return None if self._size == 0 else self._times[(self._next - 1) % self.capacity]

    def __len__(self) -> int:
        return self._size

    def window(self, since: float) -> Window:
        start = (self._next - self._size) % self.capacity
        order = [(start + j) % self.capacity for j in range(self._size)]
        order = [i for i in order if self._times[i] >= since]
        return Window(
            times=[self._times[i] for i in order],
            columns={
                k: [None if math.isnan(c[i]) else float(c[i]) for i in order]
                for k, c in self._columns.items()
            },
            causes=[self._causes[i] for i in order],
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the columns (preallocated: the same from the first point on)."""
        per_point = self._times.itemsize + sum(c.itemsize for c in self._columns.values()) + 8
        return per_point * self.capacity


class History:
    """One target's rings, one per model, each ``capacity`` points long."""

    def __init__(
        self,
        keys: Iterable[str],
        *,
        capacity: int,
        keep_seconds: float,
        settings_values: Mapping[str, float] | None = None,
    ) -> None:
        self.keys = tuple(keys)
        #: The target's settings in force (SLOs, thresholds, ceiling), drawn as lines.
        self.settings_values = dict(settings_values or {})
        self.capacity = capacity
        self.keep_seconds = keep_seconds
        self._rings: dict[str, Ring] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_interval(
        cls,
        keys: Iterable[str],
        *,
        history_seconds: float,
        interval_seconds: float,
        settings_values: Mapping[str, float] | None = None,
    ) -> History:
        capacity = math.ceil(history_seconds / interval_seconds) + 1
        return cls(
            keys,
            capacity=capacity,
            keep_seconds=history_seconds,
            settings_values=settings_values,
        )

    def record(self, evaluation: Evaluation, rules: Rulebook) -> None:
        """Append one point per model the evaluation diagnosed."""
        points = [
            (model, point_values(evaluation.measurements[model], self.keys), d.cause)
            for model, d in evaluation.diagnoses.items()
        ]
        with self._lock:
            for model, values, cause in points:
                ring = self._rings.get(model)
                if ring is None:
                    ring = self._rings[model] = Ring(self.keys, self.capacity)
                ring.append(evaluation.at, values, cause)
            stale = evaluation.at - self.keep_seconds
            for model in [m for m, r in self._rings.items() if (r.newest or 0.0) < stale]:
                del self._rings[model]

    def windows(self, since: float) -> dict[str, Window]:
        with self._lock:
            return {m: r.window(since) for m, r in sorted(self._rings.items())}

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(r.nbytes for r in self._rings.values())
