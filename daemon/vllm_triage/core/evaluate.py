"""The core's entry points: one target's snapshots in, diagnoses and transitions out.

``run``, ``replay`` and the tests all drive the core through ``Evaluator.step``, so a
recording replays exactly as it ran live. Fleet mode, where Prometheus has already done
the windowing, hands over the signals themselves (``Evaluator.judge``): the same
diagnosis, incidents and restore rules, without the window.

After a restart (``restore``) the incidents carry on but the window starts empty, and an
empty or young window has too little data to breach anything: read as "clear", it would
resolve an incident that is still going on. So for one window after the restore, an
evaluation without a breach does not count towards ending a restored incident (a breach
counts at once); from then on the window holds only evidence seen since the restart, and
the incident resolves after ``resolve_after`` clear evaluations as it always does.

A clear evaluation that could not judge a latency SLO (too few observations in the
window while requests were in flight, ``Diagnosis.inconclusive``) is no evidence that an
open incident is over: for up to ``THIN_HOLD_WINDOWS`` windows such evaluations are kept
from the tracker, as a frozen engine's are.

While an incident is open its cause stays the primary one as long as its symptoms are
present (``core.incidents`` decides when a challenger has led long enough to take
over); until then the published diagnosis keeps the incident's cause and names the
challenger as contributing. Confidence is smoothed while a model's cause stays the same
(``CONFIDENCE_WEIGHT``), so one check flipping at its cut-off does not make the number
jump window to window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from vllm_triage.core.diagnose import judged
from vllm_triage.core.facts import Facts, measurements
from vllm_triage.core.incidents import IncidentTracker, State, TrackRecord
from vllm_triage.core.model import Cause, Diagnosis, Signals, Snapshot, Transition
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.core.totals import Window

#: The weight of a new evaluation in a model's smoothed confidence (an exponentially
#: weighted mean over about four evaluations), reported to the nearest 0.05.
CONFIDENCE_WEIGHT = 0.25

#: How long, in windows, clear evaluations that could not judge a latency SLO (too few
#: observations with requests in flight) keep an open incident from resolving: long
#: enough to ride out a sparse load's quiet minute, short enough that a trickle of
#: traffic after the incident cannot keep it open for ever.
THIN_HOLD_WINDOWS = 5


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The outcome of one snapshot. ``accepted`` is False for an out-of-order snapshot."""

    at: float
    accepted: bool
    signals: dict[str, Signals] = field(default_factory=dict)
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict)
    transitions: list[Transition] = field(default_factory=list)
    problems: tuple[str, ...] = ()
    #: Per model: every finite number the status page and the report chart, keyed as the
    #: evidence names them (``facts.measurements``), taken from the published diagnosis
    #: once here, so every reader of one evaluation sees the same numbers.
    measurements: dict[str, dict[str, float]] = field(default_factory=dict)


