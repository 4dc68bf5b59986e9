"""Tests for daemon/vllm_triage/core/incidents.py: the state table, walked case by case."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_triage.core import incidents
from vllm_triage.core.incidents import RULES, Event, IncidentTracker, Rule, State, TrackRecord
from vllm_triage.core.model import Diagnosis, Reason


def d(at: float, cause: str | None, model: str = "m") -> Diagnosis:
    """A diagnosis of ``cause``; ``"queue_bound/kv_pressure"`` is queue_bound leading with
    kv_pressure's symptoms still present (contributing)."""
    lead, *also = cause.split("/") if cause else [None]
    return Diagnosis(
        model_name=model,
        at=at,
        breaches=("x",) if cause else (),
        cause=lead,  # type: ignore[arg-type]
        present=(lead, *also) if lead else (),  # type: ignore[arg-type]
    )


def walk(tracker: IncidentTracker, causes: list[str | None]) -> list[tuple[float, str, str, str]]:
    out = []
    for i, cause in enumerate(causes):
        for t in tracker.observe(d(float(i), cause)):
            out.append((t.at, t.event, t.cause, str(t.reason)))
    return out


K, Q, P, S = "kv_pressure", "queue_bound", "prefill_bound", "stalled"
QK = "queue_bound/kv_pressure"  # queue_bound leads, kv_pressure still present
KQ = "kv_pressure/queue_bound"

# (sequence of per-evaluation causes, expected transitions), with open_after=3, resolve_after=2
TABLE = [
    # a breach must persist open_after evaluations before it fires
    pytest.param([K, K, None, K, K], [], id="blip-does-not-fire"),
    pytest.param([K, K, K], [(2.0, "firing", K, "opened")], id="fires-after-3"),
    # one clear evaluation is not enough to resolve (hysteresis)
    pytest.param(
        [K, K, K, None, K, None, None],
        [(2.0, "firing", K, "opened"), (6.0, "resolved", K, "resolved")],
        id="resolves-after-2-clear",
    ),
    # once the incident's own symptoms are gone, a new cause takes over after open_after
    # evaluations: one firing, the same episode (no resolve)
    pytest.param(
        [K, K, K, Q, K, Q, Q, Q],
        [(2.0, "firing", K, "opened"), (7.0, "firing", Q, "cause_changed")],
        id="cause-change",
    ),
    # while they are still present, the challenger must lead change_cause_after (6) in a row
    pytest.param(
        [K, K, K, QK, QK, QK, QK, QK],
        [(2.0, "firing", K, "opened")],
        id="present-cause-holds",
    ),
    pytest.param(
        [K, K, K, QK, QK, QK, QK, QK, QK],
        [(2.0, "firing", K, "opened"), (8.0, "firing", Q, "cause_changed")],
        id="sustained-lead-changes",
    ),
    # the lead is unbroken or it starts again
    pytest.param(
        [K, K, K, QK, QK, QK, QK, QK, K, QK, QK, QK, QK, QK],
        [(2.0, "firing", K, "opened")],
        id="broken-lead-starts-again",
    ),
    # the end of a lead without the incident's symptoms is the clear margin
    pytest.param(
        [K, K, K, QK, QK, Q, Q, Q],
        [(2.0, "firing", K, "opened"), (7.0, "firing", Q, "cause_changed")],
        id="lead-then-gone",
    ),
    # damping: after one change, going back needs twice the lead (12)
    pytest.param(
        [K, K, K, *[QK] * 6, *[KQ] * 11],
        [(2.0, "firing", K, "opened"), (8.0, "firing", Q, "cause_changed")],
        id="damped-second-change",
    ),
    pytest.param(
        [K, K, K, *[QK] * 6, *[KQ] * 12],
        [
            (2.0, "firing", K, "opened"),
            (8.0, "firing", Q, "cause_changed"),
            (20.0, "firing", K, "cause_changed"),
        ],
        id="damped-second-change-after-twice-the-lead",
    ),
    # a hung engine is another episode: the slow one resolves, stalled opens
    pytest.param(
        [K, K, K, S, S, S],
        [
            (2.0, "firing", K, "opened"),
            (5.0, "resolved", K, "cause_changed"),
            (5.0, "firing", S, "cause_changed"),
        ],
        id="stalled-is-its-own-episode",
    ),
    # two different challengers in a row do not add up
    pytest.param([K, K, K, Q, P, Q, P], [(2.0, "firing", K, "opened")], id="flapping-challengers"),
    # the cause that fires is the one seen when it opens
    pytest.param([Q, Q, K], [(2.0, "firing", K, "opened")], id="opens-with-latest-cause"),
]


