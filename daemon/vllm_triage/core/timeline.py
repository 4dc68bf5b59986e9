"""Evaluations as time series, and transitions as incidents: what the post-mortem report and
the live status page draw (``page/document.py`` shapes their document from these).

A point's values are named as the diagnosis evidence names them, measured once for every
evaluation, healthy ones too (``Evaluation.measurements``), so a chart can show any
evidence key, including keys added to the diagnosis later. Settings in force (SLOs,
thresholds, the ceiling) are named ``slo.<key>``, ``thresholds.<key>`` and ``ceiling.<key>``.

Pure: the same evaluations always give the same series and incidents.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from vllm_triage.core.facts import finite_number
from vllm_triage.core.model import Diagnosis, Reason, Transition
from vllm_triage.core.rulebook import Ceiling, Rulebook, Slo, Thresholds

#: Prefixes of the keys that name a setting in force rather than a measurement.
SETTING_PREFIXES = ("slo.", "thresholds.", "ceiling.")


def point_values(
    measurements: Mapping[str, float], keys: Collection[str] | None = None
) -> dict[str, float]:
    """One model's point from what its evaluation measured (``Evaluation.measurements``):
    only ``keys``, if given, in their order; absent where unknown, never a made-up 0."""
    if keys is None:
        return dict(measurements)
    return {key: measurements[key] for key in keys if key in measurements}


def setting_values(rules: Rulebook) -> dict[str, float]:
    """The settings in force as chartable constants: ``slo.ttft_p99_seconds`` and so on."""
    out: dict[str, float] = {}
    parts: list[tuple[str, Slo | Thresholds | Ceiling]] = [
        ("slo", rules.slo),
        ("thresholds", rules.thresholds),
    ]
    if rules.ceiling is not None:
        parts.append(("ceiling", rules.ceiling))
    for prefix, obj in parts:
        for f in dataclasses.fields(obj):
            number = finite_number(getattr(obj, f.name))
            if number is not None:
                out[f"{prefix}.{f.name}"] = number
    return out


@dataclass(frozen=True, slots=True)
class CauseChange:
    """An open incident's cause changing (``core.incidents``): when, from what, why."""

    at: float
    previous: str
    cause: str
    why: str


@dataclass(frozen=True, slots=True)
class Incident:
    """One episode's life: from its firing transition to its resolved one.

    ``cause`` is its cause at the end (or now), ``opened_as`` the one it opened with (its
    alert identity), ``changes`` each change of cause in between; ``diagnosis`` is the
    one that decided the current cause (the firing, or the last change). An incident
    whose firing is not known any more (the status page keeps the last few transitions)
    has the resolving one and ``opened_because`` None. ``ended_at`` is None while it fires.
    """

    model_name: str
    cause: str
    started_at: float
    diagnosis: Diagnosis
    opened_because: Reason | None
    ended_at: float | None = None
    closed_because: Reason | None = None
    opened_as: str = ""
    changes: tuple[CauseChange, ...] = ()

    def segments(self) -> list[tuple[float, float | None, str]]:
        """(start, end, cause) for each stretch of one cause; the last ends with it."""
        starts = [(self.started_at, self.opened_as or self.cause)]
        starts += [(c.at, c.cause) for c in self.changes]
        ends: list[float | None] = [at for at, _ in starts[1:]]
        return [
            (at, end, cause)
            for (at, cause), end in zip(starts, [*ends, self.ended_at], strict=True)
        ]


def incidents(transitions: Iterable[Transition]) -> list[Incident]:
    """The incidents a stream of transitions (any models, in order) opened and closed."""
    out: list[Incident] = []
    open_at: dict[str, int] = {}  # model -> index in ``out`` of its open incident
    for t in transitions:
        index = open_at.get(t.model_name)
        if t.continues and t.previous_cause is not None and index is not None:
            # The same episode under another cause: one incident, one more change.
            i = out[index]
            change = CauseChange(at=t.at, previous=t.previous_cause, cause=t.cause, why=t.change)
            out[index] = dataclasses.replace(
                i, cause=t.cause, diagnosis=t.diagnosis, changes=(*i.changes, change)
            )
            continue
        if t.event == "firing":
            open_at[t.model_name] = len(out)
            out.append(
                Incident(
                    model_name=t.model_name,
                    cause=t.cause,
                    started_at=t.started_at,
                    diagnosis=t.diagnosis,
                    opened_because=t.reason,
                    opened_as=t.identity_cause,
                )
            )
            continue
        index = open_at.pop(t.model_name, None)
        if index is None or out[index].opened_as != t.identity_cause:
            out.append(
                Incident(
                    model_name=t.model_name,
                    cause=t.cause,
                    started_at=t.started_at,
                    diagnosis=t.diagnosis,
                    opened_because=None,
                    ended_at=t.at,
                    closed_because=t.reason,
                    opened_as=t.identity_cause,
                )
            )
            continue
        opened = out[index]
        out[index] = dataclasses.replace(opened, ended_at=t.at, closed_because=t.reason)
    return sorted(out, key=lambda i: (i.started_at, i.model_name))