class Evaluator:
    """Window, classifier and incident tracker for one target. ``rulebook_for`` gives a
    served model (vLLM's ``model_name``) its own rulebook: a pure function the assembly
    lends (``assemble.model_rulebooks``), so the core never reads a table itself."""

    def __init__(
        self,
        rulebook: Rulebook,
        *,
        rulebook_for: Callable[[str], Rulebook] | None = None,
        window_seconds: float = 60.0,
        open_after: int = 3,
        resolve_after: int = 3,
        change_cause_after: int | None = None,
        reopen_within: int = 60,
    ) -> None:
        self.rulebook = rulebook
        #: A served model's own rulebook (the assembly's: the bundled model table where
        #: the settings leave the model's facts to it), else ``rulebook``. Pure, cached.
        self.rulebook_for = rulebook_for
        #: The scrapes' window, made at the first (``window``): fleet mode's targets are
        #: judged from signals windowed elsewhere, and never hold one.
        self._window: Window | None = None
        self.incidents = IncidentTracker(
            open_after=open_after,
            resolve_after=resolve_after,
            change_cause_after=change_cause_after,
            reopen_within=reopen_within,
        )
        self.window_seconds = window_seconds
        #: Models restored with an incident, until one window has passed since the restore.
        self._warming: set[str] = set()
        self._warm_from: float | None = None
        #: The time of the last evaluation: a later one must be newer.
        self._last_at: float | None = None
        #: Per model: the cause its confidence is smoothed for, and the unrounded mean.
        self._confidence: dict[str, tuple[Cause, float]] = {}
        #: Per model with an open incident: when its run of inconclusive clears began.
        self._thin_since: dict[str, float] = {}

    def restore(self, records: tuple[TrackRecord, ...]) -> None:
        """Carry on from the incidents a previous run exported (see the module's note)."""
        self.incidents.restore(records)
        self._warming = {r.model_name for r in records}
        self._warm_from = None

    @property
    def window(self) -> Window:
        """The window the scrapes are read in (``step``)."""
        if self._window is None:
            self._window = Window(
                self.window_seconds, min_observations=self.rulebook.thresholds.min_observations
            )
        return self._window

    @property
    def last_at(self) -> float | None:
        """The time of the last evaluation accepted (None before the first)."""
        return self._last_at

    def restart_window(self) -> None:
        """Start the window again, empty: the clock went back (an NTP step, a VM restored
        from a snapshot), so the snapshots held are from a future that will not come, and
        every new one would be refused as out of order until the clock caught up with
        them. Open incidents carry on as after a restore (the module's note): a young
        window's clear evaluations do not resolve them for one window."""
        self._window = None  # made again, empty, at the next scrape
        self._last_at = None
        self._warming = {a.model_name for a in self.incidents.active()}
        self._warm_from = None
        self._thin_since.clear()

    def _warming_up(self, model: str, d: Diagnosis, at: float) -> bool:
        """Whether this clear evaluation is too early after a restore to count."""
        if not self._warming:
            return False
        if self._warm_from is None:
            self._warm_from = at
        if at - self._warm_from >= self.window_seconds:
            self._warming.clear()
            return False
        return (
            d.cause is None
            and model in self._warming
            and self.incidents.state(model) is not State.CLEAR
        )

    def step(self, snapshot: Snapshot) -> Evaluation:
        problems = snapshot.problems
        newest = self.window.newest
        if newest is not None and newest.runtime.name != snapshot.runtime.name:
            # Another engine answers at the target's address: its series are not the
            # old engine's, so nothing of the old window is compared with them.
            problems = (
                *problems,
                f"the target's engine changed from {newest.runtime.shown} to "
                f"{snapshot.runtime.shown}: its window starts again",
            )
            self._window = None  # made again, empty, below
        if not self.window.push(snapshot):
            return Evaluation(at=snapshot.at, accepted=False, problems=problems)
        self._last_at = snapshot.at
        signals = {model: self.window.signals(model) for model in self.window.models()}
        return self._judge(snapshot.at, signals, {}, problems)

    def judge(
        self,
        at: float,
        signals: Mapping[str, Signals],
        rulebooks: Mapping[str, Rulebook] | None = None,
        problems: tuple[str, ...] = (),
    ) -> Evaluation:
        """Signals windowed elsewhere (fleet mode: by Prometheus), judged as ``step``
        judges the window's. ``rulebooks`` gives a model its own hardware and model facts
        (default: this evaluator's rulebook). A time not after the last evaluation is
        refused, as an out-of-order snapshot is."""
        if self._last_at is not None and at <= self._last_at:
            return Evaluation(at=at, accepted=False, problems=problems)
        self._last_at = at
        return self._judge(at, dict(signals), rulebooks or {}, problems)

    def _rules(self, model: str) -> Rulebook:
        return self.rulebook if self.rulebook_for is None else self.rulebook_for(model)

    def _diagnose(
        self, s: Signals, rules: Rulebook, *, keep: Cause | None = None, facts: Facts | None = None
    ) -> tuple[Diagnosis, Facts | None]:
        d, facts = judged(s, rules, keep=keep, facts=facts)
        if rules.provenance:
            d = dataclasses.replace(d, evidence=dict(d.evidence) | dict(rules.provenance))
        return d, facts

    def _thin(self, model: str, d: Diagnosis) -> bool:
        """Whether ``d`` is a clear evaluation too thin to count against an open incident
        (see the module's note): only for a while, from the first of them in a row."""
        if d.breached or not d.inconclusive or self.incidents.open_cause(model) is None:
            self._thin_since.pop(model, None)
            return False
        since = self._thin_since.setdefault(model, d.at)
        return d.at - since < THIN_HOLD_WINDOWS * self.window_seconds

    def _steady_confidence(self, model: str, d: Diagnosis) -> Diagnosis:
        """``d`` with its confidence smoothed while the model's cause stays the same."""
        if d.cause is None:
            self._confidence.pop(model, None)
            return d
        before = self._confidence.get(model)
        mean = d.confidence
        if before is not None and before[0] == d.cause:
            mean = before[1] + CONFIDENCE_WEIGHT * (d.confidence - before[1])
        self._confidence[model] = (d.cause, mean)
        return dataclasses.replace(d, confidence=round(round(mean * 20) / 20, 2))

    def _judge(
        self,
        at: float,
        signals: dict[str, Signals],
        rulebooks: Mapping[str, Rulebook],
        problems: tuple[str, ...],
    ) -> Evaluation:
        diagnoses: dict[str, Diagnosis] = {}
        measured: dict[str, dict[str, float]] = {}
        transitions: list[Transition] = []
        for model in sorted(signals):
            rules = rulebooks.get(model) or self._rules(model)
            d, facts = self._diagnose(signals[model], rules)
            # Two reasons to keep a verdict from the tracker: the diagnosis itself has
            # none (a frozen engine, not yet stalled), or it is a clear evaluation too
            # early after a restore to count towards resolving.
            moved: list[Transition] = []
            if not d.held and not self._warming_up(model, d, at) and not self._thin(model, d):
                moved = self.incidents.observe(d)
            # The tracker has counted the leading cause; what is published keeps the
            # open incident's cause while it is still present, the leader contributing.
            kept = self.incidents.open_cause(model)
            if kept is not None and d.cause not in (None, kept) and kept in d.present:
                d, facts = self._diagnose(signals[model], rules, keep=kept, facts=facts)
            d = self._steady_confidence(model, d)
            diagnoses[model] = d
            measured[model] = measurements(signals[model], d, rules, facts=facts)
            transitions.extend(dataclasses.replace(t, diagnosis=d) for t in moved)
        self.incidents.forget_clear(set(diagnoses))
        for model in set(self._confidence) - set(diagnoses):
            del self._confidence[model]
        for model in set(self._thin_since) - set(diagnoses):
            del self._thin_since[model]
        return Evaluation(
            at=at,
            accepted=True,
            signals=signals,
            diagnoses=diagnoses,
            transitions=transitions,
            problems=problems,
            measurements=measured,
        )
