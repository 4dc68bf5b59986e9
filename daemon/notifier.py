"""From incident transitions to notifications for every receiver.

Keeps the alerts that are firing now, so that a ``resolved`` carries the annotations its
``firing`` had (as Alertmanager shows them), a long incident is re-notified every
``repeat_interval_seconds``, and an ``alertmanager`` receiver gets every active alert
again every ``resend_seconds`` (Alertmanager expires an alert that is not re-sent).
Time comes from the caller (``now``), so the repeat rules are tested without a clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import httpx
import structlog

from daemon.alerts import Alert, firing_alert, postable_alerts, slack_payload, webhook_payload
from daemon.delivery import Delivery, Notification
from daemon.model import Transition
from daemon.settings import ReceiverSettings, Settings

log = structlog.get_logger("vllm_triage.notifier")

#: A pushed alert stays valid for this many resend periods (Prometheus uses 4).
VALID_FOR_RESENDS = 4


def _json(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _what(alert: Alert) -> str:
    labels = alert.labels
    return f"{alert.status} {labels['diagnosis']} {labels['target']}/{labels['model_name']}"


class Notifier:
    """Turns transitions into notifications and hands them to each receiver's ``Delivery``."""

    def __init__(self, settings: Settings, client: httpx.AsyncClient, external_url: str) -> None:
        self.severity = settings.alerting.severity
        self.external_url = external_url
        self.deliveries = [
            Delivery(settings.receiver_name(i), r, client) for i, r in enumerate(settings.receivers)
        ]
        self.active: dict[str, Alert] = {}
        #: (receiver, alert key) -> when that receiver was last told about that alert.
        self._last_sent: dict[tuple[str, str], float] = {}
        self._last_push: dict[str, float] = {}

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
                self._send(d, [alert], now)
            if t.event == "resolved":
                for d in self.deliveries:
                    self._last_sent.pop((d.name, alert.key), None)

    def tick(self, now: float) -> None:
        """Re-notify what is due: repeats for long incidents, re-sends to Alertmanager."""
        for d in self.deliveries:
            r = d.settings
            if r.type == "alertmanager":
                due = now - self._last_push.get(d.name, now) >= r.resend_seconds
                if due and self.active:
                    self._send(d, list(self.active.values()), now)
                continue
            for key, alert in self.active.items():
                last = self._last_sent.get((d.name, key))
                if last is not None and now - last >= r.repeat_interval_seconds:
                    self._send(d, [alert], now)

    def _send(self, d: Delivery, alerts: list[Alert], now: float) -> None:
        r: ReceiverSettings = d.settings
        # Alertmanager must hear of a resolve whatever send_resolved says (that is its
        # own receivers' setting): unheard, an alert stays firing there until it expires.
        if not r.send_resolved and r.type != "alertmanager":
            alerts = [a for a in alerts if a.status == "firing"]
        if not alerts:
            return
        what = ", ".join(_what(a) for a in alerts)
        if r.type == "alertmanager":
            body = postable_alerts(alerts, now=now, valid_for=VALID_FOR_RESENDS * r.resend_seconds)
            d.submit(Notification(_json(body), what, path="/api/v2/alerts"))
            self._last_push[d.name] = now
        elif r.type == "slack":
            for a in alerts:
                d.submit(Notification(_json(slack_payload(a)), _what(a)))
        else:
            for a in alerts:
                payload = webhook_payload(d.name, [a], self.external_url)
                d.submit(Notification(_json(payload), _what(a)))
        for a in alerts:
            self._last_sent[(d.name, a.key)] = now