class TestTable:
    @pytest.mark.parametrize(("causes", "expected"), TABLE)
    def test_walk(
        self, causes: list[str | None], expected: list[tuple[float, str, str, str]]
    ) -> None:
        """Each sequence of evaluations gives exactly the transitions of the table."""
        t = IncidentTracker(open_after=3, resolve_after=2, change_cause_after=6)
        assert walk(t, causes) == expected

    def test_models_are_independent(self) -> None:
        """One model's incident does not open or hold another's."""
        t = IncidentTracker(open_after=1, resolve_after=1)
        assert [x.model_name for x in t.observe(d(0, K, "a"))] == ["a"]
        assert t.observe(d(1, None, "b")) == []
        assert t.state("a") is State.FIRING and t.state("b") is State.CLEAR

    def test_resolved_carries_start_and_reason(self) -> None:
        """A resolved transition names when the incident started and why it ended."""
        t = IncidentTracker(open_after=1, resolve_after=1)
        t.observe(d(10, K))
        (resolved,) = t.observe(d(25, None))
        assert resolved.started_at == 10 and resolved.at == 25
        assert resolved.reason is Reason.RESOLVED and resolved.cause == K

    def test_active(self) -> None:
        """Firing incidents are listed while they last, resolving ones included."""
        t = IncidentTracker(open_after=1, resolve_after=2)
        t.observe(d(0, K))
        t.observe(d(1, None))
        assert [(a.model_name, a.cause) for a in t.active()] == [("m", K)]
        t.observe(d(2, None))
        assert t.active() == []

    def test_counts_must_be_positive(self) -> None:
        """Zero evaluations to open or resolve is nonsense and refused."""
        with pytest.raises(ValueError):
            IncidentTracker(open_after=0)


class TestFlapDamping:
    """An incident that reopens with its cause soon after it resolved is the condition
    flapping: the clear stretch between proved nothing, so the next resolve needs more."""

    def test_a_quick_reopen_resolves_only_after_a_whole_flap_window(self) -> None:
        t = IncidentTracker(open_after=1, resolve_after=2, reopen_within=6)
        # opens at 0, resolves at 2, back at 5: 3 evaluations after the resolve
        assert walk(t, [K, None, None, None, None, K]) == [
            (0.0, "firing", K, "opened"),
            (2.0, "resolved", K, "resolved"),
            (5.0, "firing", K, "opened"),
        ]
        assert t.resolve_needed("m") == 6
        # five clear evaluations no longer resolve it; a breach starts the count again
        out = [x for i in range(6, 11) for x in t.observe(d(float(i), None))]
        assert out == [] and t.state("m") is State.RESOLVING
        assert t.observe(d(11.0, K)) == []
        out = [x for i in range(12, 18) for x in t.observe(d(float(i), None))]
        assert [(x.event, x.at) for x in out] == [("resolved", 17.0)]
        # and the next clean incident resolves as fast as ever
        assert t.resolve_needed("m") == 2 or t.state("m") is State.CLEAR

    def test_a_reopen_long_after_or_of_another_cause_is_a_new_condition(self) -> None:
        late = IncidentTracker(open_after=1, resolve_after=2, reopen_within=3)
        walk(late, [K, None, None, None, None, None, None, K])
        assert late.resolve_needed("m") == 2
        other = IncidentTracker(open_after=1, resolve_after=2, reopen_within=10)
        walk(other, [K, None, None, Q])
        assert other.resolve_needed("m") == 2

    def test_the_damping_can_be_turned_off(self) -> None:
        off = IncidentTracker(open_after=1, resolve_after=2, reopen_within=0)
        walk(off, [K, None, None, K])
        assert off.resolve_needed("m") == 2 and off.export()[0].resolved_cause is None


