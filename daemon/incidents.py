"""Incident state per model: every rule about opening, switching and resolving is here.

    state      on a breached evaluation                 on a clear evaluation
    ─────────  ───────────────────────────────────────  ─────────────────────────────────
    CLEAR      → PENDING (or FIRING if open_after = 1)  stays
    PENDING    run + 1; → FIRING at open_after          → CLEAR
    FIRING     same cause: stays; another cause for     → RESOLVING (or CLEAR if
               open_after evaluations: resolve the old    resolve_after = 1)
               identity and fire the new one
    RESOLVING  → FIRING (as above)                      run + 1; → CLEAR at resolve_after

``open_after`` works like Prometheus' ``for``: a breach must persist before anyone is
paged; ``resolve_after`` is hysteresis, so an incident does not flap on one good window.
One alert identity per (model, cause), as Alertmanager groups them: a changed cause is a
``resolved`` for the old identity and a ``firing`` for the new, both with reason
``cause_changed``. Time comes from the diagnoses, never from a clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from daemon.model import Cause, Diagnosis, Reason, Transition


class State(enum.StrEnum):
    CLEAR = "clear"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVING = "resolving"


@dataclass(slots=True)
class _Track:
    state: State = State.CLEAR
    run: int = 0  # consecutive breached (PENDING) or clear (RESOLVING) evaluations
    cause: Cause | None = None  # the firing identity
    started_at: float = 0.0
    challenger: Cause | None = None  # a different cause seen while firing
    challenger_run: int = 0


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

    def active(self) -> list[Active]:
        return [
            Active(model, t.cause, t.started_at)
            for model, t in sorted(self._tracks.items())
            if t.cause is not None and t.state in (State.FIRING, State.RESOLVING)
        ]

    def forget_clear(self, keep: set[str]) -> None:
        """Drop the tracks of models not in ``keep`` that have nothing open: a model that
        is gone must not cost memory for ever. An open incident stays until it resolves."""
        for model in [m for m, t in self._tracks.items() if m not in keep]:
            if self._tracks[model].state is State.CLEAR:
                del self._tracks[model]

    def observe(self, d: Diagnosis) -> list[Transition]:
        """Feed one evaluation; returns the transitions it caused (often none)."""
        track = self._tracks.setdefault(d.model_name, _Track())
        if d.cause is not None:
            return self._breached(track, d, d.cause)
        return self._clear(track, d)

    def _breached(self, t: _Track, d: Diagnosis, cause: Cause) -> list[Transition]:
        if t.state is State.CLEAR:
            t.state, t.run = State.PENDING, 0
        if t.state is State.PENDING:
            t.run += 1
            if t.run < self.open_after:
                return []
            t.state, t.run, t.cause, t.started_at = State.FIRING, 0, cause, d.at
            t.challenger, t.challenger_run = None, 0
            return [self._transition("firing", Reason.OPENED, t, d)]
        # FIRING or RESOLVING: the incident is open.
        t.state, t.run = State.FIRING, 0
        if cause == t.cause:
            t.challenger, t.challenger_run = None, 0
            return []
        if cause != t.challenger:
            t.challenger, t.challenger_run = cause, 0
        t.challenger_run += 1
        if t.challenger_run < self.open_after:
            return []
        resolved = self._transition("resolved", Reason.CAUSE_CHANGED, t, d)
        t.cause, t.started_at = cause, d.at
        t.challenger, t.challenger_run = None, 0
        return [resolved, self._transition("firing", Reason.CAUSE_CHANGED, t, d)]

    def _clear(self, t: _Track, d: Diagnosis) -> list[Transition]:
        if t.state in (State.CLEAR, State.PENDING):
            t.state, t.run = State.CLEAR, 0
            return []
        if t.state is State.FIRING:
            t.state, t.run = State.RESOLVING, 0
        t.run += 1
        t.challenger, t.challenger_run = None, 0
        if t.run < self.resolve_after:
            return []
        out = [self._transition("resolved", Reason.RESOLVED, t, d)]
        t.state, t.run, t.cause = State.CLEAR, 0, None
        return out

    def _transition(self, event: str, reason: Reason, t: _Track, d: Diagnosis) -> Transition:
        assert t.cause is not None  # only called for an open incident
        return Transition(
            event="firing" if event == "firing" else "resolved",
            reason=reason,
            model_name=d.model_name,
            cause=t.cause,
            at=d.at,
            started_at=t.started_at,
            diagnosis=d,
        )
