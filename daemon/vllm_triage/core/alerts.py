"""Incident transitions as alerts, and alerts as the payloads receivers expect.

Pure: every time comes from the transition (or from the caller), so the same incident
always gives the same bytes. The shapes are Alertmanager's, so anything built for
Alertmanager works unchanged:

- ``webhook_payload``: the webhook body Alertmanager 0.25+ POSTs (``version: "4"``),
  field for field as in ``tests/fixtures/alertmanager/``;
- ``postable_alerts``: the body of ``POST /api/v2/alerts`` (what Prometheus pushes);
- ``slack_payload``: a readable message for a Slack-compatible incoming webhook.

One alert identity per incident episode (``core.incidents``): its labels are
``alertname`` (one per cause, so Alertmanager's default grouping by ``alertname`` groups
by cause), ``severity``, ``target``, ``model_name`` and ``diagnosis``, where the cause is
the one the episode *opened* with, and the server's identity labels (``namespace`` and
``pod`` in Kubernetes, or whatever names the server in Prometheus: the same labels the
rules' alerts carry, so that an inhibit rule can match the two per server). Labels are
an alert's identity in Alertmanager, so they must not change while the episode lasts;
what does change (the current cause after a change, why it changed, the contributing
causes) is in the annotations: ``cause``, ``cause_changed_from``, ``cause_change`` and
``contributing``.

Who reads an alert in the end is Alertmanager's receivers' business (Slack, a pager, an
email), each with its own markup: so a peer's text in the labels and annotations (model
and engine names, a server's labels) is kept to one line with its control characters
shown as escapes (``core.shown.one_line``), each annotation is cut to
``ANNOTATION_MAX_CHARS``, and markup is left to each receiver. The list annotations
(``remediation``, ``predicted_effects``, ``contributing``) keep their one item per line.
``slack_payload`` escapes for Slack.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

from vllm_triage.core.model import Cause, Diagnosis, Transition
from vllm_triage.core.predict import effect_text
from vllm_triage.core.shown import one_line, slack, slack_code

ALERTNAMES: dict[Cause, str] = {
    "stalled": "VllmEngineStalled",
    "kv_pressure": "VllmKvPressure",
    "queue_bound": "VllmQueueBound",
    "prefill_bound": "VllmPrefillBound",
    "decode_bound": "VllmDecodeBound",
}
#: What Alertmanager writes as the ``endsAt`` of an alert that is still firing.
GO_ZERO_TIME = "0001-01-01T00:00:00Z"

_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_MASK = (1 << 64) - 1
_SEPARATOR = 0xFF


def fingerprint(labels: Mapping[str, str]) -> str:
    """Alertmanager's ``model.LabelSet.Fingerprint``: FNV-1a 64 over the sorted label
    names and values, each followed by the byte 0xff, as 16 hex digits."""
    h = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode("utf-8"):
                h = ((h ^ byte) * _FNV_PRIME) & _MASK
            h = ((h ^ _SEPARATOR) * _FNV_PRIME) & _MASK
    return f"{h:016x}"


def go_time(at: float) -> str:
    """``at`` as Go's ``time.RFC3339Nano`` in UTC (how Alertmanager writes times):
    the fraction of a second trimmed of trailing zeros, none when whole."""
    micros = round(at * 1_000_000)
    seconds, frac = divmod(micros, 1_000_000)
    text = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        text += "." + f"{frac:06d}".rstrip("0")
    return text + "Z"


def label_set_string(labels: Mapping[str, str]) -> str:
    """Alertmanager's ``LabelSet.String()``: ``{a="x", b="y"}``, sorted."""
    return (
        "{"
        + ", ".join(f"{k}={json.dumps(labels[k], ensure_ascii=False)}" for k in sorted(labels))
        + "}"
    )


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert identity's state, as Alertmanager models an alert."""

    status: Literal["firing", "resolved"]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float
    ends_at: float | None  # None while firing
    generator_url: str

    @property
    def key(self) -> str:
        return fingerprint(self.labels)

    def resolved(self, at: float) -> Alert:
        return dataclasses.replace(self, status="resolved", ends_at=at)

    def as_webhook(self) -> dict[str, Any]:
        return {
            "status": self.status,
            # Alertmanager (Go's encoding/json) writes map keys sorted.
            "labels": _sorted(self.labels),
            "annotations": _sorted(self.annotations),
            "startsAt": go_time(self.starts_at),
            "endsAt": GO_ZERO_TIME if self.ends_at is None else go_time(self.ends_at),
            "generatorURL": self.generator_url,
            "fingerprint": self.key,
        }


