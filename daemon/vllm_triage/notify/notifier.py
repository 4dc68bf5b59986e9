"""From incident transitions to notifications for every receiver.

Keeps the alerts that are firing now, so that a ``resolved`` carries the annotations its
``firing`` had (as Alertmanager shows them), and a log of what each receiver was last told
about each alert identity. Whether a receiver hears something is ``core.dedup``'s pure
decision over that log; what it hears is its ``Receiver``'s encoding. Time comes from the
caller (``now``), so the repeat rules are tested without a clock.

With a state store, the active alerts and the log are restored from it at start and
written through on every change, so a restarted daemon sends a resolve for an alert it
told a receiver about before the restart, and repeats on the same schedule.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping

import structlog

from vllm_triage.core.alerts import Alert, episode, firing_alert
from vllm_triage.core.dedup import LastSent, NotifyReason, needs_update
from vllm_triage.core.model import Transition
from vllm_triage.notify.delivery import Delivery
from vllm_triage.store import StateStore

log = structlog.get_logger("vllm_triage.notifier")

#: The log key of a batching receiver's last push of every active alert.
ALL_ACTIVE = "*"


#: What a tick sends: repeats, and what a receiver was never told (one added to the
#: configuration while an incident fires hears of it, as Alertmanager's would).
DUE_AT_TICK = frozenset({NotifyReason.REPEAT, NotifyReason.FIRST})


class Notifier:
    """Turns transitions into notifications and hands them to each receiver's ``Delivery``."""

    def __init__(
        self,
        deliveries: list[Delivery],
        *,
        severity: str,
        external_url: str,
        store: StateStore | None = None,
    ) -> None:
        """``deliveries``: one per receiver, built by the assembly; ``external_url``:
        where an alert's links point (this daemon's address)."""
        self.severity = severity
        self.external_url = external_url
        self.store = store
        self.deliveries = deliveries
        self.active: dict[str, Alert] = {}
        #: (receiver, alert key) -> what that receiver was last told about that alert.
        self.log: dict[tuple[str, str], LastSent] = {}
        #: Fingerprints whose kept identity was said (``_same_identity``).
        self._kept_said: set[str] = set()
        if store is not None:
            self._restore(store)

    def _restore(self, store: StateStore) -> None:
        kept = store.restored
        self.active = dict(kept.alerts)
        names = {d.name for d in self.deliveries}
        self.log = {k: v for k, v in kept.log.items() if k[0] in names}
        for d in self.deliveries:
            d.restore(kept.outbox.pop(d.name, []))
        gone = ({r for r, _ in kept.log} | set(kept.outbox)) - names
        for receiver in sorted(gone):
            undelivered = len(kept.outbox.pop(receiver, []))
            log.warning(
                "receiver_gone",
                receiver=receiver,
                undelivered_dropped=undelivered,
                why="no longer configured; its log and queue are forgotten",
            )
            store.forget_receiver(receiver)

    def resync(self, store: StateStore) -> None:
        """The store came back empty after a failing disk: the alerts firing now and what
        each receiver was last told, written afresh."""
        for alert in self.active.values():
            store.put_alert(alert)
        for (receiver, key), last in self.log.items():
            store.put_log(receiver, key, last)

    def resolve_gone(self, targets: set[str], now: float) -> None:
        """Resolve the restored alerts of targets no longer configured: nothing will ever
        evaluate them again, and a receiver told they fire would show them for ever."""
        for alert in list(self.active.values()):
            target = alert.labels.get("target", "")
            if target in targets:
                continue
            log.warning(
                "incident_resolved_target_gone", target=target, diagnosis=alert.labels["diagnosis"]
            )
            self._announce(alert.resolved(now), now)

    def _set_active(self, alert: Alert) -> None:
        self.active[alert.key] = alert
        if self.store is not None:
            self.store.put_alert(alert)

    def _pop_active(self, alert: Alert) -> Alert:
        found = self.active.pop(alert.key, alert)
        if self.store is not None:
            self.store.delete_alert(alert.key)
        return found

    def _told(self, key: tuple[str, str], last: LastSent | None) -> None:
        """Record (or with None, forget) what a receiver was last told about an alert."""
        if last is None:
            self.log.pop(key, None)
        else:
            self.log[key] = last
        if self.store is not None:
            if last is None:
                self.store.delete_log(*key)
            else:
                self.store.put_log(*key, last)

    def _same_identity(self, alert: Alert) -> Alert:
        """``alert`` under the labels its open episode already has, where they differ: an
        incident open across an upgrade that changed the labels (server identity labels
        added) keeps its fingerprint until it resolves, so no receiver sees it fire
        twice or never resolve. Said once, when the old identity is first kept."""
        if alert.key in self.active:
            return alert
        ep = episode(alert.labels)
        for kept in self.active.values():
            if episode(kept.labels) == ep and kept.labels != alert.labels:
                if kept.key not in self._kept_said:
                    self._kept_said.add(kept.key)
                    log.info(
                        "alert_identity_kept",
                        target=ep[0],
                        model_name=ep[1],
                        diagnosis=ep[2],
                        fingerprint=kept.key,
                        why="an incident open before these labels were configured keeps "
                        "its labels until it resolves; the next one carries the new ones",
                    )
                return dataclasses.replace(alert, labels=kept.labels)
        return alert

    def notify(
        self,
        target: str,
        transitions: Iterable[Transition],
        now: float,
        server_labels: Mapping[str, str] | None = None,
    ) -> None:
        """``server_labels``: the server's identity labels, on each of its alerts."""
        for t in transitions:
            alert = firing_alert(
                t,
                target=target,
                severity=self.severity,
                external_url=self.external_url,
                server_labels=server_labels,
            )
            alert = self._same_identity(alert)
            if t.event == "firing":
                self._set_active(alert)
            else:
                alert = self.active.get(alert.key, alert).resolved(t.at)
            self._announce(alert, now)

    def _announce(self, alert: Alert, now: float) -> None:
        """Tell each receiver about ``alert`` if it should hear of it now."""
        if alert.status == "resolved":
            self._pop_active(alert)
        for d in self.deliveries:
            key = (d.name, alert.key)
            cause = alert.annotations.get("cause", "")
            if needs_update(self.log.get(key), alert.status, now, d.receiver.policy, cause):
                self._send(d, [alert], now)
                if alert.status == "firing":
                    self._told(key, LastSent("firing", now, cause))
            if alert.status == "resolved" and key in self.log:
                # Forgotten whether or not this receiver heard the resolve: the next
                # firing of the same identity is a first notification again.
                self._told(key, None)

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """One transaction of the store (if any) around several changes."""
        return self.store.batch() if self.store is not None else contextlib.nullcontext()

    def tick(self, now: float) -> None:
        """Re-notify what is due: repeats for long incidents, re-sends to Alertmanager."""
        with self.batch():
            self._tick(now)

    def _tick(self, now: float) -> None:
        for d in self.deliveries:
            policy = d.receiver.policy
            if d.receiver.batches:
                last = self.log.get((d.name, ALL_ACTIVE))
                due = needs_update(last, "firing", now, policy) in DUE_AT_TICK
                if due and self.active:
                    self._send(d, list(self.active.values()), now)
                continue
            for key, alert in self.active.items():
                last = self.log.get((d.name, key))
                if needs_update(last, "firing", now, policy) in DUE_AT_TICK:
                    self._send(d, [alert], now)
                    self._told((d.name, key), LastSent("firing", now, last.cause if last else ""))

    def _send(self, d: Delivery, alerts: list[Alert], now: float) -> None:
        for n in d.receiver.encode(alerts, now):
            d.submit(n)
        if d.receiver.batches:
            self._told((d.name, ALL_ACTIVE), LastSent("firing", now))
