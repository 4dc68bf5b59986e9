"""One target after the core: evaluate a snapshot (or judge fleet signals), publish the
result, log it, hand the transitions to the notifier, save the incident state.

Both modes feed a ``Target``: the scrape loop (``scrape.loop``) hands it each snapshot it
read, fleet mode (``fleet.source``) the signals Prometheus windowed. Everything that
happens after the core happens here, once, whichever fed it. A ``Target`` knows nothing
of URLs, HTTP clients or parsers: fleet mode's servers are bare targets. The assembly
(``vllm_triage.assemble``) builds each one with its parts.

What goes wrong with a target's input ends as a counted, logged failure (``Health``):
logged at once, then once a minute while it lasts (``logs.Throttle``), and once when it
recovers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from vllm_triage.core.drive import evaluate
from vllm_triage.core.evaluate import Evaluation, Evaluator
from vllm_triage.core.incidents import TrackRecord
from vllm_triage.core.model import ProbeStatus, Signals, Snapshot, Transition
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.core.signals import INCONSISTENT_RESETS
from vllm_triage.errors import UnjudgeableError
from vllm_triage.logs import Throttle
from vllm_triage.notify.notifier import Notifier
from vllm_triage.state import FAILURE_REASONS, History, TargetState, View
from vllm_triage.store import StateStore

log = structlog.get_logger("vllm_triage.watcher")

#: A log field carries at most this much of a message chosen by a target.
LOG_TEXT_CHARS = 300


@dataclass(frozen=True, slots=True)
class TargetParts:
    """What the assembly builds for one target."""

    name: str
    #: The target's address as people may see it (no credentials; in fleet mode, the
    #: query API the server is read through).
    url: str
    evaluator: Evaluator
    history: History | None
    #: ``model_name`` values judged at most (fleet mode; a scrape's parser applies it).
    max_models: int
    #: The server's identity labels, on each of its alerts (``alerting.server_labels``).
    server_labels: Mapping[str, str] = field(default_factory=dict)


class Health:
    """A target's (or the fleet's query API's) up/down state and failure log: a failure
    is counted by reason and logged at once, then once a minute while it lasts, and once
    when it recovers. ``say``: where its lines go (default: the log)."""

    def __init__(self, state: TargetState, say: Any = None) -> None:
        self.state = state
        self.say = say or log
        self._failures = Throttle()

    def failed(self, reason: str, message: str) -> None:
        """A tick that gave nothing to evaluate: counted by reason, logged rate-limited."""
        st = self.state
        st.up = False
        reason = reason if reason in FAILURE_REASONS else "other"
        st.failures[reason] += 1
        message = message[: 2 * LOG_TEXT_CHARS]
        st.last_error = message
        # Logged at once when the reason changes (a timeout, then a redirect): new news.
        self._failures.warn(
            self.say, "scrape_failed", key=reason, target=st.name, reason=reason, err=message
        )

    def succeeded(self, at: float) -> None:
        self._failures.recovered(self.say, "scrape_recovered", target=self.state.name)
        self.state.up, self.state.last_success_at = True, at


class Target:
    def __init__(
        self,
        parts: TargetParts,
        *,
        notifier: Notifier | None,
        store: StateStore | None = None,
        say: Any = None,
    ) -> None:
        """``say``: where the target's lines about its conditions go (failures, unusable
        series, a clock going back; default: the log). Fleet mode gathers its servers'
        into one line per event a tick (``logs.Chorus``); incident transitions are always
        logged as they happen."""
        self.evaluator = parts.evaluator
        self.state = TargetState(parts.name, parts.url, parts.evaluator.rulebook.ceiling)
        self.state.history = parts.history
        self._say = say or log
        self.health = Health(self.state, self._say)
        self._max_models = parts.max_models
        self._server_labels = dict(parts.server_labels)
        self._notifier = notifier
        self._store = store
        self._problems = Throttle()
        self._inconsistent = Throttle()
        self._clock_back = Throttle()
        self._out_of_order = Throttle()
        #: The incident state last written to the store (written again only on change).
        self._saved: tuple[TrackRecord, ...] = ()
        if store is not None:
            self._saved = store.restored.incidents.pop(parts.name, ())
            if self._saved:
                self.evaluator.restore(self._saved)
                self._say.info(
                    "incidents_restored",
                    target=parts.name,
                    incidents=[f"{r.model_name}: {r.state} {r.cause or ''}" for r in self._saved],
                )

    @property
    def name(self) -> str:
        return self.state.name

    def known_models(self) -> frozenset[str]:
        """The models watched now: read first when a target exposes too many."""
        view = self.state.view
        return frozenset(view.evaluation.diagnoses) if view is not None else frozenset()

    def failed(self, reason: str, message: str) -> None:
        """A tick that gave nothing to evaluate (``Health.failed``)."""
        self.health.failed(reason, message)

    def unjudgeable(self, exc: BaseException) -> None:
        """Judging this target's data raised (a bug its data found): its failure, counted
        under ``evaluate`` and logged as any failure is; the other targets never see it."""
        self.failed("evaluate", str(UnjudgeableError.of(exc)))

    def consume(self, snapshot: Snapshot, probe: ProbeStatus | None = None) -> None:
        """A scraped snapshot: evaluate it, publish the result, hand the transitions to
        the notifier. With a store, the incident state and what the notifier did are one
        transaction."""
        self._in_order(snapshot.at)
        self._runtime(snapshot)
        try:
            evaluation = evaluate(self.evaluator, snapshot, probe)
        except Exception as exc:  # whatever a peer's data sets off (errors.py)
            self.unjudgeable(exc)
            return
        self._saving(lambda: self._publish(evaluation))

    def _runtime(self, snapshot: Snapshot) -> None:
        """The serving engine the target's metrics show: said when first seen, and
        whenever it changes (another engine at the address: its window starts again)."""
        shown = snapshot.runtime.shown
        before = self.state.runtime_shown
        if shown == before:
            return
        self.state.runtime, self.state.runtime_shown = snapshot.runtime.name, shown
        if not before:
            log.info("runtime_detected", target=self.state.name, runtime=shown)
        else:
            self.state.runtime_changes += 1
            log.warning(
                "runtime_changed",
                target=self.state.name,
                was=before,
                now=shown,
                consequence="its window starts again: the old engine's series are not compared",
            )

    def consume_signals(
        self,
        at: float,
        signals: Mapping[str, Signals],
        rulebooks: Mapping[str, Rulebook],
        problems: tuple[str, ...] = (),
    ) -> None:
        """Fleet mode: signals Prometheus windowed, with each model's own hardware and
        model facts (``Evaluator.judge``); published and notified as ``consume`` does."""
        self._in_order(at)
        try:
            evaluation = self._judge(at, signals, rulebooks, problems)
        except Exception as exc:  # whatever a peer's data sets off (errors.py)
            self.unjudgeable(exc)
            return
        self._saving(lambda: self._publish(evaluation))

    def resync(self, store: StateStore) -> None:
        """The store came back empty after a failing disk: this target's incidents now."""
        self._saved = self.evaluator.incidents.export()
        store.save_incidents(self.state.name, self._saved)

    def _in_order(self, at: float) -> None:
        """A time before the last evaluation's: the wall clock went back (an NTP step, a
        VM restored). Refused as out of order, every scrape would be dropped until the
        clock caught up, with ``up`` at 1; instead the window starts again from this
        one (``Evaluator.restart_window``), counted and said once (then once a minute
        while it keeps happening). The same time twice is a duplicate, refused."""
        last = self.evaluator.last_at
        if last is None or at >= last:
            return
        self.evaluator.restart_window()
        self.state.clock_steps_back += 1
        self._clock_back.warn(
            self._say,
            "clock_went_back",
            count="times_since_last_log",
            target=self.state.name,
            back_seconds=round(last - at, 3),
            consequence="the window starts again from this scrape",
        )

    def _saving(self, evaluate: Callable[[], None]) -> None:
        if self._store is None:
            evaluate()
            return
        with self._store.batch():
            evaluate()
            records = self.evaluator.incidents.export()
            if records != self._saved:
                self._store.save_incidents(self.state.name, records)
                self._saved = records

    def _judge(
        self,
        at: float,
        signals: Mapping[str, Signals],
        rulebooks: Mapping[str, Rulebook],
        problems: tuple[str, ...],
    ) -> Evaluation:
        if len(signals) > self._max_models:
            keep = sorted(signals)[: self._max_models]
            self.state.models_dropped += len(signals) - len(keep)
            signals = {m: signals[m] for m in keep}
        for rules in rulebooks.values():
            self.state.ceiling = rules.ceiling  # what the API shows: the server's card
            break
        return self.evaluator.judge(at, signals, rulebooks, problems)

    def _publish(self, evaluation: Evaluation) -> None:
        st = self.state
        at = evaluation.at
        self.health.succeeded(at)
        if evaluation.problems:
            st.series_problems += len(evaluation.problems)
            self._log_problems(evaluation.problems)
        self._log_inconsistent(evaluation)
        if not evaluation.accepted:
            self._out_of_order.warn(
                self._say,
                "snapshot_out_of_order",
                count="times_since_last_log",
                target=st.name,
                at=at,
            )
            return
        if st.history is not None:
            st.history.record(evaluation)
        incidents = self.evaluator.incidents
        st.view = View(
            evaluation=evaluation,
            states={m: incidents.state(m) for m in evaluation.diagnoses},
            active=tuple(incidents.active()),
            clear_runs={m: incidents.clear_run(m) for m in evaluation.diagnoses},
            resolve_after=incidents.resolve_after,
            resolve_needed={m: incidents.resolve_needed(m) for m in evaluation.diagnoses},
        )
        for t in evaluation.transitions:
            self._log_transition(t)
            st.recent.append(t)
            st.transitions += 1
            if t.continues:
                st.cause_changes[(t.model_name, t.cause)] += 1
            elif t.event == "firing":
                st.incidents_opened[(t.model_name, t.cause)] += 1
        if evaluation.transitions and self._notifier is not None:
            self._notifier.notify(
                st.name, evaluation.transitions, now=at, server_labels=self._server_labels
            )

    def _log_inconsistent(self, evaluation: Evaluation) -> None:
        """Counters that go back and forth (two servers behind one address): their rates
        are left out by the core; said once a minute at most while it lasts."""
        resets = {
            m: s.counter_resets
            for m, s in evaluation.signals.items()
            if s.counter_resets >= INCONSISTENT_RESETS
        }
        if not resets:
            self._inconsistent.clear()
            return
        self._inconsistent.warn(
            self._say,
            "counters_inconsistent",
            count=None,
            target=self.state.name,
            resets_in_window=resets,
            consequence="rates and latencies of this target are left out: is more than "
            "one server behind its address?",
        )

    def _log_problems(self, problems: tuple[str, ...]) -> None:
        """Unusable series are counted on every scrape and logged once a minute at most
        (a target that always sends a NaN must not write a line per scrape)."""
        self._problems.warn(
            self._say,
            "series_unusable",
            count="scrapes_since_last_log",
            target=self.state.name,
            problems=[p[:LOG_TEXT_CHARS] for p in problems[:5]],
        )

    def _log_transition(self, t: Transition) -> None:
        d = t.diagnosis
        log.info(
            f"incident_{t.event}",
            target=self.state.name,
            model_name=t.model_name,
            diagnosis=t.cause,
            reason=str(t.reason),
            confidence=round(d.confidence, 2),
            summary=d.summary,
            lasted_s=round(t.at - t.started_at, 1) if t.event == "resolved" else None,
            opened_as=t.identity_cause if t.identity_cause != t.cause else None,
            cause_changed_from=t.previous_cause,
            change=t.change or None,
            contributing=[f"{c.cause} {c.share:.0%}" for c in d.contributing] or None,
            evidence=dict(d.evidence) if t.event == "firing" else None,
        )