def _format_number(value: float) -> str:
    return f"{value:.4g}"


def evidence_text(d: Diagnosis) -> str:
    """The evidence as one line of ``key=value`` pairs, in the order it was gathered."""
    parts = []
    for key, value in d.evidence.items():
        if value is None:
            continue
        if isinstance(value, float):
            shown = _format_number(value)
        elif isinstance(value, tuple):
            shown = ",".join(value)
        else:
            shown = str(value)
        parts.append(f"{key}={shown}")
    return ", ".join(parts)


#: The numbers that decide each cause, in the order a person reads them: the alert's
#: ``deciding`` annotation and its Slack message show these (the full evidence stays in
#: the ``evidence`` annotation, the webhook's JSON and the API). (key, label, unit).
DECIDING: dict[Cause, tuple[tuple[str, str, str], ...]] = {
    "stalled": (
        ("stall_kind", "kind", ""),
        ("engines_stalled", "engines", ""),
        ("seconds_without_progress", "no progress for", "s"),
        ("requests_running", "running", ""),
        ("requests_waiting", "waiting", ""),
    ),
    "kv_pressure": (
        ("kv_usage_max", "KV used at peak", "%"),
        ("kv_headroom_requests", "room for", " requests"),
        ("preemptions_per_second", "preemptions", "/s"),
        ("requests_waiting_mean", "waiting", ""),
        ("ttft_p99_seconds", "TTFT p99", "s"),
    ),
    "queue_bound": (
        ("requests_waiting_mean", "waiting", ""),
        ("queue_share_of_ttft", "queue share of TTFT", "%"),
        ("ttft_p99_seconds", "TTFT p99", "s"),
        ("kv_usage_max", "KV used at peak", "%"),
    ),
    "prefill_bound": (
        ("ttft_p99_seconds", "TTFT p99", "s"),
        ("mean_prompt_tokens", "prompt", " tokens"),
        ("render_share_of_ttft", "rendering share of TTFT", "%"),
        ("prefill_time_share", "finished requests' time in prefill", "%"),
        ("itl_p99_seconds", "ITL p99", "s"),
    ),
    "decode_bound": (
        ("itl_p99_seconds", "ITL p99", "s"),
        ("decode_limit", "limit", ""),
        ("decode_roofline_ratio", "of the roofline", "%"),
        ("decode_step_seconds", "step", "s"),
        ("requests_running_mean", "running", ""),
    ),
}


def _shown(value: object, unit: str) -> str:
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if unit == "%":
        return f"{value:.0%}"
    if unit == "s":
        return f"{value:.3g} s"
    if abs(value) >= 1000:
        return f"{value:,.0f}{unit}"
    return f"{value:.3g}{unit}"


def deciding_text(cause: Cause, d: Diagnosis) -> str:
    """The 3-5 numbers that decided ``cause``, as ``label value`` pairs, one line."""
    parts = [
        f"{label} {_shown(d.evidence[key], unit)}"
        for key, label, unit in DECIDING.get(cause, ())
        if d.evidence.get(key) is not None
    ]
    return ", ".join(parts[:5])


def contributing_text(d: Diagnosis) -> str:
    """The contributing causes, one line each: cause, share of the evidence, what shows it."""
    return _items(f"{c.cause} ({c.share:.0%}): {c.evidence}" for c in d.contributing)


#: The labels the daemon sets itself, and those the alert-label contract keeps for labels
#: it adds (``runtime``: the serving engine; ``shard``: a fleet replica's share): a
#: server's identity labels may not use them (docs/operations.md, the contract).
RESERVED_LABELS = frozenset(
    {"alertname", "severity", "target", "model_name", "diagnosis", "runtime", "shard"}
)


def alert_labels(
    target: str,
    model_name: str,
    cause: Cause,
    severity: str,
    server: Mapping[str, str] | None = None,
    *,
    runtime: str = "vllm",
) -> dict[str, str]:
    """An alert's identity: the daemon's own labels and the server's identity labels
    (``server``; an empty value is left out, as Alertmanager treats it as absent). A
    peer's values on one line, their control characters as escapes (``one_line``).
    ``runtime`` names the serving engine (``vllm``, ``sglang``): not ``engine``, which in
    vLLM's metrics is a data-parallel rank, nor ``engine_type``, SGLang's disaggregation
    role."""
    labels = {k: one_line(v) for k, v in (server or {}).items() if v and k not in RESERVED_LABELS}
    labels.update(
        {
            "alertname": ALERTNAMES[cause],
            "severity": severity,
            "target": one_line(target),
            "model_name": one_line(model_name),
            "diagnosis": cause,
            "runtime": runtime,
        }
    )
    return labels


