"""Tests for daemon/vllm_triage/core/alerts.py: our payloads have the shape of a real Alertmanager
0.25's.

The two payloads in tests/fixtures/alertmanager/ were captured from a real Alertmanager.
``AlertmanagerV4`` below is a strict description of that shape (keys, key order, value
types, formats); it is first shown to accept both real payloads, then held to ours.
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime
from typing import Any, Literal

import pytest
from pydantic import (
    BaseModel,
    ConfigDict,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from vllm_triage.core.alerts import (
    ALERTNAMES,
    GO_ZERO_TIME,
    SLACK_MAX_CHARS,
    Alert,
    fingerprint,
    firing_alert,
    go_time,
    label_set_string,
    postable_alerts,
    slack_payload,
    webhook_payload,
)
from vllm_triage.core.model import Contribution, Diagnosis, Reason, Transition

from support.paths import ALERTMANAGER

REAL = {
    "firing": ALERTMANAGER / "alertmanager-0.25-webhook-v4-firing.json",
    "resolved": ALERTMANAGER / "alertmanager-0.25-webhook-v4-resolved.json",
}
EXTERNAL = "http://triage.example:9468"
TARGET = "gpu-0"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: 2026-11-29T20:21:09.463Z, the real firing payload's startsAt.
STARTED = datetime(2026, 11, 29, 20, 21, 9, 463000, tzinfo=UTC).timestamp()


def real(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(REAL[name].read_text(encoding="utf-8"))
    return data


# --- Alertmanager's webhook payload, version 4, as a strict validator -------------------

#: Go's time.RFC3339Nano in UTC: whole seconds, or a fraction without trailing zeros.
RFC3339NANO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{0,8}[1-9])?Z$")
GROUP_KEY = re.compile(r'^\{\}:\{([a-z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"(, )?)*\}$')


def _in_declared_order(model: type[BaseModel], data: Any) -> Any:
    if isinstance(data, dict) and list(data) != list(model.model_fields):
        raise ValueError(f"keys {list(data)} are not {list(model.model_fields)}, in that order")
    return data


def _time(value: str) -> str:
    if not RFC3339NANO_UTC.match(value):
        raise ValueError(f"not Go RFC3339Nano UTC: {value!r}")
    return value


class WebhookAlertV4(BaseModel):
    """One alert of the webhook payload; fields spelled and ordered as Alertmanager's."""

    model_config = ConfigDict(extra="forbid", strict=True)
    status: Literal["firing", "resolved"]
    labels: dict[StrictStr, StrictStr]
    annotations: dict[StrictStr, StrictStr]
    startsAt: StrictStr  # noqa: N815 - Alertmanager's JSON name
    endsAt: StrictStr  # noqa: N815 - Alertmanager's JSON name
    generatorURL: StrictStr  # noqa: N815 - Alertmanager's JSON name
    fingerprint: StrictStr

    @model_validator(mode="before")
    @classmethod
    def _order(cls, data: Any) -> Any:
        return _in_declared_order(cls, data)

    @field_validator("startsAt", "endsAt")
    @classmethod
    def _times(cls, value: str) -> str:
        return _time(value)

    @model_validator(mode="after")
    def _consistent(self) -> WebhookAlertV4:
        if self.fingerprint != fingerprint(self.labels):
            raise ValueError("fingerprint is not the labels' fingerprint")
        if (self.status == "firing") != (self.endsAt == GO_ZERO_TIME):
            raise ValueError("endsAt is the zero time exactly while firing")
        if "alertname" not in self.labels:
            raise ValueError("an alert needs an alertname")
        return self


