"""One target: scrape, parse, evaluate, publish the result, hand transitions to the notifier.

The scheduler calls ``scrape`` once per tick; everything that can go wrong with a
target (refused, slow, 500, garbage, too big) ends here as a counted, logged failure
and the next tick tries again. What it publishes is ``state.TargetState``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping

import httpx
import structlog

from vllm_triage.assemble import build_evaluator, build_rulebook, parse_limits
from vllm_triage.config.schema import Settings, TargetSettings
from vllm_triage.core.evaluate import Evaluation
from vllm_triage.core.incidents import TrackRecord
from vllm_triage.core.model import Signals, Snapshot, Transition
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.core.timeline import setting_values
from vllm_triage.errors import ParseError, ScrapeError, TooCostlyError
from vllm_triage.net.auth import auth_headers
from vllm_triage.net.fetch import fetch_async, not_metrics_hint
from vllm_triage.net.redact import safe_url
from vllm_triage.notify.notifier import Notifier
from vllm_triage.page.spec import load_spec
from vllm_triage.scrape.probe import Prober
from vllm_triage.serve.history import History
from vllm_triage.state import TargetState, View
from vllm_triage.store import StateStore

log = structlog.get_logger("vllm_triage.watcher")

#: A failing target logs its first failure at once, then one summary line per this
#: many seconds, and one line when it recovers: a dead target must not flood the logs.
FAILURE_LOG_EVERY_S = 60.0
#: A log field carries at most this much of a message chosen by a target.
LOG_TEXT_CHARS = 300


class TargetWatcher:
    def __init__(
        self,
        target: TargetSettings,
        settings: Settings,
        *,
        client: httpx.AsyncClient,
        notifier: Notifier | None,
        clock: Callable[[], float] = time.time,
        store: StateStore | None = None,
    ) -> None:
        own = settings.for_target(target)
        rulebook = build_rulebook(own)
        self.target = target
        self.evaluator = build_evaluator(own, rulebook)
        self.parser = SnapshotParser(limits=parse_limits(settings))
        self.state = TargetState(target.name, safe_url(target.url), rulebook.ceiling)
        spec = load_spec()
        self.state.history = History.for_interval(
            spec.measured_keys,
            history_seconds=spec.history_seconds,
            interval_seconds=settings.interval_seconds,
            settings_values=setting_values(rulebook),
        )
        self.in_flight = False
        self._client = client
        self._notifier = notifier
        self._clock = clock
        self._timeout = settings.scrape_timeout
        self._max_body = settings.max_body_bytes
        self._max_models = settings.max_models_per_target
        self._dropped_logged_at: float | None = None
        self._problems_logged_at: float | None = None
        self._problems_suppressed = 0
        self._headers = auth_headers(target)
        self._failing_since_log: float | None = None
        self._last_reason = ""
        self._suppressed = 0
        self._store = store
        #: The incident state last written to the store (written again only on change).
        self._saved: tuple[TrackRecord, ...] = ()
        if store is not None:
            self._saved = store.restored.incidents.pop(target.name, ())
            if self._saved:
                self.evaluator.restore(self._saved)
                log.info(
                    "incidents_restored",
                    target=target.name,
                    incidents=[f"{r.model_name}: {r.state} {r.cause or ''}" for r in self._saved],
                )
        #: The target's active probe, when its settings enable one (``daemon/scrape/probe.py``).
        self.prober: Prober | None = None
        if target.probe.enabled:
            self.prober = Prober(target, client=client, model=self._probe_model, clock=clock)
            self.state.probe = self.prober.stats

    def _probe_model(self) -> str | None:
        """The model the probe asks for: the first ``model_name`` the target exposes."""
        view = self.state.view
        if view is None or not view.evaluation.diagnoses:
            return None
        return min(view.evaluation.diagnoses)

    async def close(self) -> None:
        await self._client.aclose()

    async def scrape(self) -> None:
        """One tick: never raises for anything the target did."""
        self.in_flight = True
        st = self.state
        at = self._clock()
        started = time.monotonic()
        try:
            body = await fetch_async(
                self._client,
                self.target.url,
                timeout=self._timeout,
                max_body_bytes=self._max_body,
                headers=self._headers,
            )
            snapshot = await self._parse(body, at)
        except ScrapeError as exc:
            self._failed(exc.reason, str(exc))
            return
        except TooCostlyError as exc:
            self._failed("too_costly", f"refused: reading it would cost too much: {exc}")
            return
        except ParseError as exc:
            self._failed("parse", not_metrics_hint(st.url, exc))
            return
        except asyncio.CancelledError:
            # Only shutdown cancels a scrape (a timeout arrives as ScrapeError): one that
            # started as the scheduler stopped is not the target's fault, and letting the
            # cancellation out would make the scheduler log it as a crash.
            log.debug("scrape_cancelled", target=st.name)
            return
        finally:
            st.attempted(at, time.monotonic() - started)
            self.in_flight = False
        self.consume(snapshot)

    def known_models(self) -> frozenset[str]:
        """The models watched now: read first when a target exposes too many."""
        view = self.state.view
        return frozenset(view.evaluation.diagnoses) if view is not None else frozenset()

    async def _parse(self, body: bytes, at: float) -> Snapshot:
        """Parse on the event loop, a step of ``STEP_LINES`` lines at a time, letting the
        other targets' scrapes and the deliveries run between steps (a one-model vLLM
        body, about 600 lines, is one step)."""
        steps = self.parser.steps_bytes(body, at, keep=self.known_models())
        while True:
            try:
                next(steps)
            except StopIteration as done:
                snapshot: Snapshot = done.value
                return snapshot
            await asyncio.sleep(0)

    def consume(self, snapshot: Snapshot) -> None:
        """A scraped snapshot: evaluate it, publish the result, hand the transitions to
        the notifier. With a store, the incident state and what the notifier did are one
        transaction."""
        self._saving(lambda: self._consume(snapshot))

    def consume_signals(
        self,
        at: float,
        signals: Mapping[str, Signals],
        rulebooks: Mapping[str, Rulebook],
        problems: tuple[str, ...] = (),
    ) -> None:
        """Fleet mode: signals Prometheus windowed, with each model's own hardware and
        model facts (``Evaluator.judge``); published and notified as ``consume`` does."""
        self._saving(lambda: self._judge(at, signals, rulebooks, problems))

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

    def _consume(self, snapshot: Snapshot) -> None:
        if self.parser.models_dropped:
            self._dropped(len(snapshot.models))
        if self.prober is not None:
            # The core sees the probe as data, taken with the scrape.
            snapshot = dataclasses.replace(snapshot, probe=self.prober.status())
        self._publish(self.evaluator.step(snapshot))

    def _judge(
        self,
        at: float,
        signals: Mapping[str, Signals],
        rulebooks: Mapping[str, Rulebook],
        problems: tuple[str, ...],
    ) -> None:
        if len(signals) > self._max_models:
            keep = sorted(signals)[: self._max_models]
            self.state.models_dropped += len(signals) - len(keep)
            signals = {m: signals[m] for m in keep}
        for rules in rulebooks.values():
            self.state.ceiling = rules.ceiling  # what the API shows: the server's card
            break
        self._publish(self.evaluator.judge(at, signals, rulebooks, problems))

    def _publish(self, evaluation: Evaluation) -> None:
        st = self.state
        at = evaluation.at
        self._recovered()
        st.up, st.last_success_at = True, at
        if evaluation.problems:
            st.series_problems += len(evaluation.problems)
            self._log_problems(evaluation.problems)
        if not evaluation.accepted:
            log.warning("snapshot_out_of_order", target=st.name, at=at)
            return
        if st.history is not None:
            st.history.record(evaluation, self.evaluator.rulebook)
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
            self._notifier.notify(st.name, evaluation.transitions, now=at)

    def _dropped(self, kept: int) -> None:
        """The parser read at most ``max_models_per_target`` models (the ones already
        watched first, then the others in the order the target lists them); what it left
        out is counted and logged, never silently lost."""
        st = self.state
        dropped = self.parser.models_dropped
        st.models_dropped += dropped
        now = time.monotonic()
        if self._dropped_logged_at is None or now - self._dropped_logged_at >= FAILURE_LOG_EVERY_S:
            self._dropped_logged_at = now  # once a minute at most, like scrape failures
            log.warning(
                "models_dropped",
                target=st.name,
                exposed=kept + dropped,
                kept=kept,
                dropped=dropped,
                first_dropped=self.parser.first_dropped[:80],
            )

    def _log_problems(self, problems: tuple[str, ...]) -> None:
        """Unusable series are counted on every scrape and logged once a minute at most
        (a target that always sends a NaN must not write a line per scrape)."""
        now = time.monotonic()
        last = self._problems_logged_at
        if last is not None and now - last < FAILURE_LOG_EVERY_S:
            self._problems_suppressed += 1
            return
        log.warning(
            "series_unusable",
            target=self.state.name,
            problems=[p[:LOG_TEXT_CHARS] for p in problems[:5]],
            scrapes_since_last_log=self._problems_suppressed + 1,
        )
        self._problems_logged_at, self._problems_suppressed = now, 0

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

    def failed(self, reason: str, message: str) -> None:
        """A tick that gave nothing to evaluate: counted by reason, logged rate-limited."""
        self._failed(reason, message)

    def _failed(self, reason: str, message: str) -> None:
        st = self.state
        st.up = False
        st.failures[reason] += 1
        message = message[: 2 * LOG_TEXT_CHARS]
        st.last_error = message
        now = time.monotonic()
        last = self._failing_since_log
        # Logged at once when the reason changes (a timeout, then a redirect): new news.
        changed = reason != self._last_reason
        self._last_reason = reason
        if last is None or changed or now - last >= FAILURE_LOG_EVERY_S:
            log.warning(
                "scrape_failed",
                target=st.name,
                reason=reason,
                err=message,
                failures_since_last_log=self._suppressed + 1,
            )
            self._failing_since_log, self._suppressed = now, 0
        else:
            self._suppressed += 1

    def _recovered(self) -> None:
        if self._failing_since_log is not None:
            log.info("scrape_recovered", target=self.state.name, suppressed=self._suppressed)
        self._failing_since_log, self._suppressed, self._last_reason = None, 0, ""