class TestTheTable:
    def test_every_state_and_event_has_exactly_one_rule(self) -> None:
        """The table is complete: no (state, event) falls through, except ``other`` and
        ``replaced`` while nothing is open (a cause is only "other" than an open one's)."""
        closed = {State.CLEAR, State.PENDING}
        challenges = {Event.OTHER, Event.REPLACED}
        want = {(s, e) for s in State for e in Event if not (s in closed and e in challenges)}
        assert set(RULES) == want

    def test_the_docstring_prints_the_table_the_code_runs(self) -> None:
        """Prose and code cannot drift: the module's docstring is rendered from RULES."""
        assert incidents.render_rules() in (incidents.__doc__ or "")
        for (state, event), rule in incidents.RULES.items():
            assert f"{state}" in incidents.render_rules() and f"{event}" in incidents.__doc__
            if rule.reason is not None:
                assert str(rule.reason) in incidents.__doc__

    def test_a_changed_table_changes_what_the_tracker_does(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The tracker reads the table: make a clear evaluation resolve at once and it does."""
        monkeypatch.setitem(
            RULES,
            (State.FIRING, Event.CLEAR),
            Rule(State.CLEAR, "run", "open_after", State.CLEAR, Reason.RESOLVED),
        )
        t = IncidentTracker(open_after=1, resolve_after=5)
        assert walk(t, [K, None]) == [
            (0.0, "firing", K, "opened"),
            (1.0, "resolved", K, "resolved"),
        ]


CAUSE_OR_CLEAR = st.sampled_from([K, Q, P, S, QK, KQ, None])


class TestExportRestore:
    @settings(max_examples=300, deadline=None)
    @given(
        causes=st.lists(st.tuples(st.sampled_from(["a", "b"]), CAUSE_OR_CLEAR), max_size=40),
        cut=st.integers(min_value=0, max_value=40),
        open_after=st.integers(min_value=1, max_value=4),
        resolve_after=st.integers(min_value=1, max_value=4),
        change_extra=st.integers(min_value=0, max_value=3),
    )
    def test_a_restored_tracker_carries_on_exactly(
        self,
        causes: list[tuple[str, str | None]],
        cut: int,
        open_after: int,
        resolve_after: int,
        change_extra: int,
    ) -> None:
        """Stopping after any evaluation, exporting, and restoring into a new tracker
        gives exactly the transitions of the tracker that never stopped."""

        def run(tracker: IncidentTracker, part: list[tuple[str, str | None]], first: int) -> list:
            out = []
            for i, (model, cause) in enumerate(part, start=first):
                out += tracker.observe(d(float(i), cause, model))
            return out

        def tracker() -> IncidentTracker:
            return IncidentTracker(
                open_after=open_after,
                resolve_after=resolve_after,
                change_cause_after=open_after + change_extra,
                reopen_within=6,
            )

        whole = tracker()
        expected = run(whole, causes, 0)
        before = tracker()
        got = run(before, causes[:cut], 0)
        after = tracker()
        after.restore(before.export())
        got += run(after, causes[cut:], min(cut, len(causes)))
        assert got == expected
        assert after.export() == whole.export()

    def test_export_holds_only_what_is_not_clear(self) -> None:
        t = IncidentTracker(open_after=2, resolve_after=2)
        t.observe(d(0, K, "a"))  # pending
        t.observe(d(0, None, "b"))  # clear
        t.observe(d(1, Q, "c"))
        t.observe(d(2, Q, "c"))  # firing
        assert [(r.model_name, r.state, r.run, r.cause) for r in t.export()] == [
            ("a", State.PENDING, 1, None),
            ("c", State.FIRING, 0, Q),
        ]

    def test_a_clear_track_is_kept_while_it_remembers_a_resolve(self) -> None:
        t = IncidentTracker(open_after=1, resolve_after=1, reopen_within=2)
        walk(t, [K, None])
        assert [(r.state, r.resolved_cause) for r in t.export()] == [(State.CLEAR, K)]
        walk(t, [None, None, None])  # remembered for reopen_within evaluations
        assert t.export() == ()

    @pytest.mark.parametrize(
        "fields",
        [
            {"state": State.CLEAR, "cause": None},
            {"state": State.FIRING, "cause": None},
            {"state": State.PENDING, "cause": K},
            {"state": State.FIRING, "cause": "melting"},
            {"state": State.FIRING, "cause": K, "challenger": "melting"},
            {"state": State.RESOLVING, "cause": K, "run": -1},
            {"state": State.FIRING, "cause": K, "changes": -1},
            {"state": State.FIRING, "cause": K, "opened_as": "melting"},
            {"state": "firing", "cause": K},
            {"state": State.FIRING, "cause": K, "started_at": math.nan},
        ],
        ids=[
            "clear",
            "firing-without-cause",
            "pending-with-cause",
            "unknown-cause",
            "unknown-challenger",
            "negative-count",
            "negative-changes",
            "unknown-opened-as",
            "state-not-a-state",
            "nan-start",
        ],
    )
    def test_a_damaged_record_is_refused(self, fields: dict[str, object]) -> None:
        """A record from outside (the state file) that the table could not have made."""
        values: dict[str, object] = {"model_name": "m", "run": 0, "started_at": 1.0, **fields}
        with pytest.raises(ValueError):
            TrackRecord(**values)  # type: ignore[arg-type]


class TestSustained:
    """A ``sustained`` diagnosis (a stall: it has already lasted stall_after_seconds) is
    not counted towards open_after: it opens, or takes an open incident over, at once."""

    @staticmethod
    def stalled(at: float) -> Diagnosis:
        return dataclasses.replace(d(at, S), sustained=True)

    def test_opens_at_once_whatever_open_after(self) -> None:
        for open_after in (1, 3, 9):
            t = IncidentTracker(open_after=open_after)
            out = t.observe(self.stalled(0.0))
            assert [(x.event, x.cause, x.reason) for x in out] == [("firing", S, Reason.OPENED)]

    def test_takes_over_an_open_incident_at_once(self) -> None:
        """A queue is firing and the engine hangs: the stall ends the queue's episode and
        starts its own on its first sustained evaluation."""
        t = IncidentTracker(open_after=3)
        walk(t, [Q, Q, Q])
        out = t.observe(self.stalled(3.0))
        assert [(x.event, x.cause) for x in out] == [("resolved", Q), ("firing", S)]

    def test_the_same_unsustained_waits_open_after(self) -> None:
        """Without the mark the same evaluations count as any breach does."""
        t = IncidentTracker(open_after=3)
        assert [x.at for i in range(3) for x in t.observe(d(float(i), S))] == [2.0]
