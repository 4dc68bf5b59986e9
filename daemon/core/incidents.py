"""Incident state per model: every rule about opening, switching and resolving is here.

The rules are one table, ``RULES``, that ``IncidentTracker`` executes and this docstring
prints (below), so the prose and the code cannot drift apart. Each evaluation is one
event: ``breach`` (a cause, the same as the open incident's or none is open), ``other``
(a different cause than the open incident's) or ``clear`` (no SLO breached). A rule
either moves at once, or counts consecutive events and moves when the count reaches its
threshold:

{table}

``open_after`` works like Prometheus' ``for``: a breach must persist before anyone is
paged; ``resolve_after`` is hysteresis, so an incident does not flap on one good window.
A count restarts whenever the state changes, and the challenger's count restarts when
the incident's own cause (or a clear evaluation, or a third cause) interrupts it. One
alert identity per (model, cause), as Alertmanager groups them: a changed cause is a
``resolved`` for the old identity and a ``firing`` for the new, both with reason
``cause_changed``. Time comes from the diagnoses, never from a clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from daemon.core.model import CAUSES, Cause, Diagnosis, Reason, Transition


class State(enum.StrEnum):
    CLEAR = "clear"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVING = "resolving"


class Event(enum.StrEnum):
    BREACH = "breach"  # breached, with the open incident's cause (or none is open)
    OTHER = "other"  # breached, with another cause than the open incident's
    CLEAR = "clear"  # nothing breached


Counter = Literal["run", "challenger"]
Threshold = Literal["open_after", "resolve_after"]


@dataclass(frozen=True, slots=True)
class Rule:
    """What one event does in one state.

    Without ``counts`` the state becomes ``then`` at once. With it, the event is counted
    (``run``: this state's streak; ``challenger``: the new cause's streak) and, once the
    count reaches the ``threshold`` setting, the state becomes ``reached`` and the
    transition ``reason`` is emitted; below it, the state becomes ``then``.
    """

    then: State
    counts: Counter | None = None
    threshold: Threshold | None = None
    reached: State | None = None
    reason: Reason | None = None


RULES: dict[tuple[State, Event], Rule] = {
    (State.CLEAR, Event.BREACH): Rule(
        State.PENDING, "run", "open_after", State.FIRING, Reason.OPENED
    ),
    (State.CLEAR, Event.CLEAR): Rule(State.CLEAR),
    (State.PENDING, Event.BREACH): Rule(
        State.PENDING, "run", "open_after", State.FIRING, Reason.OPENED
    ),
    (State.PENDING, Event.CLEAR): Rule(State.CLEAR),
    (State.FIRING, Event.BREACH): Rule(State.FIRING),
    (State.FIRING, Event.OTHER): Rule(
        State.FIRING, "challenger", "open_after", State.FIRING, Reason.CAUSE_CHANGED
    ),
    (State.FIRING, Event.CLEAR): Rule(
        State.RESOLVING, "run", "resolve_after", State.CLEAR, Reason.RESOLVED
    ),
    (State.RESOLVING, Event.BREACH): Rule(State.FIRING),
    (State.RESOLVING, Event.OTHER): Rule(
        State.FIRING, "challenger", "open_after", State.FIRING, Reason.CAUSE_CHANGED
    ),
    (State.RESOLVING, Event.CLEAR): Rule(
        State.RESOLVING, "run", "resolve_after", State.CLEAR, Reason.RESOLVED
    ),
}


def render_rules() -> str:
    """``RULES`` as a text table (this module's docstring shows it)."""
    rows = [("state", "event", "goes to", "counting", "at the threshold")]
    for (state, event), rule in RULES.items():
        counting = at = "-"
        if rule.counts is not None:
            counting = f"{rule.counts} + 1"
            at = f"{rule.threshold} -> {rule.reached}, {rule.reason}"
        rows.append((str(state), str(event), str(rule.then), counting, at))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["    " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "    " + "  ".join("─" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


__doc__ = (__doc__ or "").format(table=render_rules())


@dataclass(slots=True)
class _Track:
    state: State = State.CLEAR
    run: int = 0  # consecutive events counted in this state
    cause: Cause | None = None  # the firing identity
    started_at: float = 0.0
    challenger: Cause | None = None  # a different cause seen while firing
    challenger_run: int = 0


@dataclass(frozen=True, slots=True)
class TrackRecord:
    """One model's incident state as plain data: what a restart needs to carry on exactly
    where it stopped (``IncidentTracker.export`` and ``restore``). Only a model whose
    state is not ``clear`` has one: a clear track holds nothing worth keeping.

    Validated on construction, so a damaged record from outside is refused, never fed
    into the state table."""

    model_name: str
    state: State
    run: int
    cause: Cause | None
    started_at: float
    challenger: Cause | None = None
    challenger_run: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.state, State) or self.state is State.CLEAR:
            raise ValueError(f"a kept incident cannot be in state {self.state!r}")
        for name in ("cause", "challenger"):
            value = getattr(self, name)
            if value is not None and value not in CAUSES:
                raise ValueError(f"{name} {value!r} is not a cause")
        open_ = self.state in (State.FIRING, State.RESOLVING)
        if open_ != (self.cause is not None):
            raise ValueError(f"a {self.state} incident {'needs' if open_ else 'has no'} cause")
        if self.run < 0 or self.challenger_run < 0:
            raise ValueError("counts cannot be negative")
        if self.started_at != self.started_at:  # NaN
            raise ValueError("started_at is not a number")


@dataclass(frozen=True, slots=True)
class Active:
    """An incident that is firing now."""

    model_name: str
    cause: Cause
    started_at: float


class IncidentTracker:
    """Turns a stream of diagnoses (one target, any number of models) into transitions."""

    def __init__(self, *, open_after: int = 3, resolve_after: int = 3) -> None:
        if open_after < 1 or resolve_after < 1:
            raise ValueError("open_after and resolve_after must be at least 1")
        self.open_after = open_after
        self.resolve_after = resolve_after
        self._tracks: dict[str, _Track] = {}

    def state(self, model: str) -> State:
        track = self._tracks.get(model)
        return track.state if track else State.CLEAR

    def clear_run(self, model: str) -> int:
        """Consecutive clear evaluations of an incident that is resolving (0 otherwise):
        it resolves when this reaches ``resolve_after``."""
        track = self._tracks.get(model)
        return track.run if track is not None and track.state is State.RESOLVING else 0

    def active(self) -> list[Active]:
        return [
            Active(model, t.cause, t.started_at)
            for model, t in sorted(self._tracks.items())
            if t.cause is not None and t.state in (State.FIRING, State.RESOLVING)
        ]

    def export(self) -> tuple[TrackRecord, ...]:
        """Every model's state that is not ``clear``, as plain data, sorted by model."""
        return tuple(
            TrackRecord(
                model_name=model,
                state=t.state,
                run=t.run,
                cause=t.cause if t.state in (State.FIRING, State.RESOLVING) else None,
                started_at=t.started_at,
                challenger=t.challenger,
                challenger_run=t.challenger_run,
            )
            for model, t in sorted(self._tracks.items())
            if t.state is not State.CLEAR
        )

    def restore(self, records: Iterable[TrackRecord]) -> None:
        """Carry on from ``export``'s records (after a restart): replaces those models'
        tracks; the next ``observe`` continues their counts as if nothing had stopped."""
        for r in records:
            self._tracks[r.model_name] = _Track(
                state=r.state,
                run=r.run,
                cause=r.cause,
                started_at=r.started_at,
                challenger=r.challenger,
                challenger_run=r.challenger_run,
            )

    def forget_clear(self, keep: set[str]) -> None:
        """Drop the tracks of models not in ``keep`` that have nothing open: a model that
        is gone must not cost memory for ever. An open incident stays until it resolves."""
        for model in [m for m, t in self._tracks.items() if m not in keep]:
            if self._tracks[model].state is State.CLEAR:
                del self._tracks[model]

    def observe(self, d: Diagnosis) -> list[Transition]:
        """Feed one evaluation; returns the transitions it caused (often none)."""
        t = self._tracks.setdefault(d.model_name, _Track())
        event = _event(t, d.cause)
        if event is not Event.OTHER or d.cause != t.challenger:
            # The challenger's streak is broken by anything but the same challenger.
            t.challenger, t.challenger_run = (d.cause, 0) if event is Event.OTHER else (None, 0)
        rule = RULES[(t.state, event)]
        reached = False
        if rule.counts == "run":
            t.run += 1
            reached = t.run >= self._threshold(rule)
        elif rule.counts == "challenger":
            t.challenger_run += 1
            reached = t.challenger_run >= self._threshold(rule)
        after = rule.reached if reached and rule.reached is not None else rule.then
        if after is not t.state or reached:
            # A new state's streak starts with the event that entered it, if it counts one.
            t.run = 1 if rule.counts == "run" and not reached else 0
        t.state = after
        return self._emit(t, d, rule.reason) if reached else []

    def _threshold(self, rule: Rule) -> int:
        return self.open_after if rule.threshold == "open_after" else self.resolve_after

    def _emit(self, t: _Track, d: Diagnosis, reason: Reason | None) -> list[Transition]:
        if reason is Reason.OPENED:
            assert d.cause is not None
            t.cause, t.started_at = d.cause, d.at
            t.challenger, t.challenger_run = None, 0
            return [_transition("firing", reason, t, d)]
        if reason is Reason.CAUSE_CHANGED:
            assert d.cause is not None
            resolved = _transition("resolved", reason, t, d)
            t.cause, t.started_at = d.cause, d.at
            t.challenger, t.challenger_run = None, 0
            return [resolved, _transition("firing", reason, t, d)]
        out = [_transition("resolved", Reason.RESOLVED, t, d)]
        t.cause, t.started_at = None, 0.0  # nothing open: no start to keep (or export)
        return out


def _event(t: _Track, cause: Cause | None) -> Event:
    if cause is None:
        return Event.CLEAR
    if t.cause is not None and t.state in (State.FIRING, State.RESOLVING) and cause != t.cause:
        return Event.OTHER
    return Event.BREACH


def _transition(
    event: Literal["firing", "resolved"], reason: Reason, t: _Track, d: Diagnosis
) -> Transition:
    assert t.cause is not None  # only called for an open incident
    return Transition(
        event=event,
        reason=reason,
        model_name=d.model_name,
        cause=t.cause,
        at=d.at,
        started_at=t.started_at,
        diagnosis=d,
    )
