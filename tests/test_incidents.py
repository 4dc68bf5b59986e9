"""Tests for daemon/core/incidents.py: the state table, walked case by case."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.core import incidents
from daemon.core.incidents import RULES, Event, IncidentTracker, Rule, State, TrackRecord
from daemon.core.model import Diagnosis, Reason


def d(at: float, cause: str | None, model: str = "m") -> Diagnosis:
    return Diagnosis(model_name=model, at=at, breaches=("x",) if cause else (), cause=cause)  # type: ignore[arg-type]


def walk(tracker: IncidentTracker, causes: list[str | None]) -> list[tuple[float, str, str, str]]:
    out = []
    for i, cause in enumerate(causes):
        for t in tracker.observe(d(float(i), cause)):
            out.append((t.at, t.event, t.cause, str(t.reason)))
    return out


K, Q, P = "kv_pressure", "queue_bound", "prefill_bound"

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
    # a different cause must also persist before the identity switches
    pytest.param(
        [K, K, K, Q, K, Q, Q, Q],
        [
            (2.0, "firing", K, "opened"),
            (7.0, "resolved", K, "cause_changed"),
            (7.0, "firing", Q, "cause_changed"),
        ],
        id="cause-change",
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
        assert walk(IncidentTracker(open_after=3, resolve_after=2), causes) == expected

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


class TestTheTable:
    def test_every_state_and_event_has_exactly_one_rule(self) -> None:
        """The table is complete: no (state, event) falls through, except ``other`` while
        nothing is open (a cause is only "other" than an open incident's)."""
        closed = {State.CLEAR, State.PENDING}
        want = {(s, e) for s in State for e in Event if not (s in closed and e is Event.OTHER)}
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


CAUSE_OR_CLEAR = st.sampled_from([K, Q, P, None])


class TestExportRestore:
    @settings(max_examples=300, deadline=None)
    @given(
        causes=st.lists(st.tuples(st.sampled_from(["a", "b"]), CAUSE_OR_CLEAR), max_size=40),
        cut=st.integers(min_value=0, max_value=40),
        open_after=st.integers(min_value=1, max_value=4),
        resolve_after=st.integers(min_value=1, max_value=4),
    )
    def test_a_restored_tracker_carries_on_exactly(
        self,
        causes: list[tuple[str, str | None]],
        cut: int,
        open_after: int,
        resolve_after: int,
    ) -> None:
        """Stopping after any evaluation, exporting, and restoring into a new tracker
        gives exactly the transitions of the tracker that never stopped."""

        def run(tracker: IncidentTracker, part: list[tuple[str, str | None]], first: int) -> list:
            out = []
            for i, (model, cause) in enumerate(part, start=first):
                out += tracker.observe(d(float(i), cause, model))
            return out

        whole = IncidentTracker(open_after=open_after, resolve_after=resolve_after)
        expected = run(whole, causes, 0)
        before = IncidentTracker(open_after=open_after, resolve_after=resolve_after)
        got = run(before, causes[:cut], 0)
        after = IncidentTracker(open_after=open_after, resolve_after=resolve_after)
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

    @pytest.mark.parametrize(
        "fields",
        [
            {"state": State.CLEAR, "cause": None},
            {"state": State.FIRING, "cause": None},
            {"state": State.PENDING, "cause": K},
            {"state": State.FIRING, "cause": "melting"},
            {"state": State.FIRING, "cause": K, "challenger": "melting"},
            {"state": State.RESOLVING, "cause": K, "run": -1},
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
            "state-not-a-state",
            "nan-start",
        ],
    )
    def test_a_damaged_record_is_refused(self, fields: dict[str, object]) -> None:
        """A record from outside (the state file) that the table could not have made."""
        values: dict[str, object] = {"model_name": "m", "run": 0, "started_at": 1.0, **fields}
        with pytest.raises(ValueError):
            TrackRecord(**values)  # type: ignore[arg-type]
