"""The window of a recording ``whatif`` starts from: what it measured, and its load interval
by interval.

The recording is judged by the same core as ``replay`` (``recording.replay.fed``); the
window is the one the evaluator held at the chosen instant, so ``before`` is what the
diagnosis saw. Arrivals per scrape interval are read from the snapshots themselves:
first tokens counted plus the growth of the queue.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from vllm_triage.core.drive import Driver
from vllm_triage.core.evaluate import Evaluation, Evaluator
from vllm_triage.core.model import ModelSeries, Signals, Snapshot
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.errors import RecordingError
from vllm_triage.recording.replay import Skipped, fed
from vllm_triage.rules import runtime_table


@dataclass(frozen=True, slots=True)
class Observed:
    """One model's window of a recording. ``intervals`` are (seconds, arrivals) scrape
    interval by scrape interval, oldest first; ``running_first`` and ``waiting_first``
    what the server held when the window began; ``cause`` what was firing (or diagnosed)
    at its end, if anything."""

    model: str
    at: float
    offset_seconds: float
    signals: Signals
    rules: Rulebook
    intervals: tuple[tuple[float, float], ...]
    running_first: float
    waiting_first: float
    cause: str | None

    @property
    def span_seconds(self) -> float:
        return sum(seconds for seconds, _ in self.intervals)

    @property
    def arrivals(self) -> float:
        return sum(count for _, count in self.intervals)


#: One accepted evaluation of a recording, with the snapshot it judged.
Item = tuple[Snapshot, Evaluation]


def _count(m: ModelSeries | None) -> tuple[float, float] | None:
    if m is None or m.ttft is None:
        return None
    return m.ttft.count, m.waiting or 0.0


def _intervals(snapshots: list[Snapshot], model: str) -> tuple[tuple[float, float], ...]:
    out: list[tuple[float, float]] = []
    for before, after in itertools.pairwise(snapshots):
        a, b = _count(before.models.get(model)), _count(after.models.get(model))
        seconds = after.at - before.at
        if a is None or b is None or seconds <= 0:
            continue
        first_tokens = b[0] - a[0]
        if first_tokens < 0:  # a restart: its counters start again from 0
            first_tokens = b[0]
        out.append((seconds, max(0.0, first_tokens + b[1] - a[1])))
    return tuple(out)


def _evaluated(directory: str | Path, evaluator: Evaluator) -> tuple[float, list[Item]]:
    """Every accepted evaluation of the recording, and its first scrape's time."""
    items: list[Item] = []
    start: float | None = None
    for item in fed(directory, Driver(evaluator, runtime_table())):
        if start is None:
            start = item.at if isinstance(item, Skipped) else item.snapshot.at
        if isinstance(item, Skipped) or not item.evaluation.accepted:
            continue
        items.append((item.snapshot, item.evaluation))
    if not items or start is None:
        raise RecordingError(f"{directory}: no usable scrape")
    return start, items


@dataclass(frozen=True, slots=True)
class Incident:
    """The recording's first incident: its model and cause, the evaluation it fired at,
    and the last it was still open at (before its resolve, or the recording's last)."""

    model: str
    cause: str
    fired: int
    last: int


def first_incident(items: list[Item]) -> Incident | None:
    for i, (_, evaluation) in enumerate(items):
        firing = [t for t in evaluation.transitions if t.event == "firing"]
        if not firing:
            continue
        t = firing[0]
        last = len(items) - 1
        for j in range(i + 1, len(items)):
            if any(
                r.event == "resolved" and r.model_name == t.model_name
                for r in items[j][1].transitions
            ):
                last = j - 1  # the last evaluation at which it was still open
                break
        return Incident(t.model_name, t.cause, i, max(i, last))
    return None


def _has_traffic(s: Signals | None) -> bool:
    return s is not None and (s.itl_mean is not None or s.ttft_count > 0)


def whole_window(items: list[Item], incident: Incident, window_seconds: float) -> int:
    """The first evaluation of the incident whose window is whole (a window's worth of
    the recording behind it) and has traffic: the diagnosis's moment, or as near after
    it as a whole window allows. An incident over before that: its last evaluation, whose
    window holds the longest stretch of it the recording has; one with no traffic in any
    such window (an engine hung throughout): the window it fired in."""
    start = items[0][0].at
    late = range(incident.fired, incident.last + 1)
    whole = [k for k in late if items[k][0].at - start >= window_seconds] or [incident.last]
    for k in whole:
        if _has_traffic(items[k][1].signals.get(incident.model)):
            return k
    return incident.fired


def read_window(
    directory: str | Path, evaluator: Evaluator, at_seconds: float | None = None
) -> Observed:
    """The window at ``at_seconds`` from the recording's start (the settings' window
    ending there). By default a whole window of the first incident (``whole_window``),
    or, where the incident ended sooner, the longest stretch of it; with no incident,
    the last window. ``RecordingError`` when no window has traffic."""
    start, items = _evaluated(directory, evaluator)
    incident: Incident | None = None
    if at_seconds is not None:
        target = start + at_seconds
        if target < items[0][0].at:
            raise RecordingError(
                f"--at {at_seconds:g}: before the first usable scrape "
                f"({items[0][0].at - start:g} s from the start)"
            )
        index = max(i for i, (snap, _) in enumerate(items) if snap.at <= target)
    else:
        incident = first_incident(items)
        index = (
            whole_window(items, incident, evaluator.window_seconds)
            if incident is not None
            else len(items) - 1
        )
    evaluation = items[index][1]
    models = sorted(evaluation.signals)
    if incident is not None:
        model = incident.model
    else:
        # The model with the most first tokens in the window: the one under load.
        model = max(models, key=lambda m: evaluation.signals[m].ttft_count, default="")
    if model not in evaluation.signals:
        raise RecordingError(f"{directory}: no model's signals at the chosen window")
    s = evaluation.signals[model]
    end = items[index][0].at
    inside = [snap for snap, _ in items[: index + 1] if snap.at >= end - s.span_seconds - 1e-6]
    first = inside[0].models.get(model)
    d = evaluation.diagnoses.get(model)
    rules = evaluator.rulebook_for(model) if evaluator.rulebook_for else evaluator.rulebook
    if s.itl_mean is None and s.ttft_count <= 0:
        raise RecordingError(
            f"the window ending {end - start:g} s into the recording has no traffic "
            "(no first token, no inter-token latency): nothing to calibrate to; pick "
            "another with --at"
        )
    cause = incident.cause if incident is not None else (d.cause if d is not None else None)
    return Observed(
        model=model,
        at=end,
        offset_seconds=end - start,
        signals=s,
        rules=rules,
        intervals=_intervals(inside, model),
        running_first=(first.running or 0.0) if first is not None else 0.0,
        waiting_first=(first.waiting or 0.0) if first is not None else 0.0,
        cause=cause,
    )
