"""Tests for daemon/vllm_triage/notify/notifier.py: which notifications each receiver gets, and
when.

No worker runs and nothing is sent: each receiver's ``Delivery`` queue is read as it
stands after ``notify`` and ``tick``. Time is the ``now`` the test passes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from vllm_triage.assemble import build_notifier, unnamed_receiver
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.core.alerts import GO_ZERO_TIME, fingerprint, go_time
from vllm_triage.core.model import Cause, Diagnosis, Reason, Transition
from vllm_triage.notify.delivery import Delivery
from vllm_triage.notify.receivers import VALID_FOR_RESENDS
from vllm_triage.store import StateStore

from support.diagnosis import firing

EXTERNAL = "http://triage.example:9468"
TARGET = "gpu-0"
MODEL = "llama-8b"
T0 = 1_800_000_000.0


@pytest.fixture
def client() -> Iterator[httpx.AsyncClient]:
    c = httpx.AsyncClient(trust_env=False)
    yield c
    asyncio.run(c.aclose())


def settings(*receivers: dict[str, Any], severity: str = "page") -> Settings:
    return load_settings(flags={"receivers": list(receivers), "alerting": {"severity": severity}})


def webhook(**kw: Any) -> dict[str, Any]:
    return {"type": "alertmanager_webhook", "url": "http://127.0.0.1:9/hook", **kw}


def broken(cause: Cause, at: float, model: str = MODEL) -> Diagnosis:
    return firing(cause, at, model).diagnosis


def fire(cause: Cause = "kv_pressure", at: float = T0, model: str = MODEL) -> Transition:
    return firing(cause, at, model)


def resolve(
    cause: Cause = "kv_pressure", at: float = T0 + 300, started: float = T0, model: str = MODEL
) -> Transition:
    """As ``IncidentTracker`` makes it: the diagnosis is the clear one that resolved it."""
    clear = Diagnosis(model_name=model, at=at, breaches=(), cause=None)
    return Transition("resolved", Reason.RESOLVED, model, cause, at, started, clear)


def queued(d: Delivery) -> list[Any]:
    return [json.loads(n.body) for n in d._queue]


def paths(d: Delivery) -> list[str]:
    return [n.path for n in d._queue]


class TestWebhook:
    def test_firing_then_resolved_in_order(self, client: httpx.AsyncClient) -> None:
        n = build_notifier(settings(webhook(name="pager")), client, EXTERNAL)
        n.notify(TARGET, [fire()], now=T0)
        n.notify(TARGET, [resolve()], now=T0 + 300)
        (d,) = n.deliveries
        first, second = queued(d)
        assert [first["status"], second["status"]] == ["firing", "resolved"]
        assert first["receiver"] == second["receiver"] == "pager"
        assert first["version"] == "4"
        a, b = first["alerts"][0], second["alerts"][0]
        assert a["fingerprint"] == b["fingerprint"] == fingerprint(a["labels"])
        assert a["endsAt"] == GO_ZERO_TIME
        assert b["startsAt"] == a["startsAt"] == go_time(T0)
        assert b["endsAt"] == go_time(T0 + 300)
        assert a["labels"]["severity"] == "page"
        assert [x.what for x in d._queue] == [
            f"firing kv_pressure {TARGET}/{MODEL}",
            f"resolved kv_pressure {TARGET}/{MODEL}",
        ]
        assert paths(d) == ["", ""]
        assert n.active == {}

    def test_resolved_keeps_the_firing_annotations(self, client: httpx.AsyncClient) -> None:
        """The resolving diagnosis is empty; the resolved alert still says what it was."""
        n = build_notifier(settings(webhook()), client, EXTERNAL)
        n.notify(TARGET, [fire()], now=T0)
        n.notify(TARGET, [resolve()], now=T0 + 300)
        first, second = queued(n.deliveries[0])
        notes = second["alerts"][0]["annotations"]
        assert notes == first["alerts"][0]["annotations"]
        assert notes["summary"].startswith("kv_pressure on gpu-0")
        assert notes["remediation"] == "- fix kv_pressure"

    def test_cause_changed_resolves_then_fires(self, client: httpx.AsyncClient) -> None:
        n = build_notifier(settings(webhook()), client, EXTERNAL)
        n.notify(TARGET, [fire("queue_bound")], now=T0)
        later = T0 + 60
        changed = [
            Transition(
                "resolved",
                Reason.CAUSE_CHANGED,
                MODEL,
                "queue_bound",
                later,
                T0,
                broken("kv_pressure", later),
            ),
            Transition(
                "firing",
                Reason.CAUSE_CHANGED,
                MODEL,
                "kv_pressure",
                later,
                later,
                broken("kv_pressure", later),
            ),
        ]
        n.notify(TARGET, changed, now=later)
        bodies = queued(n.deliveries[0])
        assert [(b["status"], b["alerts"][0]["labels"]["diagnosis"]) for b in bodies] == [
            ("firing", "queue_bound"),
            ("resolved", "queue_bound"),
            ("firing", "kv_pressure"),
        ]
        assert bodies[1]["alerts"][0]["annotations"]["summary"].startswith("queue_bound")
        assert [a.labels["diagnosis"] for a in n.active.values()] == ["kv_pressure"]

    def test_a_change_of_cause_is_the_same_alert_told_again_at_once(
        self, client: httpx.AsyncClient
    ) -> None:
        """Inside one episode (core.incidents) a change of cause keeps the alert's labels,
        fingerprint and start; the receiver hears it now (not at the next repeat) with the
        cause now, what it changed from and why; the resolve names the cause at the end."""
        n = build_notifier(settings(webhook()), client, EXTERNAL)
        n.notify(TARGET, [fire("prefill_bound")], now=T0)
        later = T0 + 120
        change = Transition(
            "firing",
            Reason.CAUSE_CHANGED,
            MODEL,
            "decode_bound",
            later,
            T0,
            broken("decode_bound", later),
            opened_as="prefill_bound",
            previous_cause="prefill_bound",
            change="decode_bound led for 24 evaluations in a row",
            continues=True,
        )
        n.notify(TARGET, [change], now=later)
        n.notify(TARGET, [fire("prefill_bound")], now=later + 1)  # nothing new: no send
        done = dataclasses.replace(
            resolve("decode_bound", at=later + 300), opened_as="prefill_bound"
        )
        n.notify(TARGET, [done], now=later + 300)
        bodies = queued(n.deliveries[0])
        assert [b["status"] for b in bodies] == ["firing", "firing", "firing", "resolved"]
        first, changed, back, resolved = (b["alerts"][0] for b in bodies)
        assert first["fingerprint"] == changed["fingerprint"] == resolved["fingerprint"]
        assert changed["labels"]["diagnosis"] == "prefill_bound"  # the identity stays
        assert changed["startsAt"] == first["startsAt"] == go_time(T0)
        notes = changed["annotations"]
        assert notes["cause"] == "decode_bound"
        assert notes["cause_changed_from"] == "prefill_bound"
        assert notes["cause_change"].startswith("decode_bound led for 24")
        assert notes["summary"].startswith("decode_bound on gpu-0")
        assert back["annotations"]["cause"] == "prefill_bound"  # told: it changed back
        assert resolved["annotations"]["cause"] == "prefill_bound"
        assert n.active == {}

    def test_send_resolved_false_skips_resolved(self, client: httpx.AsyncClient) -> None:
        n = build_notifier(
            settings(webhook(name="quiet", send_resolved=False), webhook(name="all")),
            client,
            EXTERNAL,
        )
        n.notify(TARGET, [fire()], now=T0)
        n.notify(TARGET, [resolve()], now=T0 + 300)
        quiet, everything = n.deliveries
        assert [b["status"] for b in queued(quiet)] == ["firing"]
        assert [b["status"] for b in queued(everything)] == ["firing", "resolved"]

    def test_every_receiver_gets_its_own_queue(self, client: httpx.AsyncClient) -> None:
        a, c = webhook(url="http://127.0.0.1:9/a"), webhook(url="http://127.0.0.1:9/c")
        n = build_notifier(settings(a, webhook(name="b"), c), client, EXTERNAL)
        first, named, third = (d.name for d in n.deliveries)
        assert named == "b"
        # Unnamed: known by type and URL, whatever their position.
        assert first == unnamed_receiver("alertmanager_webhook", a["url"]) != third
        reordered = build_notifier(settings(c, a), client, EXTERNAL)
        assert [d.name for d in reordered.deliveries] == [third, first]
        n.notify(TARGET, [fire()], now=T0)
        assert [queued(d)[0]["receiver"] for d in n.deliveries] == [d.name for d in n.deliveries]

    def test_repeat_interval(self, client: httpx.AsyncClient) -> None:
        """A long incident is notified again on tick only once repeat_interval has passed."""
        n = build_notifier(settings(webhook(repeat_interval_seconds=600)), client, EXTERNAL)
        (d,) = n.deliveries
        n.notify(TARGET, [fire()], now=T0)
        n.tick(T0 + 1)
        n.tick(T0 + 599.9)
        assert len(d._queue) == 1
        n.tick(T0 + 600)
        assert len(d._queue) == 2
        n.tick(T0 + 700)
        assert len(d._queue) == 2
        n.tick(T0 + 1200)
        assert len(d._queue) == 3
        bodies = queued(d)
        assert [b["status"] for b in bodies] == ["firing"] * 3
        assert len({b["alerts"][0]["fingerprint"] for b in bodies}) == 1
        assert bodies[2]["alerts"][0]["startsAt"] == go_time(T0)

    def test_a_receiver_added_while_an_incident_fires_hears_of_it(
        self, client: httpx.AsyncClient, tmp_path: Path
    ) -> None:
        """Restarted with one more receiver while an incident fires: the new one is told at
        the next tick (it was never told), the old one is not told twice."""
        old, new = webhook(url="http://127.0.0.1:9/old"), webhook(url="http://127.0.0.1:9/new")
        store = StateStore.open(tmp_path)
        assert store is not None
        first = build_notifier(settings(old), client, EXTERNAL, store)
        first.notify(TARGET, [fire()], now=T0)
        store.close()
        store = StateStore.open(tmp_path)
        assert store is not None
        second = build_notifier(settings(new, old), client, EXTERNAL, store)
        second.tick(T0 + 5)
        second.tick(T0 + 10)
        told, kept = second.deliveries
        assert [b["status"] for b in queued(told)] == ["firing"]
        assert [b["status"] for b in queued(kept)] == ["firing"]  # its pending one, once
        store.close()

    def test_an_outbox_restored_over_queue_size_is_one_log_line(
        self, client: httpx.AsyncClient, tmp_path: Path
    ) -> None:
        """Before: restoring an outbox over ``queue_size`` wrote one error line per dropped
        row (99,000 lines at start). Now the oldest are dropped as a full queue drops them,
        counted, and said in one line with the first and last dropped."""
        store = StateStore.open(tmp_path)
        assert store is not None
        first = build_notifier(settings(webhook()), client, EXTERNAL, store)
        with first.batch():
            for i in range(500):
                first.notify(TARGET, [fire(model=f"m{i}")], now=T0 + i)
        store.close()
        store = StateStore.open(tmp_path)
        assert store is not None
        with capture_logs() as logs:
            (d,) = build_notifier(
                settings(webhook(queue_size=10)), client, EXTERNAL, store
            ).deliveries
        dropped = [e for e in logs if "dropped" in e["event"]]
        assert len(dropped) == 1 and d.stats.dropped == 490, dropped
        assert queued(d)[0]["alerts"][0]["labels"]["model_name"] == "m490"
        store.close()

    def test_no_repeat_after_resolve(self, client: httpx.AsyncClient) -> None:
        n = build_notifier(settings(webhook(repeat_interval_seconds=600)), client, EXTERNAL)
        (d,) = n.deliveries
        n.notify(TARGET, [fire()], now=T0)
        n.notify(TARGET, [resolve(at=T0 + 100)], now=T0 + 100)
        n.tick(T0 + 10_000)
        assert [b["status"] for b in queued(d)] == ["firing", "resolved"]

    def test_repeats_are_per_alert(self, client: httpx.AsyncClient) -> None:
        """Two incidents opened at different times repeat on their own schedules."""
        n = build_notifier(settings(webhook(repeat_interval_seconds=600)), client, EXTERNAL)
        (d,) = n.deliveries
        n.notify(TARGET, [fire("kv_pressure", model="a")], now=T0)
        n.notify(TARGET, [fire("decode_bound", T0 + 300, model="b")], now=T0 + 300)
        n.tick(T0 + 600)
        models = [b["alerts"][0]["labels"]["model_name"] for b in queued(d)]
        assert models == ["a", "b", "a"]
        n.tick(T0 + 900)
        models = [b["alerts"][0]["labels"]["model_name"] for b in queued(d)]
        assert models == ["a", "b", "a", "b"]


class TestAlertmanager:
    def alertmanager(self, **kw: Any) -> dict[str, Any]:
        return {"type": "alertmanager", "url": "http://127.0.0.1:9093", "resend_seconds": 60, **kw}

    def test_posts_postable_alerts(self, client: httpx.AsyncClient) -> None:
        n = build_notifier(settings(self.alertmanager()), client, EXTERNAL)
        (d,) = n.deliveries
        n.notify(TARGET, [fire()], now=T0 + 5)
        assert paths(d) == ["/api/v2/alerts"]
        (body,) = queued(d)
        assert isinstance(body, list) and len(body) == 1
        assert list(body[0]) == ["labels", "annotations", "startsAt", "endsAt", "generatorURL"]
        assert body[0]["startsAt"] == go_time(T0)
        assert body[0]["endsAt"] == go_time(T0 + 5 + VALID_FOR_RESENDS * 60)
        assert body[0]["labels"]["alertname"] == "VllmKvPressure"

    def test_resends_all_active_alerts(self, client: httpx.AsyncClient) -> None:
        """Every resend_seconds, every active alert again; after resolve, no more."""
        n = build_notifier(settings(self.alertmanager()), client, EXTERNAL)
        (d,) = n.deliveries
        n.notify(TARGET, [fire("kv_pressure", model="a")], now=T0)
        n.notify(TARGET, [fire("decode_bound", model="b")], now=T0 + 10)
        assert len(d._queue) == 2
        n.tick(T0 + 69)  # 59 s after the last push
        assert len(d._queue) == 2
        n.tick(T0 + 70)
        assert len(d._queue) == 3
        resend = queued(d)[2]
        assert sorted(a["labels"]["model_name"] for a in resend) == ["a", "b"]
        assert all(a["endsAt"] == go_time(T0 + 70 + VALID_FOR_RESENDS * 60) for a in resend)

        n.notify(TARGET, [resolve("kv_pressure", T0 + 100, model="a")], now=T0 + 100)
        (gone,) = queued(d)[3]
        assert gone["labels"]["model_name"] == "a"
        assert gone["endsAt"] == go_time(T0 + 100)
        n.tick(T0 + 160)
        (left,) = queued(d)[4]
        assert left["labels"]["model_name"] == "b"

        n.notify(TARGET, [resolve("decode_bound", T0 + 200, model="b")], now=T0 + 200)
        count = len(d._queue)
        for later in (T0 + 260, T0 + 400, T0 + 10_000):
            n.tick(later)
        assert len(d._queue) == count == 6
        assert set(paths(d)) == {"/api/v2/alerts"}

    def test_no_resend_while_nothing_fires(self, client: httpx.AsyncClient) -> None:
        n = build_notifier(settings(self.alertmanager()), client, EXTERNAL)
        n.tick(T0)
        n.tick(T0 + 3600)
        assert len(n.deliveries[0]._queue) == 0


class TestSlack:
    def test_body_is_text_only(self, client: httpx.AsyncClient) -> None:
        slack = {"type": "slack", "url": "https://hooks.slack.example/services/T/B/x"}
        n = build_notifier(settings(slack), client, EXTERNAL)
        n.notify(TARGET, [fire()], now=T0)
        n.notify(TARGET, [resolve()], now=T0 + 300)
        (d,) = n.deliveries
        first, second = queued(d)
        assert list(first) == ["text"] and list(second) == ["text"]
        assert "FIRING" in first["text"] and "kv_pressure" in first["text"]
        assert "RESOLVED" in second["text"] and "after 300 s" in second["text"]
        assert paths(d) == ["", ""]


POD = {"namespace": "llm", "pod": "vllm-llama3-deployment-vllm-7d9c-abcde"}


class TestServerIdentity:
    """The alert-label contract: the server's identity labels on every alert, and an
    incident open across the upgrade that added them keeps the labels it fired with."""

    def test_every_alert_carries_the_servers_identity(self, client: httpx.AsyncClient) -> None:
        n = build_notifier(settings(webhook()), client, EXTERNAL)
        n.notify(TARGET, [fire()], now=T0, server_labels=POD)
        n.notify(TARGET, [resolve()], now=T0 + 300, server_labels=POD)
        bodies = queued(n.deliveries[0])
        for body in bodies:
            labels = body["alerts"][0]["labels"]
            assert {k: labels[k] for k in POD} == POD
            assert labels["target"] == TARGET and labels["diagnosis"] == "kv_pressure"
        assert bodies[0]["alerts"][0]["fingerprint"] == bodies[1]["alerts"][0]["fingerprint"]

    def test_an_empty_value_is_no_label(self, client: httpx.AsyncClient) -> None:
        """Alertmanager treats an empty label as absent; the alert does not carry it."""
        n = build_notifier(settings(webhook()), client, EXTERNAL)
        n.notify(TARGET, [fire()], now=T0, server_labels={"namespace": "llm", "pod": ""})
        labels = queued(n.deliveries[0])[0]["alerts"][0]["labels"]
        assert labels["namespace"] == "llm" and "pod" not in labels

    def test_an_open_incident_keeps_its_fingerprint_across_the_upgrade(
        self, client: httpx.AsyncClient, tmp_path: Path
    ) -> None:
        """Fired by a daemon without identity labels, then restarted with them: the cause
        change and the resolve go out under the fingerprint the receivers know, said once
        in the log; the next incident carries the new labels."""
        store = StateStore.open(tmp_path)
        assert store is not None
        before = build_notifier(settings(webhook()), client, EXTERNAL, store)
        before.notify(TARGET, [fire("queue_bound")], now=T0)
        store.close()
        store = StateStore.open(tmp_path)
        assert store is not None
        after = build_notifier(settings(webhook()), client, EXTERNAL, store)
        change = dataclasses.replace(
            fire("kv_pressure", T0 + 60),
            started_at=T0,
            opened_as="queue_bound",
            previous_cause="queue_bound",
            continues=True,
        )
        with capture_logs() as logs:
            after.notify(TARGET, [change], now=T0 + 60, server_labels=POD)
            after.notify(
                TARGET, [resolve("queue_bound", T0 + 300)], now=T0 + 300, server_labels=POD
            )
            after.notify(TARGET, [fire("queue_bound", T0 + 400)], now=T0 + 400, server_labels=POD)
        [first] = queued(before.deliveries[0])
        old = first["alerts"][0]
        # The first is the restored outbox's, still undelivered: the one ``before`` queued.
        restored, *bodies = [b["alerts"][0] for b in queued(after.deliveries[0])]
        assert restored == old
        assert [b["status"] for b in bodies] == ["firing", "resolved", "firing"]
        assert bodies[0]["fingerprint"] == bodies[1]["fingerprint"] == old["fingerprint"]
        assert "pod" not in bodies[1]["labels"]
        assert bodies[2]["fingerprint"] != old["fingerprint"]
        assert {k: bodies[2]["labels"][k] for k in POD} == POD
        assert [e["event"] for e in logs].count("alert_identity_kept") == 1
        assert list(after.active) == [fingerprint(bodies[2]["labels"])]
        store.close()
