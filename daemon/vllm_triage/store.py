"""Durable alert state: what a restart needs to tell every receiver exactly what it would
have heard without the restart (Alertmanager keeps its notification log on disk for the
same reason).

One SQLite file (the standard library's ``sqlite3``, WAL journal) under ``state_dir``:

    incidents  target, model -> state, counts, cause, started_at   (IncidentTracker.export)
    alerts     fingerprint -> the firing alert, annotations and all (Notifier.active)
    nflog      receiver, fingerprint -> last status told, and when  (Notifier.log)
    outbox     receiver, in order -> a notification not yet delivered or given up

Every change is written through as it happens; one evaluation's changes (the incident's
new state, the alert, the log entry, the queued notifications) are one transaction, so a
kill at any moment leaves either all of them or none. An outbox row is deleted only once
its notification was delivered, or given up (counted and logged as failed). Delivery is
therefore at least once: a kill between a receiver's 2xx and the delete sends that
notification again after the restart, with the same alert fingerprint.

``synchronous=NORMAL`` in WAL mode: a commit is in the operating system's hands before
the call returns, so a killed process loses nothing; a power cut may lose the last
commits, which is no worse than the in-memory state it replaces (and an ``emptyDir`` does
not outlive its node anyway). ``bench/bench_store.py`` measures a write.

The store never stops the daemon, and tells a bad file from a bad disk:

- a file SQLite calls corrupt or not a database, or one of another schema or program, is
  logged, moved aside and replaced by a fresh one;
- a full, read-only or failing disk (or a file that is busy, or cannot be opened for
  writing) is not the file's fault: the file is kept as it is, what can be read of it is
  restored (read only), and the store runs *degraded*: nothing is written, alerting goes
  on in memory, and every ``RETRY_WRITES_S`` the next write tries the disk again. When it
  works, the whole state is written afresh from memory (``resync``: each part that keeps
  state writes its own), and durable state is back;
- an unwritable directory or a second daemon holding the same directory means running
  without a store at all, said in one log line.

``status()`` says which (``vllm_triage_state_durable`` and the API show it).

No secrets are stored: receivers are named, never their URLs or credentials, and the
HMAC signature is computed at each send.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from vllm_triage.core.alerts import Alert
from vllm_triage.core.dedup import LastSent
from vllm_triage.core.incidents import State, TrackRecord
from vllm_triage.state import StoreStatus

log = structlog.get_logger("vllm_triage.store")

#: Bumped when the tables change. A file of an older version is migrated in place
#: (``_MIGRATIONS``: its open incidents survive an upgrade); any other is moved aside.
SCHEMA_VERSION = 2
FILE_NAME = "state.sqlite3"
LOCK_NAME = "state.lock"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    target TEXT NOT NULL, model TEXT NOT NULL, state TEXT NOT NULL, run INTEGER NOT NULL,
    cause TEXT, started_at REAL NOT NULL, challenger TEXT, challenger_run INTEGER NOT NULL,
    replaced_run INTEGER NOT NULL DEFAULT 0, opened_as TEXT, changes INTEGER NOT NULL DEFAULT 0,
    resolve_needed INTEGER NOT NULL DEFAULT 0, resolved_cause TEXT,
    since_resolved INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (target, model)
);
CREATE TABLE IF NOT EXISTS alerts (key TEXT PRIMARY KEY, alert TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nflog (
    receiver TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL, at REAL NOT NULL,
    cause TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (receiver, key)
);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, receiver TEXT NOT NULL, path TEXT NOT NULL,
    what TEXT NOT NULL, body BLOB NOT NULL, queued_at REAL NOT NULL
);
"""

#: From each older version to the next: incidents gained the cause's hysteresis, the
#: episode's identity and the flap memory (version 2), the log the cause each receiver
#: was told.
_MIGRATIONS = {
    1: """
ALTER TABLE incidents ADD COLUMN replaced_run INTEGER NOT NULL DEFAULT 0;
ALTER TABLE incidents ADD COLUMN opened_as TEXT;
ALTER TABLE incidents ADD COLUMN changes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE incidents ADD COLUMN resolve_needed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE incidents ADD COLUMN resolved_cause TEXT;
ALTER TABLE incidents ADD COLUMN since_resolved INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nflog ADD COLUMN cause TEXT NOT NULL DEFAULT '';
""",
}