class AlertmanagerV4(BaseModel):
    """The webhook payload, version 4 (Alertmanager's ``webhook.Message``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    receiver: StrictStr
    status: Literal["firing", "resolved"]
    alerts: list[WebhookAlertV4]
    groupLabels: dict[StrictStr, StrictStr]  # noqa: N815 - Alertmanager's JSON name
    commonLabels: dict[StrictStr, StrictStr]  # noqa: N815 - Alertmanager's JSON name
    commonAnnotations: dict[StrictStr, StrictStr]  # noqa: N815 - Alertmanager's JSON name
    externalURL: StrictStr  # noqa: N815 - Alertmanager's JSON name
    version: Literal["4"]
    groupKey: StrictStr  # noqa: N815 - Alertmanager's JSON name
    truncatedAlerts: StrictInt  # noqa: N815 - Alertmanager's JSON name

    @model_validator(mode="before")
    @classmethod
    def _order(cls, data: Any) -> Any:
        return _in_declared_order(cls, data)

    @model_validator(mode="after")
    def _consistent(self) -> AlertmanagerV4:
        if not self.alerts:
            raise ValueError("a notification carries at least one alert")
        if not GROUP_KEY.match(self.groupKey):
            raise ValueError(f"groupKey is not {{}}:<LabelSet.String()>: {self.groupKey!r}")
        if self.groupKey != "{}:" + label_set_string(self.groupLabels):
            raise ValueError("groupKey is not the group labels' LabelSet.String()")
        firing = any(a.status == "firing" for a in self.alerts)
        if self.status != ("firing" if firing else "resolved"):
            raise ValueError("status is firing exactly when an alert fires")
        for a in self.alerts:
            for key, value in self.commonLabels.items():
                if a.labels.get(key) != value:
                    raise ValueError(f"commonLabels.{key} is not common")
        return self


#: Go maps (``template.KV``): their keys are data, not part of the shape.
MAPS = frozenset({"labels", "annotations", "groupLabels", "commonLabels", "commonAnnotations"})


def skeleton(obj: Any, key: str = "") -> Any:
    """Keys, their order and the value types, recursively; values themselves left out.
    A label or annotation map is reduced to the types of its keys and values."""
    if isinstance(obj, dict) and key in MAPS:
        return ("map", sorted({(type(k).__name__, type(v).__name__) for k, v in obj.items()}))
    if isinstance(obj, dict):
        return [(k, skeleton(v, k)) for k, v in obj.items()]
    if isinstance(obj, list):
        return [skeleton(v) for v in obj[:1]]
    return type(obj).__name__


# --- Building our alerts ----------------------------------------------------------------


def diagnosis(
    at: float,
    summary: str = "KV cache full: 3 requests wait for blocks",
    evidence: dict[str, Any] | None = None,
    remediation: tuple[str, ...] = ("raise --gpu-memory-utilization", "lower --max-num-seqs"),
) -> Diagnosis:
    return Diagnosis(
        model_name=MODEL,
        at=at,
        breaches=("ttft_p99", "waiting"),
        cause="kv_pressure",
        confidence=0.875,
        summary=summary,
        evidence=evidence
        if evidence is not None
        else {
            "kv_usage_mean": 0.9712345,
            "waiting_mean": 3.0,
            "preemptions_per_second": None,
            "kv_pool_tokens": 131072,
            "era": "v1",
        },
        secondary=("queue_bound",),
        remediation=remediation,
    )


def transition(at: float = STARTED, **diag: Any) -> Transition:
    return Transition(
        event="firing",
        reason=Reason.OPENED,
        model_name=MODEL,
        cause="kv_pressure",
        at=at,
        started_at=at,
        diagnosis=diagnosis(at, **diag),
    )


def firing(at: float = STARTED, **diag: Any) -> Alert:
    return firing_alert(
        transition(at, **diag), target=TARGET, severity="critical", external_url=EXTERNAL
    )


class TestRealFixtures:
    @pytest.mark.parametrize("name", sorted(REAL))
    def test_validator_accepts_the_real_payloads(self, name: str) -> None:
        """The shape check accepts what a real Alertmanager 0.25 sent."""
        payload = AlertmanagerV4.model_validate(real(name))
        assert payload.status == name

    @pytest.mark.parametrize(
        ("change", "why"),
        [
            pytest.param(lambda p: p.pop("truncatedAlerts"), "are not", id="missing-key"),
            pytest.param(lambda p: p.update(extra=1), "are not", id="extra-key"),
            pytest.param(lambda p: p.update(receiver=p.pop("receiver")), "are not", id="order"),
            pytest.param(lambda p: p.update(version=4), "version", id="version-int"),
            pytest.param(lambda p: p.update(truncatedAlerts="0"), "truncatedAlerts", id="str"),
            pytest.param(lambda p: p.update(groupKey="alertname"), "groupKey", id="group-key"),
            pytest.param(lambda p: p.update(status="resolved"), "status", id="status"),
            pytest.param(
                lambda p: p["alerts"][0].update(fingerprint="0" * 16), "fingerprint", id="fp"
            ),
            pytest.param(
                lambda p: p["alerts"][0]["labels"].update(job=7), "labels.job", id="label-int"
            ),
            pytest.param(
                lambda p: p["alerts"][0].update(startsAt="2026-11-29T20:21:09.460Z"),
                "RFC3339Nano",
                id="trailing-zero",
            ),
            pytest.param(
                lambda p: p["alerts"][0].update(endsAt="2026-11-29 20:21:09Z"),
                "RFC3339Nano",
                id="not-rfc3339",
            ),
            pytest.param(
                lambda p: p["alerts"][0].update(endsAt="2026-11-29T20:21:09Z"),
                "zero time",
                id="firing-with-end",
            ),
        ],
    )
    def test_validator_refuses_other_shapes(self, change: Any, why: str) -> None:
        """The shape check is strict enough to refuse a payload that is slightly off."""
        payload = real("firing")
        change(payload)
        with pytest.raises(ValidationError, match=why):
            AlertmanagerV4.model_validate(payload)

    @pytest.mark.parametrize("name", sorted(REAL))
    def test_fingerprint_matches_alertmanager(self, name: str) -> None:
        """fingerprint() equals the fingerprint Alertmanager computed for the same labels."""
        alert = real(name)["alerts"][0]
        assert fingerprint(alert["labels"]) == alert["fingerprint"]

    def test_fingerprint_ignores_label_order_but_not_values(self) -> None:
        labels = real("firing")["alerts"][0]["labels"]
        reordered = dict(reversed(list(labels.items())))
        assert fingerprint(reordered) == fingerprint(labels)
        assert fingerprint({**labels, "model_name": "m2"}) != fingerprint(labels)
        assert re.fullmatch(r"[0-9a-f]{16}", fingerprint({}))

    @pytest.mark.parametrize("name", sorted(REAL))
    def test_group_key_is_label_set_string(self, name: str) -> None:
        """label_set_string() writes groupKey exactly as Alertmanager did."""
        payload = real(name)
        assert "{}:" + label_set_string(payload["groupLabels"]) == payload["groupKey"]

    @pytest.mark.parametrize("name", sorted(REAL))
    def test_go_time_writes_the_real_times(self, name: str) -> None:
        """Parsing each real time and writing it with go_time() gives the same text."""
        alert = real(name)["alerts"][0]
        for text in (alert["startsAt"], alert["endsAt"]):
            if text == GO_ZERO_TIME:
                continue
            at = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
            assert go_time(at) == text


class TestGoTime:
    @pytest.mark.parametrize(
        ("at", "text"),
        [
            pytest.param(STARTED, "2026-11-29T20:21:09.463Z", id="millis-trimmed"),
            pytest.param(1795984057.0, "2026-11-29T20:27:37Z", id="whole-seconds"),
            pytest.param(1795984057.5, "2026-11-29T20:27:37.5Z", id="half"),
            pytest.param(1795984057.000001, "2026-11-29T20:27:37.000001Z", id="micro"),
            pytest.param(1795984057.9999999, "2026-11-29T20:27:38Z", id="rounds-up"),
            pytest.param(0.0, "1970-01-01T00:00:00Z", id="epoch"),
        ],
    )
    def test_formats_like_alertmanager(self, at: float, text: str) -> None:
        assert go_time(at) == text
        assert RFC3339NANO_UTC.match(go_time(at))

    def test_firing_ends_at_is_go_zero_time(self) -> None:
        """A firing alert's endsAt is Go's zero time, as in the real firing payload."""
        assert firing().as_webhook()["endsAt"] == GO_ZERO_TIME
        assert real("firing")["alerts"][0]["endsAt"] == GO_ZERO_TIME


class TestWebhookPayload:
    def test_same_shape_as_the_real_firing_payload(self) -> None:
        """Keys, key order and value types equal the real payload's, top level and alert."""
        ours = webhook_payload("pager", [firing()], EXTERNAL)
        assert skeleton(ours) == skeleton(real("firing"))
        assert list(ours["alerts"][0]) == list(real("firing")["alerts"][0])

    def test_same_shape_as_the_real_resolved_payload(self) -> None:
        ours = webhook_payload("pager", [firing().resolved(STARTED + 120)], EXTERNAL)
        assert skeleton(ours) == skeleton(real("resolved"))

    def test_the_validator_accepts_ours(self) -> None:
        """The same check that accepts the real payloads accepts ours, firing and resolved."""
        alert = firing()
        for a in (alert, alert.resolved(STARTED + 120)):
            payload = AlertmanagerV4.model_validate(webhook_payload("pager", [a], EXTERNAL))
            assert payload.status == a.status

    def test_json_round_trip_keeps_the_shape(self) -> None:
        """What goes on the wire (JSON) is still accepted and keeps its order."""
        body = json.dumps(webhook_payload("pager", [firing()], EXTERNAL)).encode()
        AlertmanagerV4.model_validate(json.loads(body))
        assert list(json.loads(body)) == list(real("firing"))

    def test_top_level_values(self) -> None:
        ours = webhook_payload("pager", [firing()], EXTERNAL)
        assert ours["version"] == "4"
        assert ours["receiver"] == "pager"
        assert ours["status"] == "firing"
        assert ours["externalURL"] == EXTERNAL
        assert ours["truncatedAlerts"] == 0
        assert ours["groupLabels"] == {
            "alertname": "VllmKvPressure",
            "target": TARGET,
            "model_name": MODEL,
        }
        assert ours["groupKey"] == (
            '{}:{alertname="VllmKvPressure", model_name="meta-llama/Llama-3.1-8B-Instruct", '
            'target="gpu-0"}'
        )
        assert ours["commonLabels"] == ours["alerts"][0]["labels"]
        assert ours["commonAnnotations"] == ours["alerts"][0]["annotations"]

    def test_group_key_escapes_quotes_like_go(self) -> None:
        """A quote or backslash in a label value is escaped as Go's %q escapes it."""
        assert label_set_string({"b": 'say "hi"', "a": "x\\y"}) == (
            '{a="x\\\\y", b="say \\"hi\\""}'
        )

    def test_labels(self) -> None:
        alert = firing().as_webhook()
        assert alert["labels"] == {
            "alertname": "VllmKvPressure",
            "severity": "critical",
            "target": TARGET,
            "model_name": MODEL,
            "diagnosis": "kv_pressure",
            "runtime": "vllm",
        }
        assert alert["fingerprint"] == fingerprint(alert["labels"])
        assert alert["startsAt"] == "2026-11-29T20:21:09.463Z"
        assert alert["generatorURL"] == f"{EXTERNAL}/api/v1/diagnoses?target=gpu-0"

    @pytest.mark.parametrize("cause", sorted(ALERTNAMES))
    def test_one_alertname_per_cause(self, cause: str) -> None:
        t = dataclasses.replace(transition(), cause=cause)
        alert = firing_alert(t, target=TARGET, severity="warning", external_url=EXTERNAL)
        assert alert.labels["alertname"] == ALERTNAMES[cause]  # type: ignore[index]
        assert alert.labels["diagnosis"] == cause
        assert alert.labels["alertname"].startswith("Vllm")

    def test_annotations(self) -> None:
        """summary is one line; evidence and remediation carry the diagnosis."""
        notes = firing(summary="KV cache full\nsecond line").annotations
        assert notes["summary"] == f"kv_pressure on {TARGET} ({MODEL}): KV cache full"
        assert "\n" not in notes["summary"]
        assert notes["evidence"] == (
            "kv_usage_mean=0.9712, waiting_mean=3, kv_pool_tokens=131072, era=v1"
        )
        assert notes["remediation"] == "- raise --gpu-memory-utilization\n- lower --max-num-seqs"
        assert notes["confidence"] == "0.88"
        assert notes["breaches"] == "ttft_p99, waiting"
        assert notes["secondary"] == "queue_bound"
        assert all(isinstance(v, str) for v in notes.values())

    def test_a_change_of_cause_keeps_the_labels_and_says_why(self) -> None:
        """The labels name the cause the episode opened with (its identity in
        Alertmanager); the annotations carry the cause now, the one it replaced, why, and
        each contributing cause with its share."""
        d = dataclasses.replace(
            transition().diagnosis,
            contributing=(Contribution("prefill_bound", 0.2, "ITL p99 is 3.7x p50"),),
        )
        t = dataclasses.replace(
            transition(),
            cause="decode_bound",
            diagnosis=d,
            opened_as="kv_pressure",
            previous_cause="kv_pressure",
            change="decode_bound led for 24 evaluations in a row",
            continues=True,
        )
        alert = firing_alert(t, target=TARGET, severity="warning", external_url=EXTERNAL)
        assert alert.labels["diagnosis"] == "kv_pressure"
        assert alert.labels["alertname"] == "VllmKvPressure"
        notes = alert.annotations
        assert notes["cause"] == "decode_bound"
        assert notes["summary"].startswith("decode_bound on ")
        assert notes["cause_changed_from"] == "kv_pressure"
        assert notes["cause_change"] == "decode_bound led for 24 evaluations in a row"
        assert notes["contributing"] == "- prefill_bound (20%): ITL p99 is 3.7x p50"
        text = slack_payload(alert)["text"]
        assert "*FIRING* decode_bound" in text and "(cause changed from kv_pressure)" in text

    def test_summary_without_a_diagnosis_summary_is_the_cause(self) -> None:
        assert firing(summary="").annotations["summary"] == "kv_pressure"

    def test_resolved_keeps_firing_annotations(self) -> None:
        """A resolved alert says what it was; its endsAt is the resolve time."""
        alert = firing()
        done = alert.resolved(STARTED + 120.25)
        hook = done.as_webhook()
        assert hook["status"] == "resolved"
        assert hook["annotations"] == dict(alert.annotations)
        assert hook["labels"] == dict(alert.labels)
        assert hook["fingerprint"] == alert.key
        assert hook["startsAt"] == "2026-11-29T20:21:09.463Z"
        assert hook["endsAt"] == "2026-11-29T20:23:09.713Z"
        assert webhook_payload("pager", [done], EXTERNAL)["status"] == "resolved"

    def test_needs_an_alert(self) -> None:
        with pytest.raises(ValueError, match="at least one alert"):
            webhook_payload("pager", [], EXTERNAL)

    def test_common_labels_of_two_alerts(self) -> None:
        """commonLabels holds only the labels both alerts share; status firing if any fires."""
        a = firing()
        other = firing_alert(
            transition(),
            target="gpu-1",
            severity="critical",
            external_url=EXTERNAL,
        )
        payload = webhook_payload("pager", [a.resolved(STARTED + 1), other], EXTERNAL)
        assert "target" not in payload["commonLabels"]
        assert payload["commonLabels"]["alertname"] == "VllmKvPressure"
        assert payload["status"] == "firing"
        AlertmanagerV4.model_validate(payload)