def episode(labels: Mapping[str, str]) -> tuple[str, str, str]:
    """What names one incident episode whatever else its labels carry: the target, the
    model and the cause it opened with (an alert restored from before an upgrade that
    added identity labels is still the same episode)."""
    return (labels.get("target", ""), labels.get("model_name", ""), labels.get("diagnosis", ""))


#: Each annotation is cut to this many characters (the longest a bundled scenario writes,
#: its evidence, is about 2,000): a peer's long names must not make an alert that
#: receivers truncate or refuse.
ANNOTATION_MAX_CHARS = 4096


def _note(text: str) -> str:
    return one_line(text, ANNOTATION_MAX_CHARS)


def _items(items: Iterable[str]) -> str:
    """A list annotation: one item per line, each item on one line of its own."""
    text = "\n".join(f"- {one_line(item)}" for item in items)
    return text if len(text) <= ANNOTATION_MAX_CHARS else text[: ANNOTATION_MAX_CHARS - 1] + "…"


def generator_url(external_url: str, target: str) -> str:
    return f"{external_url.rstrip('/')}/api/v1/diagnoses?target={quote(target, safe='')}"


def status_page_url(external_url: str, target: str) -> str:
    """The daemon's status page, opened at ``target``'s charts and incidents."""
    return f"{external_url.rstrip('/')}/?target={quote(target, safe='')}"


def firing_alert(
    t: Transition,
    *,
    target: str,
    severity: str,
    external_url: str,
    server_labels: Mapping[str, str] | None = None,
) -> Alert:
    """The alert a ``firing`` transition opens, annotated with its diagnosis."""
    d = t.diagnosis
    model = one_line(t.model_name or "(no model_name)")
    first = d.summary.splitlines()[0] if d.summary.strip() else ""
    summary = f"{t.cause} on {one_line(target)} ({model}): {first}" if first else t.cause
    annotations = {
        "summary": _note(summary),
        "description": _note(d.summary),
        "evidence": _note(evidence_text(d)),
        "remediation": _items(d.remediation),
        "confidence": f"{d.confidence:.2f}",
        "breaches": _note(", ".join(d.breaches)),
        "cause": t.cause,
        "deciding": _note(deciding_text(t.cause, d)),
        "status_page": status_page_url(external_url, target),
    }
    predicted = [e for e in d.remediation_effects if e.predicted is not None]
    if predicted:
        # One line per fix that has a predicted effect, in the fixes' order; a fix the
        # window cannot predict (a check, a procedure) says why in the API and report.
        annotations["predicted_effects"] = _items(effect_text(e) for e in predicted)
    if d.remediation:
        # What to try first: the first fix with a predicted effect (an action, with its
        # numbers), else the first fix.
        annotations["first_fix"] = _note(predicted[0].fix if predicted else d.remediation[0])
    if d.secondary:
        annotations["secondary"] = _note(", ".join(d.secondary))
    if d.contributing:
        annotations["contributing"] = contributing_text(d)
    if t.previous_cause is not None:
        annotations["cause_changed_from"] = t.previous_cause
        annotations["cause_change"] = _note(t.change)
    return Alert(
        status="firing",
        labels=alert_labels(
            target, t.model_name, t.identity_cause, severity, server_labels, runtime=d.runtime
        ),
        annotations=annotations,
        starts_at=t.started_at,
        ends_at=None,
        generator_url=generator_url(external_url, target),
    )


def _sorted(labels: Mapping[str, str]) -> dict[str, str]:
    return dict(sorted(labels.items()))


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = maps[0]
    return _sorted({k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])})


#: Alertmanager's default route groups by ``alertname``; we group by identity, so that a
#: receiver that keys on ``groupKey`` sees one group per incident (target, model, and the
#: cause it opened with).
GROUP_BY = ("alertname", "target", "model_name")


def webhook_payload(receiver: str, alerts: Sequence[Alert], external_url: str) -> dict[str, Any]:
    """Alertmanager's webhook body, version 4, for one group of ``alerts``."""
    if not alerts:
        raise ValueError("a notification needs at least one alert")
    group = _sorted({k: alerts[0].labels[k] for k in GROUP_BY if k in alerts[0].labels})
    status = "firing" if any(a.status == "firing" for a in alerts) else "resolved"
    return {
        "receiver": receiver,
        "status": status,
        "alerts": [a.as_webhook() for a in alerts],
        "groupLabels": group,
        "commonLabels": _common([a.labels for a in alerts]),
        "commonAnnotations": _common([a.annotations for a in alerts]),
        "externalURL": external_url,
        "version": "4",
        "groupKey": "{}:" + label_set_string(group),
        "truncatedAlerts": 0,
    }