@dataclass(frozen=True, slots=True)
class Notification:
    """One POST to make, as a receiver encoded it and the store keeps it until it is
    delivered: ``what`` says it in logs (no secrets, no bodies)."""

    body: bytes
    what: str
    path: str = ""


def default_state_dir() -> Path:
    """Where ``vllm-triage run`` keeps its state unless told: ``$XDG_STATE_HOME/vllm-triage``
    (the XDG base directory for state that should survive a restart but is not worth a
    backup), ``~/.local/state/vllm-triage`` without it."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "vllm-triage"


def alert_to_json(alert: Alert) -> str:
    return json.dumps(
        {
            "status": alert.status,
            "labels": dict(alert.labels),
            "annotations": dict(alert.annotations),
            "starts_at": alert.starts_at,
            "ends_at": alert.ends_at,
            "generator_url": alert.generator_url,
        },
        sort_keys=True,
    )


def _strings(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{what} is not a mapping of strings")
    return dict(value)


def alert_from_json(text: str) -> Alert:
    """An alert written by ``alert_to_json``; ValueError for anything else."""
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    status = doc.get("status")
    starts_at, ends_at = doc.get("starts_at"), doc.get("ends_at")
    if status not in ("firing", "resolved"):
        raise ValueError(f"status {status!r}")
    if not isinstance(starts_at, int | float) or not (
        ends_at is None or isinstance(ends_at, int | float)
    ):
        raise ValueError("times are not numbers")
    url = doc.get("generator_url")
    if not isinstance(url, str):
        raise ValueError("generator_url is not a string")
    labels = _strings(doc.get("labels"), "labels")
    for name in ("alertname", "target", "model_name", "diagnosis"):
        if name not in labels:
            raise ValueError(f"labels lack {name}")
    return Alert(
        status="firing" if status == "firing" else "resolved",
        labels=labels,
        annotations=_strings(doc.get("annotations"), "annotations"),
        starts_at=float(starts_at),
        ends_at=None if ends_at is None else float(ends_at),
        generator_url=url,
    )


#: SQLite's primary result codes for a failure of the disk or the system, not of the file:
#: busy, locked, out of memory, read-only, I/O error, full, cannot open, permission, lock
#: protocol. The file is then kept; anything else it reports means the file is bad.
_DISK_NOT_FILE = frozenset({5, 6, 7, 8, 10, 13, 14, 3, 15})
#: While degraded, a write tries the disk again this often (each try is a few statements).
RETRY_WRITES_S = 30.0


def _file_is_bad(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` says the file is corrupt, not a database, or not ours (our own
    refusals carry no SQLite code), rather than that the disk failed."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is None or (code & 0xFF) not in _DISK_NOT_FILE


class Resyncs(Protocol):
    """A part that keeps state in memory and writes it afresh into an empty store."""

    def resync(self, store: StateStore) -> None: ...


@dataclass(slots=True)
class Restored:
    """What the file held when it was opened, checked row by row."""

    incidents: dict[str, tuple[TrackRecord, ...]] = field(default_factory=dict)
    alerts: dict[str, Alert] = field(default_factory=dict)
    log: dict[tuple[str, str], LastSent] = field(default_factory=dict)
    outbox: dict[str, list[tuple[int, Notification]]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.incidents or self.alerts or self.log or self.outbox)

    def receivers(self) -> set[str]:
        """Every receiver something is kept for (its log or its queue)."""
        return {r for r, _ in self.log} | set(self.outbox)


class StateStore:
    """The open state file. Every method is called on the event loop's thread (the
    constructor may run on another, before the loop starts), one at a time."""

    def __init__(
        self, conn: sqlite3.Connection, path: Path, lock: int, *, read_only: bool = False
    ) -> None:
        self.path = path
        self.restored = Restored()
        #: What keeps state in memory and writes it afresh after the disk came back.
        self.participants: list[Resyncs] = []
        #: Failed writes since the start (each failed retry counts one).
        self.write_failures = 0
        self._conn = conn
        self._lock = lock
        self._depth = 0
        self._read_only = read_only
        self._failed = read_only
        self._failed_at = time.monotonic()
        self._error = ""

    # --- opening -----------------------------------------------------------------------

    @classmethod
    def open(cls, state_dir: Path) -> StateStore | None:
        """The store in ``state_dir``, with what it held loaded; None (logged) when the
        directory cannot hold one. Never raises."""
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            lock = os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            _off(state_dir, f"cannot create or open it: {exc.strerror or exc}")
            return None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            _off(state_dir, "another vllm-triage holds it; give each daemon its own state_dir")
            return None
        path = state_dir / FILE_NAME
        for attempt in (1, 2):
            conn: sqlite3.Connection | None = None
            try:
                conn = _connect(path)
                store = cls(conn, path, lock)
                store._load()
            except sqlite3.DatabaseError as exc:
                if conn is not None:
                    conn.close()
                if not _file_is_bad(exc):
                    # The disk's fault, not the file's: keep it, read what it holds.
                    return cls._degraded(path, lock, exc)
                # Not a database, a damaged one, another program's tables, another
                # schema version: keep it aside and start afresh.
                if attempt == 2 or not _move_aside(path, str(exc)):
                    os.close(lock)
                    _off(state_dir, f"cannot use {FILE_NAME}: {exc}")
                    return None
                continue
            except OSError as exc:
                if conn is not None:
                    conn.close()
                os.close(lock)
                _off(state_dir, f"cannot use {FILE_NAME}: {exc.strerror or exc}")
                return None
            r = store.restored
            log.info(
                "state_restored" if not r.empty else "state_opened",
                path=str(path),
                incidents=sum(len(v) for v in r.incidents.values()),
                active_alerts=len(r.alerts),
                undelivered=sum(len(v) for v in r.outbox.values()),
            )
            return store
        raise AssertionError("unreachable: the second attempt returns")

    @classmethod
    def _degraded(cls, path: Path, lock: int, exc: sqlite3.Error) -> StateStore | None:
        """A store that keeps ``path`` untouched, restored from a read-only look at it,
        writing nothing until the disk takes writes again."""
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
            store = cls(conn, path, lock, read_only=True)
            store._load(write=False)
        except sqlite3.Error as again:
            if conn is not None:
                conn.close()
            # Not even readable now: run empty in memory, the file kept for next time.
            conn = sqlite3.connect(":memory:", check_same_thread=False)
            store = cls(conn, path, lock, read_only=True)
            log.warning("state_not_readable", path=str(path), err=str(again))
        store._error = str(exc)
        r = store.restored
        log.error(
            "state_degraded",
            path=str(path),
            why=str(exc),
            incidents=sum(len(v) for v in r.incidents.values()),
            active_alerts=len(r.alerts),
            undelivered=sum(len(v) for v in r.outbox.values()),
            consequence=f"the file is kept as it is; running in memory; writing is tried "
            f"again every {RETRY_WRITES_S:g} s",
        )
        return store

    def _load(self, *, write: bool = True) -> None:
        c = self._conn
        version = c.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION) and version not in _MIGRATIONS:
            raise sqlite3.DatabaseError(f"schema version {version}, expected {SCHEMA_VERSION}")
        if write:
            self._prepare()
        elif version != SCHEMA_VERSION:
            return  # an older schema cannot be read without migrating it: nothing restored
        r = self.restored
        bad: list[tuple[str, str, tuple[Any, ...]]] = []
        incidents: dict[str, list[TrackRecord]] = {}
        for row in c.execute(
            "SELECT target, model, state, run, cause, started_at, challenger, challenger_run, "
            "replaced_run, opened_as, changes, resolve_needed, resolved_cause, since_resolved "
            "FROM incidents ORDER BY target, model"
        ):
            try:
                record = TrackRecord(
                    model_name=str(row[1]),
                    state=State(row[2]),
                    run=int(row[3]),
                    cause=row[4],
                    started_at=float(row[5]),
                    challenger=row[6],
                    challenger_run=int(row[7]),
                    replaced_run=int(row[8]),
                    opened_as=row[9],
                    changes=int(row[10]),
                    resolve_needed=int(row[11]),
                    resolved_cause=row[12],
                    since_resolved=int(row[13]),
                )
            except (ValueError, TypeError) as exc:
                bad.append(("incidents", str(exc), ("target = ? AND model = ?", row[0], row[1])))
                continue
            incidents.setdefault(str(row[0]), []).append(record)
        r.incidents = {t: tuple(v) for t, v in incidents.items()}
        for key, text in c.execute("SELECT key, alert FROM alerts"):
            try:
                alert = alert_from_json(text)
                if alert.key != key or alert.status != "firing":
                    raise ValueError("not the firing alert of its fingerprint")
            except (ValueError, TypeError) as exc:
                bad.append(("alerts", str(exc), ("key = ?", key)))
                continue
            r.alerts[key] = alert
        for receiver, key, status, at, cause in c.execute(
            "SELECT receiver, key, status, at, cause FROM nflog"
        ):
            if (
                status not in ("firing", "resolved")
                or not isinstance(at, int | float)
                or not isinstance(cause, str)
            ):
                bad.append(
                    ("nflog", "bad status or time", ("receiver = ? AND key = ?", receiver, key))
                )
                continue
            r.log[(receiver, key)] = LastSent(
                "firing" if status == "firing" else "resolved", at, cause
            )
        for row_id, receiver, path, what, body in c.execute(
            "SELECT id, receiver, path, what, body FROM outbox ORDER BY id"
        ):
            if not isinstance(body, bytes) or not isinstance(path, str):
                bad.append(("outbox", "not a notification", ("id = ?", row_id)))
                continue
            r.outbox.setdefault(receiver, []).append((row_id, Notification(body, str(what), path)))
        for table, why, (where, *args) in bad:
            log.warning("state_row_skipped", table=table, why=why)
            if write:
                c.execute(f"DELETE FROM {table} WHERE {where}", args)
        if write:
            c.commit()

    def _prepare(self) -> None:
        """Bring the file to this schema, and write once, so that a read-only file or
        folder shows here, not mid-incident."""
        c = self._conn
        version = c.execute("PRAGMA user_version").fetchone()[0]
        while version in _MIGRATIONS:
            c.executescript(_MIGRATIONS[version])
            version += 1
            log.info("state_migrated", path=str(self.path), schema_version=version)
        c.executescript(_SCHEMA)
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        c.execute("DELETE FROM outbox WHERE id < 0")
        c.commit()

    # --- writing -----------------------------------------------------------------------

    @property
    def durable(self) -> bool:
        """False while writes fail (or the file could only be read): the daemon then goes
        on in memory, and tries the disk again every ``RETRY_WRITES_S``."""
        return not self._failed

    def status(self) -> StoreStatus:
        return StoreStatus(
            path=str(self.path),
            durable=not self._failed,
            error=self._error if self._failed else "",
            write_failures=self.write_failures,
        )

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Everything written inside is one transaction (nested batches join the outer)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._commit()

    def _commit(self) -> None:
        if self._failed and not self._recovered():
            return
        try:
            self._conn.commit()
        except sqlite3.Error as exc:
            self._fail(exc)

    def _write(self, sql: str, args: tuple[Any, ...]) -> int | None:
        if self._failed and not self._recovered():
            return None
        try:
            row = self._conn.execute(sql, args).lastrowid
            if self._depth == 0:
                self._conn.commit()
        except sqlite3.Error as exc:
            self._fail(exc)
            return None
        return row

    def _fail(self, exc: sqlite3.Error) -> None:
        self._failed = True
        self._failed_at = time.monotonic()
        self._error = str(exc)
        self.write_failures += 1
        with contextlib.suppress(sqlite3.Error):
            self._conn.rollback()
        log.error(
            "state_write_failed",
            path=str(self.path),
            err=str(exc),
            consequence="alert state is kept in memory only, and written afresh once the "
            f"disk takes writes again (tried every {RETRY_WRITES_S:g} s)",
        )

    def _recovered(self) -> bool:
        """After ``RETRY_WRITES_S``: whether the disk takes writes again. If it does, the
        whole state is written afresh from memory (every participant's ``resync``) in one
        transaction, and writing goes on."""
        if self._depth > 1 or time.monotonic() - self._failed_at < RETRY_WRITES_S:
            return False  # inside a batch: the batch's end tries
        self._failed_at = time.monotonic()
        try:
            if self._read_only:
                self._conn.close()
                self._conn = _connect(self.path)
                self._read_only = False
            self._prepare()
            for table in ("incidents", "alerts", "nflog", "outbox"):
                self._conn.execute(f"DELETE FROM {table}")
            self._failed = False
            self._depth += 1
            try:
                for p in self.participants:
                    p.resync(self)
            finally:
                self._depth -= 1
            if self._failed:  # a write inside failed (and said so)
                return False
            self._conn.commit()
        except sqlite3.Error as exc:
            self._failed = True
            self.write_failures += 1
            self._error = str(exc)
            with contextlib.suppress(sqlite3.Error):
                self._conn.rollback()
            log.warning("state_still_unwritable", path=str(self.path), err=str(exc))
            return False
        self._error = ""
        log.info("state_recovered", path=str(self.path), consequence="durable state is back")
        return True

    def save_incidents(self, target: str, records: tuple[TrackRecord, ...]) -> None:
        """Replace ``target``'s kept incidents with ``records``."""
        self._write("DELETE FROM incidents WHERE target = ?", (target,))
        for r in records:
            self._write(
                "INSERT INTO incidents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    target,
                    r.model_name,
                    str(r.state),
                    r.run,
                    r.cause,
                    r.started_at,
                    r.challenger,
                    r.challenger_run,
                    r.replaced_run,
                    r.opened_as,
                    r.changes,
                    r.resolve_needed,
                    r.resolved_cause,
                    r.since_resolved,
                ),
            )

    def put_alert(self, alert: Alert) -> None:
        self._write(
            "INSERT OR REPLACE INTO alerts VALUES (?, ?)", (alert.key, alert_to_json(alert))
        )

    def delete_alert(self, key: str) -> None:
        self._write("DELETE FROM alerts WHERE key = ?", (key,))

    def put_log(self, receiver: str, key: str, last: LastSent) -> None:
        self._write(
            "INSERT OR REPLACE INTO nflog VALUES (?, ?, ?, ?, ?)",
            (receiver, key, last.status, last.at, last.cause),
        )

    def delete_log(self, receiver: str, key: str) -> None:
        self._write("DELETE FROM nflog WHERE receiver = ? AND key = ?", (receiver, key))

    def enqueue(self, receiver: str, n: Notification) -> int | None:
        """Keep ``n`` until ``remove``; its row id (None when nothing is kept)."""
        return self._write(
            "INSERT INTO outbox (receiver, path, what, body, queued_at) VALUES (?, ?, ?, ?, ?)",
            (receiver, n.path, n.what, n.body, time.time()),
        )

    def remove(self, row: int | None) -> None:
        """``row``'s notification was delivered or given up."""
        if row is not None:
            self._write("DELETE FROM outbox WHERE id = ?", (row,))

    def rename_receiver(self, old: str, new: str) -> None:
        """``old``'s log and queue are ``new``'s from now on (in the file and restored)."""
        with self.batch():
            self._write("UPDATE nflog SET receiver = ? WHERE receiver = ?", (new, old))
            self._write("UPDATE outbox SET receiver = ? WHERE receiver = ?", (new, old))
        r = self.restored
        r.log = {((new if k[0] == old else k[0]), k[1]): v for k, v in r.log.items()}
        if old in r.outbox:
            r.outbox.setdefault(new, []).extend(r.outbox.pop(old))

    def forget_receiver(self, receiver: str) -> None:
        """A receiver no longer configured: its log and queue go."""
        self._write("DELETE FROM nflog WHERE receiver = ?", (receiver,))
        self._write("DELETE FROM outbox WHERE receiver = ?", (receiver,))

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            if not self._failed:
                self._conn.commit()
            self._conn.close()
        with contextlib.suppress(OSError):
            os.close(self._lock)


