"""Tests for daemon/vllm_triage/store.py: what is kept, what comes back, and that no damaged,
foreign, unwritable or busy state file can stop the daemon (each is logged and started afresh).

The notifier and the delivery queue are driven here with a real store in a temporary
folder; the kill -9 test of the whole daemon is tests/system/test_crash.py.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from vllm_triage.assemble import build_daemon, build_notifier
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.core.alerts import Alert
from vllm_triage.core.dedup import LastSent
from vllm_triage.core.incidents import State, TrackRecord
from vllm_triage.core.model import Diagnosis, Reason, Transition
from vllm_triage.notify.delivery import Delivery
from vllm_triage.notify.receivers import build_receiver
from vllm_triage.store import (
    FILE_NAME,
    SCHEMA_VERSION,
    Notification,
    StateStore,
    alert_from_json,
    alert_to_json,
    default_state_dir,
)

from support.clirun import HANG_S
from support.receiver import Receiver

EXTERNAL = "http://triage.example:9468"
T0 = 1_800_000_000.0
FIRING = TrackRecord(model_name="m", state=State.FIRING, run=0, cause="kv_pressure", started_at=T0)
PENDING = TrackRecord(model_name="n", state=State.PENDING, run=2, cause=None, started_at=0.0)


@pytest.fixture
def client() -> Iterator[httpx.AsyncClient]:
    c = httpx.AsyncClient(trust_env=False)
    yield c
    asyncio.run(c.aclose())


def opened(path: Path) -> StateStore:
    store = StateStore.open(path)
    assert store is not None
    return store


def fire(at: float = T0) -> Transition:
    d = Diagnosis(
        model_name="m",
        at=at,
        breaches=("waiting",),
        cause="kv_pressure",
        confidence=0.9,
        summary="KV full",
        evidence={"waiting_mean": 4.0},
        remediation=("add blocks",),
    )
    return Transition("firing", Reason.OPENED, "m", "kv_pressure", at, at, d)


def resolve(at: float = T0 + 300) -> Transition:
    clear = Diagnosis(model_name="m", at=at, breaches=(), cause=None)
    return Transition("resolved", Reason.RESOLVED, "m", "kv_pressure", at, T0, clear)


def settings(url: str = "http://127.0.0.1:9/hook", **kw: Any) -> Settings:
    receiver = {"type": "alertmanager_webhook", "url": url, "name": "pager", **kw}
    return load_settings(flags={"receivers": [receiver]})


def bodies(d: Delivery) -> list[dict[str, Any]]:
    return [json.loads(n.body) for n in d._queue]


class TestRoundTrip:
    def test_everything_kept_comes_back(self, tmp_path: Path) -> None:
        store = opened(tmp_path)
        alert = Alert(
            status="firing",
            labels={"alertname": "A", "target": "t", "model_name": "m", "diagnosis": "kv_pressure"},
            annotations={"summary": "s"},
            starts_at=T0,
            ends_at=None,
            generator_url="http://x/api",
        )
        with store.batch():
            store.save_incidents("t", (FIRING, PENDING))
            store.put_alert(alert)
            store.put_log("pager", alert.key, LastSent("firing", T0 + 1))
            first = store.enqueue("pager", Notification(b"one", "first"))
            store.enqueue("pager", Notification(b"two", "second", "/api/v2/alerts"))
            store.enqueue("other", Notification(b"three", "third"))
        store.remove(first)
        store.close()

        again = opened(tmp_path)
        kept = again.restored
        assert kept.incidents == {"t": (FIRING, PENDING)}
        assert kept.alerts == {alert.key: alert}
        assert kept.log == {("pager", alert.key): LastSent("firing", T0 + 1)}
        assert [(n.body, n.path) for _, n in kept.outbox["pager"]] == [(b"two", "/api/v2/alerts")]
        assert [n.what for _, n in kept.outbox["other"]] == ["third"]
        again.close()

    def test_alert_json_round_trip_and_refusal(self) -> None:
        alert = Alert(
            status="firing",
            labels={"alertname": "A", "target": "t", "model_name": "", "diagnosis": "x"},
            annotations={"evidence": "a=1"},
            starts_at=1.5,
            ends_at=None,
            generator_url="u",
        )
        assert alert_from_json(alert_to_json(alert)) == alert
        for bad in ('{"status": "firing"}', "[]", '{"status": "maybe"}'):
            with pytest.raises(ValueError):
                alert_from_json(bad)

    def test_a_batch_is_one_transaction(self, tmp_path: Path) -> None:
        """Nothing of a batch is on disk before it ends: a kill inside it keeps none."""
        store = opened(tmp_path)
        peek = sqlite3.connect(tmp_path / FILE_NAME)
        with store.batch():
            store.save_incidents("t", (FIRING,))
            store.enqueue("pager", Notification(b"x", "x"))
            assert peek.execute("SELECT count(*) FROM incidents").fetchone() == (0,)
            assert peek.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
        assert peek.execute("SELECT count(*) FROM incidents").fetchone() == (1,)
        assert peek.execute("SELECT count(*) FROM outbox").fetchone() == (1,)
        peek.close()
        store.close()


class TestNeverFatal:
    def test_garbage_bytes_are_moved_aside(self, tmp_path: Path) -> None:
        (tmp_path / FILE_NAME).write_bytes(os.urandom(4096))
        with capture_logs() as logs:
            store = opened(tmp_path)
        assert store.restored.empty and store.durable
        events = [e for e in logs if e["event"] == "state_unreadable"]
        assert len(events) == 1 and "not a database" in events[0]["why"]
        assert list(tmp_path.glob(f"{FILE_NAME}.unreadable-*"))
        store.save_incidents("t", (FIRING,))  # the fresh file works
        store.close()
        assert opened(tmp_path).restored.incidents == {"t": (FIRING,)}

    def test_another_schema_version_is_moved_aside(self, tmp_path: Path) -> None:
        conn = sqlite3.connect(tmp_path / FILE_NAME)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.close()
        with capture_logs() as logs:
            store = opened(tmp_path)
        assert store.restored.empty
        assert any("schema version" in e.get("why", "") for e in logs)

    def test_a_version_1_file_is_migrated_and_keeps_its_incidents(self, tmp_path: Path) -> None:
        """A state file written before incidents kept their episode and flap memory (the
        schema of version 1, verbatim) is upgraded in place: its open incident and the
        log survive, the new fields take their neutral values, and it reads as version 2."""
        conn = sqlite3.connect(tmp_path / FILE_NAME)
        conn.executescript(
            """
            CREATE TABLE incidents (
                target TEXT NOT NULL, model TEXT NOT NULL, state TEXT NOT NULL,
                run INTEGER NOT NULL, cause TEXT, started_at REAL NOT NULL, challenger TEXT,
                challenger_run INTEGER NOT NULL, PRIMARY KEY (target, model));
            CREATE TABLE alerts (key TEXT PRIMARY KEY, alert TEXT NOT NULL);
            CREATE TABLE nflog (receiver TEXT NOT NULL, key TEXT NOT NULL,
                status TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (receiver, key));
            CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, receiver TEXT NOT NULL,
                path TEXT NOT NULL, what TEXT NOT NULL, body BLOB NOT NULL,
                queued_at REAL NOT NULL);
            INSERT INTO incidents VALUES ('t', 'm', 'firing', 0, 'kv_pressure', 1800000000.0,
                NULL, 0);
            INSERT INTO nflog VALUES ('pager', 'abc', 'firing', 1800000001.0);
            PRAGMA user_version = 1;
            """
        )
        conn.close()
        with capture_logs() as logs:
            store = opened(tmp_path)
        assert store.restored.incidents == {"t": (FIRING,)}
        assert store.restored.log == {("pager", "abc"): LastSent("firing", T0 + 1)}
        assert [e["schema_version"] for e in logs if e["event"] == "state_migrated"] == [2]
        store.close()
        conn = sqlite3.connect(tmp_path / FILE_NAME)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
        conn.close()

    def test_the_episode_and_flap_memory_survive_a_restart(self, tmp_path: Path) -> None:
        """Every field of a kept incident comes back as it was written: the cause it
        opened with, its changes, the clear evaluations it needs, a clear track's memory."""
        changed = TrackRecord(
            model_name="m",
            state=State.RESOLVING,
            run=2,
            cause="decode_bound",
            started_at=T0,
            challenger="queue_bound",
            challenger_run=5,
            replaced_run=1,
            opened_as="prefill_bound",
            changes=1,
            resolve_needed=15,
        )
        remembered = TrackRecord(
            model_name="n",
            state=State.CLEAR,
            run=0,
            cause=None,
            started_at=0.0,
            resolved_cause="kv_pressure",
            since_resolved=7,
        )
        store = opened(tmp_path)
        store.save_incidents("t", (changed, remembered))
        store.put_log("pager", "abc", LastSent("firing", T0, "decode_bound"))
        store.close()
        again = opened(tmp_path)
        assert again.restored.incidents == {"t": (changed, remembered)}
        assert again.restored.log == {("pager", "abc"): LastSent("firing", T0, "decode_bound")}
        again.close()

    def test_another_programs_tables_are_moved_aside(self, tmp_path: Path) -> None:
        conn = sqlite3.connect(tmp_path / FILE_NAME)
        conn.execute("CREATE TABLE incidents (id INTEGER, note TEXT)")
        conn.execute("INSERT INTO incidents VALUES (1, 'not ours')")
        conn.commit()
        conn.close()
        with capture_logs() as logs:
            store = opened(tmp_path)
        assert store.restored.empty
        assert [e["event"] for e in logs if e["log_level"] == "error"] == ["state_unreadable"]

    def test_damaged_rows_are_skipped_and_the_rest_restored(self, tmp_path: Path) -> None:
        store = opened(tmp_path)
        store.save_incidents("t", (FIRING,))
        store.close()
        conn = sqlite3.connect(tmp_path / FILE_NAME)
        conn.execute(
            "INSERT INTO incidents (target, model, state, run, cause, started_at, challenger, "
            "challenger_run) VALUES ('t', 'x', 'exploded', 0, NULL, 0, NULL, 0)"
        )
        conn.execute("INSERT INTO alerts VALUES ('abc', 'not json')")
        conn.execute("INSERT INTO nflog VALUES ('pager', 'abc', 'maybe', 1.0, '')")
        conn.commit()
        conn.close()
        with capture_logs() as logs:
            store = opened(tmp_path)
        assert store.restored.incidents == {"t": (FIRING,)}
        assert store.restored.alerts == {} and store.restored.log == {}
        skipped = sorted(e["table"] for e in logs if e["event"] == "state_row_skipped")
        assert skipped == ["alerts", "incidents", "nflog"]
        store.close()
        with capture_logs() as logs:
            opened(tmp_path).close()
        assert not [e for e in logs if e["event"] == "state_row_skipped"]  # deleted

    def test_a_folder_that_cannot_be_made_runs_without_state(self, tmp_path: Path) -> None:
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        with capture_logs() as logs:
            assert StateStore.open(blocker / "state") is None
        assert [e["event"] for e in logs] == ["state_unavailable"]

    def test_a_read_only_filesystem_runs_without_state(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """What the kernel answers on a read-only mount (EROFS) for the files it creates.
        (The tests run as root in places, where a chmod would not stop a write.)"""
        real_open = os.open

        def read_only(path: Any, flags: int, *args: Any) -> int:
            if flags & os.O_CREAT and str(path).startswith(str(tmp_path)):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_open(path, flags, *args)

        monkeypatch.setattr(os, "open", read_only)
        with capture_logs() as logs:
            assert StateStore.open(tmp_path / "state") is None
        (event,) = logs
        assert event["event"] == "state_unavailable"
        assert "Read-only file system" in event["why"]

    def test_a_second_daemon_on_the_same_folder_runs_without_state(self, tmp_path: Path) -> None:
        first = opened(tmp_path)
        with capture_logs() as logs:
            assert StateStore.open(tmp_path) is None
        assert "another vllm-triage" in logs[0]["why"]
        first.close()
        opened(tmp_path).close()  # released with the first

    def test_a_write_that_fails_later_turns_durability_off_once(self, tmp_path: Path) -> None:
        """A disk that fills or turns read-only mid-run: one error line, no exception,
        and the daemon goes on in memory."""
        store = opened(tmp_path)
        store._conn.execute("PRAGMA query_only = ON")
        with capture_logs() as logs:
            store.save_incidents("t", (FIRING,))
            assert store.enqueue("pager", Notification(b"x", "x")) is None
            store.remove(1)
        assert not store.durable
        assert [e["event"] for e in logs] == ["state_write_failed"]
        store.close()


class TestNotifierAndDelivery:
    def test_a_restarted_notifier_sends_the_resolve_of_an_alert_told_before(
        self, tmp_path: Path, client: httpx.AsyncClient
    ) -> None:
        store = opened(tmp_path)
        first = build_notifier(settings(), client, EXTERNAL, store)
        first.notify("gpu-0", [fire()], now=T0)
        (told,) = bodies(first.deliveries[0])
        store.close()  # a kill: nothing more happens in this process

        store = opened(tmp_path)
        second = build_notifier(settings(), client, EXTERNAL, store)
        # The firing was never delivered: it is queued again, before anything new.
        assert bodies(second.deliveries[0]) == [told]
        second.notify("gpu-0", [resolve()], now=T0 + 300)
        firing, resolved = bodies(second.deliveries[0])
        assert resolved["status"] == "resolved"
        assert resolved["alerts"][0]["fingerprint"] == firing["alerts"][0]["fingerprint"]
        # The resolve carries the firing's annotations, restored from the store.
        assert resolved["alerts"][0]["annotations"] == firing["alerts"][0]["annotations"]
        assert second.active == {} and second.log == {}
        store.close()
        assert opened(tmp_path).restored.alerts == {}

    def test_repeats_keep_their_schedule_across_a_restart(
        self, tmp_path: Path, client: httpx.AsyncClient
    ) -> None:
        store = opened(tmp_path)
        s = settings(repeat_interval_seconds=600)
        build_notifier(s, client, EXTERNAL, store).notify("gpu-0", [fire()], now=T0)
        store.close()
        store = opened(tmp_path)
        again = build_notifier(s, client, EXTERNAL, store)
        d = again.deliveries[0]
        assert len(bodies(d)) == 1  # the undelivered firing
        again.tick(T0 + 599)
        assert len(bodies(d)) == 1  # not due: told at T0, before the restart
        again.tick(T0 + 600)
        assert len(bodies(d)) == 2
        store.close()

    def test_a_receiver_no_longer_configured_is_forgotten(
        self, tmp_path: Path, client: httpx.AsyncClient
    ) -> None:
        store = opened(tmp_path)
        build_notifier(settings(), client, EXTERNAL, store).notify("gpu-0", [fire()], now=T0)
        store.close()
        store = opened(tmp_path)
        other = load_settings(
            flags={"receivers": [{"type": "slack", "url": "http://127.0.0.1:9/s", "name": "s"}]}
        )
        with capture_logs() as logs:
            n = build_notifier(other, client, EXTERNAL, store)
        assert [e["receiver"] for e in logs if e["event"] == "receiver_gone"] == ["pager"]
        assert n.log == {} and bodies(n.deliveries[0]) == []
        store.close()
        assert opened(tmp_path).restored.outbox == {}

    def test_delivered_notifications_leave_the_store(self, tmp_path: Path) -> None:
        """Removed once delivered; what a shutdown leaves is kept, not counted as failed."""
        store = opened(tmp_path)

        async def scenario(url: str) -> Delivery:
            async with httpx.AsyncClient(trust_env=False) as c:
                d = Delivery(
                    build_receiver("pager", settings(url).receivers[0], EXTERNAL), c, store
                )
                worker = asyncio.create_task(d.run())
                d.submit(Notification(b"{}", "delivered"))
                await asyncio.wait_for(d.wait_idle(), HANG_S)
                worker.cancel()
                d.submit(Notification(b"{}", "left at shutdown"))
                assert d.abandon("undelivered at shutdown") == 0
                return d

        with Receiver() as rx:
            d = asyncio.run(scenario(rx.url))
        assert len(rx.requests) == 1
        assert d.kept == 1 and d.stats.failed == 0
        store.close()
        kept = opened(tmp_path).restored.outbox
        assert [n.what for _, n in kept["pager"]] == ["left at shutdown"]


class TestWhere:
    def test_run_defaults_to_the_xdg_state_folder(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
        assert default_state_dir() == tmp_path / "xdg" / "vllm-triage"
        monkeypatch.delenv("XDG_STATE_HOME")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        assert default_state_dir() == tmp_path / "home" / ".local" / "state" / "vllm-triage"

    @pytest.mark.parametrize(
        ("value", "auto", "expected"),
        [
            ("auto", Path("/x/auto"), Path("/x/auto")),
            ("auto", None, None),  # an in-process daemon (the tests) keeps nothing
            (None, Path("/x/auto"), None),  # state_dir: null keeps nothing anywhere
            ("/var/lib/vllm-triage", None, Path("/var/lib/vllm-triage")),
        ],
        ids=["auto-with-a-folder", "auto-in-process", "null", "a-path"],
    )
    def test_state_dir_setting(
        self, value: str | None, auto: Path | None, expected: Path | None
    ) -> None:
        settings = load_settings(flags={"state_dir": value})
        assert settings.state_path(auto) == expected

    def test_run_keeps_state_where_the_setting_says(
        self, tmp_path: Path, own_state_home: Path
    ) -> None:
        """The daemon as `run` builds it opens its store in $XDG_STATE_HOME/vllm-triage."""
        settings = load_settings(
            flags={
                "listen": "127.0.0.1:0",
                "targets": [{"name": "t", "url": "http://127.0.0.1:9/m"}],
            }
        )
        daemon = build_daemon(settings, default_state_dir=default_state_dir())
        try:
            assert daemon.store is not None
            assert daemon.store.path == own_state_home / "vllm-triage" / FILE_NAME
        finally:
            daemon.store.close()
            daemon.http.stop()