class TestPostableAlerts:
    def test_firing_is_valid_until_now_plus_valid_for(self) -> None:
        now = STARTED + 30
        (body,) = postable_alerts([firing()], now=now, valid_for=240)
        assert list(body) == ["labels", "annotations", "startsAt", "endsAt", "generatorURL"]
        assert body["startsAt"] == go_time(STARTED)
        assert body["endsAt"] == go_time(now + 240)
        assert body["labels"]["alertname"] == "VllmKvPressure"
        assert body["annotations"] == dict(firing().annotations)

    def test_resolved_ends_at_its_resolve_time(self) -> None:
        (body,) = postable_alerts(
            [firing().resolved(STARTED + 60)], now=STARTED + 1000, valid_for=240
        )
        assert body["endsAt"] == go_time(STARTED + 60)

    def test_is_json(self) -> None:
        bodies = postable_alerts([firing(), firing().resolved(STARTED + 5)], now=0, valid_for=1)
        assert json.loads(json.dumps(bodies)) == bodies
        assert len(bodies) == 2
        for b in bodies:
            assert RFC3339NANO_UTC.match(b["startsAt"]) and RFC3339NANO_UTC.match(b["endsAt"])


class TestSlackPayload:
    def test_firing(self) -> None:
        msg = slack_payload(firing())
        assert list(msg) == ["text"]
        text = msg["text"]
        assert "FIRING" in text and "RESOLVED" not in text
        assert "kv_pressure" in text
        assert f"`{TARGET}`" in text and f"`{MODEL}`" in text
        assert "confidence 0.88" in text
        # The first fix; the full evidence stays in the annotations (and the API), not in
        # the message.
        assert "*Fix:* raise --gpu-memory-utilization" in text
        assert "lower --max-num-seqs" not in text and "kv_usage_mean=" not in text
        assert f"<{EXTERNAL}/?target={TARGET}|status page>" in text
        assert len(text) <= SLACK_MAX_CHARS

    def test_a_long_diagnosis_is_still_a_short_message(self) -> None:
        """Whatever the summary, names and fixes, the message stays readable at a glance
        and keeps its link."""
        alert = firing_alert(
            transition(summary="x" * 5000, remediation=("y" * 3000, "z" * 3000)),
            target="t" * 300,
            severity="warning",
            external_url=EXTERNAL,
        )
        text = slack_payload(alert)["text"]
        assert len(text) <= SLACK_MAX_CHARS
        assert text.endswith("|status page>")

    def test_a_long_summary_gives_way_before_the_fix_and_its_effect(self) -> None:
        """Past the limit the summary is clipped first (to no less than a line): the fix
        and its predicted effect, what a person acts on, are kept whole."""
        alert = firing()
        effect = "FP8 weights: decode step 9.89 ms → 6.3 ms, ITL p99 24.8 ms → 15.8 ms"
        alert = dataclasses.replace(
            alert,
            annotations={
                **alert.annotations,
                "description": "the step is slow " * 40,
                "remediation": "- raise --gpu-memory-utilization " + "and more " * 40,
                "predicted_effects": f"- {effect}",
            },
        )
        text = slack_payload(alert)["text"]
        assert len(text) <= SLACK_MAX_CHARS
        assert f"*Predicted:* {effect}\n" in text
        assert "*Fix:* raise --gpu-memory-utilization" in text
        assert "the step is slow the step is slow" in text  # clipped, not dropped

    def test_the_deciding_numbers_are_the_causes_own(self) -> None:
        """kv_pressure is decided by the KV cache's fullness, headroom and preemptions;
        the message shows them, and not the rest of the evidence."""
        evidence = {
            "kv_usage_max": 0.992,
            "kv_headroom_requests": 0.4,
            "preemptions_per_second": 0.25,
            "requests_waiting_mean": 12.0,
            "ttft_p99_seconds": 4.2,
            "itl_p50_seconds": 0.02,
        }
        alert = firing(evidence=evidence)
        notes = alert.annotations
        assert notes["deciding"] == (
            "KV used at peak 99%, room for 0.4 requests, preemptions 0.25/s, waiting 12, "
            "TTFT p99 4.2 s"
        )
        assert notes["status_page"] == f"{EXTERNAL}/?target={TARGET}"
        text = slack_payload(alert)["text"]
        assert "*Why:* KV used at peak 99%" in text and "itl_p50" not in text

    def test_resolved(self) -> None:
        msg = slack_payload(firing().resolved(STARTED + 120))
        assert list(msg) == ["text"]
        assert "RESOLVED" in msg["text"] and "FIRING" not in msg["text"]
        assert "kv_pressure" in msg["text"]
        assert "after 120 s" in msg["text"]
