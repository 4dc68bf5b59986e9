"""One small object per receiver type: how its payload is encoded and how often it hears.

Built once per configured receiver (``build_receiver``), so the receiver's type is read
in one place; the notifier and the delivery queue only call what the object offers.

    type                   body                                   repeats
    ─────────────────────  ─────────────────────────────────────  ─────────────────────
    alertmanager_webhook   Alertmanager's webhook v4, one alert   repeat_interval_seconds
    slack                  a readable message, one alert          repeat_interval_seconds
    alertmanager           POST /api/v2/alerts, every alert       resend_seconds, all
                           firing now in one push                 active alerts at once;
                                                                  always hears resolves
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from vllm_triage.config.schema import ReceiverSettings
from vllm_triage.core.alerts import Alert, postable_alerts, slack_payload, webhook_payload
from vllm_triage.core.dedup import SendPolicy
from vllm_triage.store import Notification

#: A pushed alert stays valid for this many resend periods (Prometheus uses 4).
VALID_FOR_RESENDS = 4


def _json(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8")


def describe(alert: Alert) -> str:
    labels = alert.labels
    return f"{alert.status} {labels['diagnosis']} {labels['target']}/{labels['model_name']}"


class Receiver(ABC):
    """A configured receiver: its name, settings, sending rules and payload encoding."""

    #: True when every active alert is re-sent together (one push), not one by one.
    batches = False

    def __init__(self, name: str, settings: ReceiverSettings, external_url: str) -> None:
        self.name = name
        self.settings = settings
        self.external_url = external_url
        self.policy = SendPolicy(
            send_resolved=settings.send_resolved,
            repeat_after_seconds=settings.repeat_interval_seconds,
        )

    @property
    def url(self) -> str:
        """Where notifications go (a secret: never logged)."""
        return self.settings.url.get_secret_value().rstrip("/")

    @abstractmethod
    def encode(self, alerts: Sequence[Alert], now: float) -> list[Notification]:
        """The notifications that tell this receiver about ``alerts``."""


class WebhookReceiver(Receiver):
    def encode(self, alerts: Sequence[Alert], now: float) -> list[Notification]:
        return [
            Notification(_json(webhook_payload(self.name, [a], self.external_url)), describe(a))
            for a in alerts
        ]


class SlackReceiver(Receiver):
    def encode(self, alerts: Sequence[Alert], now: float) -> list[Notification]:
        return [Notification(_json(slack_payload(a)), describe(a)) for a in alerts]


class AlertmanagerReceiver(Receiver):
    batches = True

    def __init__(self, name: str, settings: ReceiverSettings, external_url: str) -> None:
        super().__init__(name, settings, external_url)
        # Alertmanager must hear of a resolve whatever send_resolved says (that is its
        # own receivers' setting): unheard, an alert stays firing there until it expires.
        # And every active alert is re-sent each resend_seconds, or Alertmanager expires it.
        self.policy = SendPolicy(send_resolved=True, repeat_after_seconds=settings.resend_seconds)

    @property
    def url(self) -> str:
        # Given as Alertmanager's base URL; accept the full API path too.
        return super().url.removesuffix("/api/v2/alerts")

    def encode(self, alerts: Sequence[Alert], now: float) -> list[Notification]:
        valid_for = VALID_FOR_RESENDS * self.settings.resend_seconds
        body = postable_alerts(alerts, now=now, valid_for=valid_for)
        what = ", ".join(describe(a) for a in alerts)
        return [Notification(_json(body), what, path="/api/v2/alerts")]


_TYPES: dict[str, type[Receiver]] = {
    "alertmanager_webhook": WebhookReceiver,
    "slack": SlackReceiver,
    "alertmanager": AlertmanagerReceiver,
}


def build_receiver(name: str, settings: ReceiverSettings, external_url: str) -> Receiver:
    return _TYPES[settings.type](name, settings, external_url)