def _connect(path: Path) -> sqlite3.Connection:
    # The constructor may run on another thread than the loop that uses the store; calls
    # never overlap (see StateStore), so the same-thread check is not needed.
    conn = sqlite3.connect(path, timeout=1.0, check_same_thread=False)
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        log.warning("state_journal_not_wal", path=str(path), mode=mode)
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def _move_aside(path: Path, why: str) -> bool:
    """Keep an unreadable file for a person to look at, and make room for a fresh one."""
    aside = path.with_name(f"{path.name}.unreadable-{int(time.time())}")
    try:
        if path.exists():
            path.replace(aside)
        for suffix in ("-wal", "-shm"):
            extra = path.with_name(path.name + suffix)
            if extra.exists():
                extra.replace(aside.with_name(aside.name + suffix))
    except OSError as exc:
        log.error("state_unreadable", path=str(path), why=why, moved=False, err=str(exc))
        return False
    log.error(
        "state_unreadable",
        path=str(path),
        why=why,
        moved_to=str(aside),
        consequence="started with no incidents, alerts or undelivered notifications",
    )
    return True


def _off(state_dir: Path, why: str) -> None:
    log.error(
        "state_unavailable",
        state_dir=str(state_dir),
        why=why,
        consequence="running without durable state: a restart forgets open incidents "
        "and undelivered notifications",
    )
