"""From incident transitions to notifications for every receiver.

Keeps the alerts that are firing now, so that a ``resolved`` carries the annotations its
``firing`` had (as Alertmanager shows them), and a log of what each receiver was last told
about each alert identity. Whether a receiver hears something is ``core.dedup``'s pure
decision over that log; what it hears is its ``Receiver``'s encoding. Time comes from the
caller (``now``), so the repeat rules are tested without a clock.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpx

from daemon.core.alerts import Alert, firing_alert
from daemon.core.dedup import LastSent, NotifyReason, needs_update
from daemon.core.model import Transition
from daemon.delivery import Delivery
from daemon.receivers import build_receiver
from daemon.settings import Settings

#: The log key of a batching receiver's last push of every active alert.
ALL_ACTIVE = "*"


class Notifier:
    """Turns transitions into notifications and hands them to each receiver's ``Delivery``."""

    def __init__(self, settings: Settings, client: httpx.AsyncClient, external_url: str) -> None:
        self.severity = settings.alerting.severity
        self.external_url = external_url
        self.deliveries = [
            Delivery(build_receiver(settings.receiver_name(i), r, external_url), client)
            for i, r in enumerate(settings.receivers)
        ]
        self.active: dict[str, Alert] = {}
        #: (receiver, alert key) -> what that receiver was last told about that alert.
        self.log: dict[tuple[str, str], LastSent] = {}

    def notify(self, target: str, transitions: Iterable[Transition], now: float) -> None:
        for t in transitions:
            alert = firing_alert(
                t, target=target, severity=self.severity, external_url=self.external_url
            )
            if t.event == "firing":
                self.active[alert.key] = alert
            else:
                alert = self.active.pop(alert.key, alert).resolved(t.at)
            for d in self.deliveries:
                key = (d.name, alert.key)
                if needs_update(self.log.get(key), alert.status, now, d.receiver.policy):
                    self._send(d, [alert], now)
                    if alert.status == "firing":
                        self.log[key] = LastSent("firing", now)
                if alert.status == "resolved":
                    # Forgotten whether or not this receiver heard the resolve: the next
                    # firing of the same identity is a first notification again.
                    self.log.pop(key, None)

    def tick(self, now: float) -> None:
        """Re-notify what is due: repeats for long incidents, re-sends to Alertmanager."""
        for d in self.deliveries:
            policy = d.receiver.policy
            if d.receiver.batches:
                last = self.log.get((d.name, ALL_ACTIVE))
                due = needs_update(last, "firing", now, policy) is NotifyReason.REPEAT
                if due and self.active:
                    self._send(d, list(self.active.values()), now)
                continue
            for key, alert in self.active.items():
                last = self.log.get((d.name, key))
                if needs_update(last, "firing", now, policy) is NotifyReason.REPEAT:
                    self._send(d, [alert], now)
                    self.log[(d.name, key)] = LastSent("firing", now)

    def _send(self, d: Delivery, alerts: list[Alert], now: float) -> None:
        for n in d.receiver.encode(alerts, now):
            d.submit(n)
        if d.receiver.batches:
            self.log[(d.name, ALL_ACTIVE)] = LastSent("firing", now)