def breach_began(
    times: Sequence[float], causes: Sequence[str | None], at: float, step: float = 0.0
) -> float | None:
    """The time of the first breached evaluation of the unbroken run that ends at ``at``
    (the incident fires only after ``open_after`` of them). None if ``at`` is not among
    ``times`` or was not itself breached. ``step``: the points are one per step
    (``ChartPoints.step``), so ``at`` is in the first point at or after it, less than a
    step later; the run's start is then known to the step, and never after ``at``."""
    i = len(times) - 1
    if step <= 0:
        while i >= 0 and times[i] > at:
            i -= 1
        if i < 0 or times[i] != at or causes[i] is None:
            return None
    else:
        while i > 0 and times[i - 1] >= at:
            i -= 1
        if i < 0 or not at <= times[i] < at + step or causes[i] is None:
            return None
    while i > 0 and causes[i - 1] is not None:
        i -= 1
    return min(times[i], at)


def median_interval(times: Sequence[float]) -> float | None:
    """The typical time between two evaluations (the scrape interval)."""
    gaps = sorted(b - a for a, b in itertools.pairwise(times) if b > a)
    return gaps[len(gaps) // 2] if gaps else None


#: Two scrapes further apart than this many typical intervals have a gap between them
#: (scrapes that failed, a daemon that was down): a chart breaks its line there, and the
#: report lists it.
GAP_INTERVALS = 2.5


def scrape_gaps(times: Sequence[float]) -> list[tuple[float, float]]:
    """The stretches with no scrape: (last scrape before, first after), in order."""
    interval = median_interval(times)
    if interval is None:
        return []
    return [(a, b) for a, b in itertools.pairwise(times) if b - a > GAP_INTERVALS * interval]


@dataclass(frozen=True, slots=True)
class Series:
    """Columns ready to draw: ``times`` ascending, one value list per key, aligned; a row of
    None values marks a gap (no evaluation there), so a line is not drawn across it.
    ``evaluations`` counts the evaluations before any thinning."""

    times: list[float]
    columns: dict[str, list[float | None]]
    causes: list[str | None]
    evaluations: int
    thinned: bool = False


def _gap_row(series: Series, at: float) -> None:
    series.times.append(at)
    for column in series.columns.values():
        column.append(None)
    series.causes.append(None)


def for_display(
    times: Sequence[float],
    columns: Mapping[str, Sequence[float | None]],
    causes: Sequence[str | None],
    *,
    max_points: int,
    gap_seconds: float | None,
) -> Series:
    """At most about ``max_points`` rows, gaps marked.

    Within budget every evaluation is kept. Over it, the span is cut into
    ``max_points // 2`` equal slices and each slice becomes two rows, its first and its
    last time, holding each column's minimum and maximum in the order they happened: a
    spike as short as one evaluation still shows at its height.
    """
    out = Series(times=[], columns={k: [] for k in columns}, causes=[], evaluations=len(times))
    n = len(times)
    if n == 0:
        return out
    if n <= max_points:
        for i in range(n):
            if gap_seconds is not None and i > 0 and times[i] - times[i - 1] > gap_seconds:
                _gap_row(out, (times[i] + times[i - 1]) / 2)
            out.times.append(times[i])
            for key, column in columns.items():
                out.columns[key].append(column[i])
            out.causes.append(causes[i])
        return out
    slices = max(1, max_points // 2)
    width = (times[-1] - times[0]) / slices or 1.0
    groups: list[list[int]] = [[] for _ in range(slices)]
    for i, at in enumerate(times):
        groups[min(int((at - times[0]) / width), slices - 1)].append(i)
    thinned = dataclasses.replace(out, thinned=True)
    last: int | None = None
    for group in groups:
        if not group:
            continue
        if (
            last is not None
            and gap_seconds is not None
            and times[group[0]] - times[last] > gap_seconds
        ):
            _gap_row(thinned, (times[group[0]] + times[last]) / 2)
        last = group[-1]
        first_t, last_t = times[group[0]], times[group[-1]]
        rows = 1 if first_t == last_t else 2
        thinned.times.extend([first_t, last_t][:rows])
        for key, column in columns.items():
            thinned.columns[key].extend(_min_max(column, group)[:rows])
        cause = next((causes[i] for i in reversed(group) if causes[i] is not None), None)
        thinned.causes.extend([cause] * rows)
    return thinned


def _min_max(column: Sequence[float | None], group: list[int]) -> list[float | None]:
    """The group's minimum and maximum, earlier one first; [None, None] if it has none."""
    known = [(column[i], i) for i in group if column[i] is not None]
    if not known:
        return [None, None]
    low = min(known)
    high = max(known)
    first, second = (low, high) if low[1] <= high[1] else (high, low)
    return [first[0], second[0]]
