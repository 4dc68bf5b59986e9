"""Incident state per model: every rule about opening, switching and resolving is here.

The rules are one table, ``RULES``, that ``IncidentTracker`` executes and this docstring
prints (below), so the prose and the code cannot drift apart. Each evaluation is one
event: ``breach`` (a cause, the same as the open incident's or none is open), ``other``
(a different cause leads, while the open incident's own symptoms are still present),
``replaced`` (a different cause leads and the incident's own symptoms are gone) or
``clear`` (no SLO breached). A rule either moves at once, or counts consecutive events
and moves when the count reaches its threshold:

{table}

``open_after`` works like Prometheus' ``for``: a breach must persist before anyone is
paged; ``resolve_after`` is hysteresis, so an incident does not flap on one good window.
A ``sustained`` diagnosis (a stall, whose test is already one of time) reaches every
``open_after`` threshold at once: counted in evaluations, the alert would come later
whenever scrapes are late or skipped, on exactly the overloaded host a hang is likely on.
A count restarts whenever the state changes, and the challenger's counts restart when
the incident's own cause (or a clear evaluation, or a third cause) interrupts them.

A load at the edge of a cut-off clears for a minute and breaches again: the clear
stretch proved nothing. So when an incident opens with the cause the last one resolved
with, within ``reopen_within`` evaluations of that resolve, it is the same condition
flapping, and it resolves only after ``reopen_within`` clear evaluations in a row
(flap damping; the memory of the resolve is kept with the clear track).

The cause has hysteresis too (``docs/physics.md``, "When an incident changes cause").
Every ``other`` or ``replaced`` event extends the challenger's unbroken lead (``lead``);
``gone`` counts the end of that lead in which the incident's own symptoms are absent.
While the incident's cause is still present (``other``: both causes are real, and which
one leads flips on noise near a cut-off), the lead must reach ``change_cause_after``,
doubled by each change of cause the episode has had already (damping: a condition that
swings between two causes changes the incident a few times, not every few minutes).
Once the incident's cause is gone (``replaced``: the clear margin), ``open_after`` such
evaluations are enough, as for a new incident.

An incident is an episode: one alert identity, named for the cause it opened with, from
``opened`` to ``resolved``; a change of cause is a ``firing`` transition with reason
``cause_changed`` that keeps ``started_at``, names the cause it replaces and says why.
One exception: a change into or out of ``stalled`` ends the episode and starts another
(a ``resolved`` and a ``firing``, both ``cause_changed``), because a hung engine is
another incident than a slow one, with its own alert and often its own receiver. Time
comes from the diagnoses, never from a clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from vllm_triage.core.counts import counted
from vllm_triage.core.model import CAUSES, Cause, Diagnosis, Reason, Transition


class State(enum.StrEnum):
    CLEAR = "clear"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVING = "resolving"


class Event(enum.StrEnum):
    BREACH = "breach"  # breached, with the open incident's cause (or none is open)
    OTHER = "other"  # another cause leads; the open incident's own is still present
    REPLACED = "replaced"  # another cause leads; the open incident's own is gone
    CLEAR = "clear"  # nothing breached


Counter = Literal["run", "lead", "gone"]

#: Damping stops doubling after this many changes (a lead 256 times the setting).
MAX_DAMPING = 8
Threshold = Literal["open_after", "resolve_after", "change_cause_after"]


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
        State.FIRING, "lead", "change_cause_after", State.FIRING, Reason.CAUSE_CHANGED
    ),
    (State.FIRING, Event.REPLACED): Rule(
        State.FIRING, "gone", "open_after", State.FIRING, Reason.CAUSE_CHANGED
    ),
    (State.FIRING, Event.CLEAR): Rule(
        State.RESOLVING, "run", "resolve_after", State.CLEAR, Reason.RESOLVED
    ),
    (State.RESOLVING, Event.BREACH): Rule(State.FIRING),
    (State.RESOLVING, Event.OTHER): Rule(
        State.FIRING, "lead", "change_cause_after", State.FIRING, Reason.CAUSE_CHANGED
    ),
    (State.RESOLVING, Event.REPLACED): Rule(
        State.FIRING, "gone", "open_after", State.FIRING, Reason.CAUSE_CHANGED
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
    challenger_run: int = 0  # its unbroken lead, in evaluations
    replaced_run: int = 0  # the end of that lead in which the incident's cause was gone
    opened_as: Cause | None = None  # the cause the episode opened with: its identity
    changes: int = 0  # changes of cause in this episode (each doubles the next lead)
    resolve_needed: int = 0  # clear evaluations this episode needs (0: resolve_after)
    resolved_cause: Cause | None = None  # the last episode's final cause, while remembered
    since_resolved: int = 0  # evaluations since that episode resolved


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
    replaced_run: int = 0
    opened_as: Cause | None = None
    changes: int = 0
    resolve_needed: int = 0
    resolved_cause: Cause | None = None
    since_resolved: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.state, State):
            raise ValueError(f"a kept incident cannot be in state {self.state!r}")
        if self.state is State.CLEAR and self.resolved_cause is None:
            raise ValueError("a clear track is kept only for the resolve it remembers")
        for name in ("cause", "challenger", "opened_as", "resolved_cause"):
            value = getattr(self, name)
            if value is not None and value not in CAUSES:
                raise ValueError(f"{name} {value!r} is not a cause")
        open_ = self.state in (State.FIRING, State.RESOLVING)
        if open_ != (self.cause is not None):
            raise ValueError(f"a {self.state} incident {'needs' if open_ else 'has no'} cause")
        counts = (self.run, self.challenger_run, self.replaced_run, self.changes)
        if min(*counts, self.resolve_needed, self.since_resolved) < 0:
            raise ValueError("counts cannot be negative")
        if self.started_at != self.started_at:  # NaN
            raise ValueError("started_at is not a number")


@dataclass(frozen=True, slots=True)
class Active:
    """An incident that is firing now."""

    model_name: str
    cause: Cause
    started_at: float
    opened_as: Cause | None = None  # the episode's identity, when it changed cause since


class IncidentTracker:
    """Turns a stream of diagnoses (one target, any number of models) into transitions."""

    def __init__(
        self,
        *,
        open_after: int = 3,
        resolve_after: int = 3,
        change_cause_after: int | None = None,
        reopen_within: int = 60,
    ) -> None:
        if open_after < 1 or resolve_after < 1:
            raise ValueError("open_after and resolve_after must be at least 1")
        change = 8 * open_after if change_cause_after is None else change_cause_after
        if change < open_after:
            raise ValueError("change_cause_after cannot be shorter than open_after")
        if reopen_within < 0:
            raise ValueError("reopen_within cannot be negative")
        self.open_after = open_after
        self.resolve_after = resolve_after
        self.change_cause_after = change
        self.reopen_within = reopen_within
        self._tracks: dict[str, _Track] = {}

    def open_cause(self, model: str) -> Cause | None:
        """The current cause of ``model``'s open incident (firing or resolving), if any."""
        t = self._tracks.get(model)
        return t.cause if t is not None and t.state in (State.FIRING, State.RESOLVING) else None

    def state(self, model: str) -> State:
        track = self._tracks.get(model)
        return track.state if track else State.CLEAR

    def clear_run(self, model: str) -> int:
        """Consecutive clear evaluations of an incident that is resolving (0 otherwise):
        it resolves when this reaches ``resolve_after``."""
        track = self._tracks.get(model)
        return track.run if track is not None and track.state is State.RESOLVING else 0

    def resolve_needed(self, model: str) -> int:
        """Clear evaluations ``model``'s incident needs to resolve: ``resolve_after``, more
        for an incident that reopened soon after the last one (see the module's note)."""
        track = self._tracks.get(model)
        return (track.resolve_needed if track is not None else 0) or self.resolve_after

    def active(self) -> list[Active]:
        return [
            Active(model, t.cause, t.started_at, t.opened_as or t.cause)
            for model, t in sorted(self._tracks.items())
            if t.cause is not None and t.state in (State.FIRING, State.RESOLVING)
        ]

    def export(self) -> tuple[TrackRecord, ...]:
        """Every model's state that is not ``clear`` (or that remembers a recent resolve),
        as plain data, sorted by model."""
        return tuple(
            TrackRecord(
                model_name=model,
                state=t.state,
                run=t.run,
                cause=t.cause if t.state in (State.FIRING, State.RESOLVING) else None,
                started_at=t.started_at,
                challenger=t.challenger,
                challenger_run=t.challenger_run,
                replaced_run=t.replaced_run,
                opened_as=t.opened_as if t.state in (State.FIRING, State.RESOLVING) else None,
                changes=t.changes,
                resolve_needed=t.resolve_needed,
                resolved_cause=t.resolved_cause,
                since_resolved=t.since_resolved,
            )
            for model, t in sorted(self._tracks.items())
            if t.state is not State.CLEAR or t.resolved_cause is not None
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
                replaced_run=r.replaced_run,
                opened_as=r.opened_as or r.cause,
                changes=r.changes,
                resolve_needed=r.resolve_needed,
                resolved_cause=r.resolved_cause,
                since_resolved=r.since_resolved,
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
        if t.resolved_cause is not None:
            t.since_resolved += 1
            if t.since_resolved > self.reopen_within:  # long enough ago: not a flap
                t.resolved_cause, t.since_resolved = None, 0
        event = _event(t, d)
        if event in (Event.OTHER, Event.REPLACED):
            if d.cause != t.challenger:
                t.challenger, t.challenger_run, t.replaced_run = d.cause, 0, 0
            # Both count the challenger's unbroken lead; ``gone`` only its end in which
            # the incident's own symptoms are absent.
            t.challenger_run += 1
            t.replaced_run = t.replaced_run + 1 if event is Event.REPLACED else 0
        else:
            # The challenger's lead is broken by anything but the same challenger.
            t.challenger, t.challenger_run, t.replaced_run = None, 0, 0
        rule = RULES[(t.state, event)]
        reached = False
        if rule.counts == "run":
            t.run += 1
            reached = t.run >= self._threshold(rule, t)
        elif rule.counts == "lead":
            reached = t.challenger_run >= self._threshold(rule, t)
        elif rule.counts == "gone":
            reached = t.replaced_run >= self._threshold(rule, t)
        if d.sustained and rule.threshold == "open_after":
            reached = True
        after = rule.reached if reached and rule.reached is not None else rule.then
        if after is not t.state or reached:
            # A new state's streak starts with the event that entered it, if it counts one.
            t.run = 1 if rule.counts == "run" and not reached else 0
        t.state = after
        return self._emit(t, d, rule.reason) if reached else []

    def change_after(self, changes: int) -> int:
        """The lead a challenger needs while the incident's own cause is still present,
        after ``changes`` changes of cause in this episode: doubled by each one, so a
        condition that swings between two causes changes an incident a few times at most
        (as route-flap damping does), never every few minutes."""
        return self.change_cause_after << min(changes, MAX_DAMPING)

    def _threshold(self, rule: Rule, t: _Track) -> int:
        if rule.threshold == "change_cause_after":
            return self.change_after(t.changes)
        if rule.threshold == "resolve_after":
            return t.resolve_needed or self.resolve_after
        return self.open_after

    def _emit(self, t: _Track, d: Diagnosis, reason: Reason | None) -> list[Transition]:
        if reason is Reason.OPENED:
            assert d.cause is not None
            # The same condition back soon after its resolve is flapping: the clear
            # stretch proved nothing, so this one resolves only after a whole
            # ``reopen_within`` of clear evaluations (never sooner than resolve_after).
            flapping = t.resolved_cause == d.cause
            t.resolve_needed = max(self.reopen_within, self.resolve_after) if flapping else 0
            t.resolved_cause, t.since_resolved = None, 0
            t.cause, t.started_at, t.opened_as, t.changes = d.cause, d.at, d.cause, 0
            t.challenger, t.challenger_run, t.replaced_run = None, 0, 0
            return [_transition("firing", reason, t, d)]
        if reason is Reason.CAUSE_CHANGED:
            assert d.cause is not None and t.cause is not None
            before = t.cause
            why = _change_text(before, d.cause, t)
            t.challenger, t.challenger_run, t.replaced_run = None, 0, 0
            if "stalled" in (before, d.cause):
                # A hung engine is another incident than a slow one (another alert, often
                # another receiver): the episode ends and a new one starts.
                ended = _transition("resolved", reason, t, d, change=why)
                t.cause, t.started_at, t.opened_as, t.changes = d.cause, d.at, d.cause, 0
                return [ended, _transition("firing", reason, t, d, previous=before, change=why)]
            t.cause, t.changes = d.cause, t.changes + 1
            return [
                _transition("firing", reason, t, d, previous=before, change=why, continues=True)
            ]
        out = [_transition("resolved", Reason.RESOLVED, t, d)]
        # Nothing open: nothing to keep but the memory of this resolve (for a reopen).
        t.resolved_cause = t.cause if self.reopen_within > 0 else None
        t.since_resolved = 0
        t.cause, t.started_at, t.opened_as, t.changes = None, 0.0, None, 0
        return out


def _change_text(before: Cause, after: Cause, t: _Track) -> str:
    """Why an open incident changed cause, as a notification says it."""
    if t.replaced_run:
        return (
            f"{after} led for {counted(t.challenger_run, 'evaluation')} in a row, the last "
            f"{t.replaced_run} without {before}'s symptoms"
        )
    return (
        f"{after} led for {counted(t.challenger_run, 'evaluation')} in a row while {before} was "
        "still present: the evidence moved"
    )


def _event(t: _Track, d: Diagnosis) -> Event:
    if d.cause is None:
        return Event.CLEAR
    if t.cause is not None and t.state in (State.FIRING, State.RESOLVING) and d.cause != t.cause:
        return Event.OTHER if t.cause in d.present else Event.REPLACED
    return Event.BREACH


def _transition(
    event: Literal["firing", "resolved"],
    reason: Reason,
    t: _Track,
    d: Diagnosis,
    *,
    previous: Cause | None = None,
    change: str = "",
    continues: bool = False,
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
        opened_as=t.opened_as or t.cause,
        previous_cause=previous,
        change=change,
        continues=continues,
    )