def postable_alerts(
    alerts: Sequence[Alert], *, now: float, valid_for: float
) -> list[dict[str, Any]]:
    """``POST /api/v2/alerts`` body. A firing alert is valid until ``now + valid_for``
    (as Prometheus does: if we stop re-sending, Alertmanager resolves it then)."""
    return [
        {
            "labels": dict(a.labels),
            "annotations": dict(a.annotations),
            "startsAt": go_time(a.starts_at),
            "endsAt": go_time(now + valid_for if a.ends_at is None else a.ends_at),
            "generatorURL": a.generator_url,
        }
        for a in alerts
    ]


#: A Slack message stays short enough to read on a phone at a glance: the headline, the
#: summary, the numbers that decided it, the first fix and the link, and no more; the
#: rest is a click away (the status page, the API, the webhook's structured annotations).
SLACK_MAX_CHARS = 600
_SLACK_PART_CHARS = 200


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


#: The shortest the summary line is clipped to when a message runs long.
_SLACK_MIN_DESCRIPTION = 80


def slack_payload(alert: Alert) -> dict[str, Any]:
    """A message for a Slack-compatible incoming webhook (Slack, Mattermost, Rocket.Chat):
    one a person on call reads whole, under ``SLACK_MAX_CHARS``."""
    labels, notes = alert.labels, alert.annotations
    # Every word from the alert is escaped (``core.shown.slack``): a model or engine name
    # is shown, never obeyed; only the markup written here is Slack's to read.
    target = slack_code(labels.get("target", "?"))
    where = f"{target} / {slack_code(labels.get('model_name') or '(no model_name)')}"
    link = notes.get("status_page", "")
    cause = slack(notes.get("cause", labels["diagnosis"]))
    if alert.status == "resolved":
        lasted = (alert.ends_at or alert.starts_at) - alert.starts_at
        text = f":white_check_mark: *RESOLVED* {cause} on {where} after {lasted:.0f} s"
        return {"text": text + (f"\n<{link}|status page>" if link else "")}
    confidence = slack(notes.get("confidence", "?"))
    lines = [f":rotating_light: *FIRING* {cause} on {where} (confidence {confidence})"]
    if notes.get("cause_changed_from"):
        lines.append(f"(cause changed from {slack(notes['cause_changed_from'])})")
    described = len(lines)
    lines.append(slack(_clip(notes.get("description", ""), _SLACK_PART_CHARS)))
    if notes.get("deciding"):
        lines.append("*Why:* " + slack(_clip(notes["deciding"], _SLACK_PART_CHARS)))
    fixes = [f.removeprefix("- ") for f in notes.get("remediation", "").splitlines() if f]
    first = notes.get("first_fix") or (fixes[0] if fixes else "")
    if first:
        lines.append("*Fix:* " + slack(_clip(first, _SLACK_PART_CHARS)))
        # The first predicted effect is ``first_fix``'s when it has one. (An alert from
        # before ``first_fix`` listed every fix, those with no prediction too.)
        effect = notes.get("predicted_effects", "").splitlines()[:1]
        if effect and "no prediction" not in effect[0]:
            lines.append("*Predicted:* " + slack(_clip(effect[0].removeprefix("- "), 120)))
    if link:
        lines.append(f"<{link}|status page>")
    text = "\n".join(line for line in lines if line)
    over = len(text) - SLACK_MAX_CHARS
    if over > 0 and len(lines[described]) - over > _SLACK_MIN_DESCRIPTION:
        # The summary gives way first: the numbers that decided it, the fix and its
        # predicted effect are what a person acts on.
        lines[described] = _clip(lines[described], len(lines[described]) - over)
        text = "\n".join(line for line in lines if line)
    if len(text) > SLACK_MAX_CHARS:
        # A long target or model name: the link must survive, so the middle gives way.
        keep = SLACK_MAX_CHARS - len(lines[-1]) - 2 if link else SLACK_MAX_CHARS - 1
        head = "\n".join(line for line in lines[:-1] if line) if link else text
        text = head[:keep].rstrip() + "…" + (f"\n{lines[-1]}" if link else "")
    return {"text": text}
