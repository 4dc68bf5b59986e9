"""kill -9 at any moment of an incident, then a restart: every firing and resolved is
delivered exactly as without the crash (at least once; a duplicate is the same
notification again, with the same alert fingerprint).

Everything runs as a user runs it, on 127.0.0.1: `vllm-triage simulate --port` plays one
incident with a known start and end (tests/fixtures/scenarios/queue_then_healthy.yaml:
queue-bound for 200 simulated seconds, then healthy), `vllm-triage run` watches it with
its state in a temporary folder, and a webhook receiver records what arrives. The daemon
is killed with SIGKILL at each point of the incident's life the issue names, and started
again with the same settings.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.clirun import COMMAND
from support.harness import free_port, wait_for
from support.paths import SCENARIO_FIXTURES
from support.receiver import Receiver

SCENARIO = SCENARIO_FIXTURES / "queue_then_healthy.yaml"
SPEED = 20.0
#: The queue-bound phase lasts 200 simulated seconds: this many real ones.
FAULT_S = 200 / SPEED
#: Generous bounds for a shared two-core machine; each case takes about 20 s.
TIMEOUT_S = 60.0


class Daemon:
    """`vllm-triage run` in a subprocess; its stderr (JSON log lines) read on a thread so
    that the pipe never fills, and kept for the test to look through."""

    def __init__(self, config: Path, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [str(COMMAND), "run", "--config", str(config)],
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "unparsed", "line": line}
            with self._lock:
                self.events.append(event)

    def seen(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("event") == name]

    def wait_event(self, name: str, timeout: float = TIMEOUT_S) -> dict[str, Any]:
        found: list[dict[str, Any]] = wait_for(lambda: self.seen(name), timeout=timeout)
        return found[0]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._reader.join(5)


@contextmanager
def simulator(tmp_path: Path) -> Iterator[tuple[str, float]]:
    """The simulator serving the scenario: its /metrics URL and when it started."""
    port = free_port()
    with (tmp_path / "simulate.log").open("w") as err:
        args = ["simulate", "--scenario", str(SCENARIO), "--port", str(port)]
        proc = subprocess.Popen(
            [str(COMMAND), *args, "--speed", f"{SPEED:g}"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            url = f"http://127.0.0.1:{port}"

            def up() -> bool:
                try:
                    return httpx.get(url + "/health", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(up, timeout=30, every=0.1)
            yield url + "/metrics", time.monotonic()
        finally:
            proc.terminate()
            proc.wait(10)


def write_config(tmp_path: Path, target: str, receiver: str, listen: str) -> Path:
    cfg = {
        "listen": listen,
        "interval_seconds": 0.5,
        "window_seconds": 4,
        "incident": {"open_after": 2, "resolve_after": 4},
        "state_dir": str(tmp_path / "state"),
        "targets": [{"name": "sim", "url": target}],
        "receivers": [
            {
                "type": "alertmanager_webhook",
                "url": receiver,
                "retry_initial_seconds": 0.2,
                "retry_max_seconds": 1,
            }
        ],
    }
    path = tmp_path / "triage.yaml"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


def story(rx: Receiver) -> list[tuple[str, str, str]]:
    """(status, fingerprint, startsAt) of each alert received, repeats of the same
    notification in a row collapsed (at-least-once delivery may repeat one)."""
    out: list[tuple[str, str, str]] = []
    for body in rx.bodies():
        for a in body["alerts"]:
            item = (a["status"], a["fingerprint"], a["startsAt"])
            if not out or out[-1] != item:
                out.append(item)
    return out


def resolved(rx: Receiver) -> bool:
    return any(status == "resolved" for status, _, _ in story(rx))


def incident_state(listen: str) -> str:
    try:
        doc = httpx.get(f"http://{listen}/api/v1/diagnoses", timeout=1).json()
    except (httpx.HTTPError, ValueError):
        return ""
    models = doc["targets"][0]["models"]
    return str(models[0]["incident_state"]) if models else ""


# Each kill point: what to wait for before the kill (with the receiver and the daemon),
# and whether the receiver is up when the daemon starts again.
def before_the_firing_is_delivered(rx: Receiver, d: Daemon, listen: str, began: float) -> None:
    """The receiver is down: the firing is queued and has failed once."""
    d.wait_event("incident_firing")
    d.wait_event("notification_retry")
    assert rx.bodies() == []


def after_the_firing_is_delivered(rx: Receiver, d: Daemon, listen: str, began: float) -> None:
    """Killed while firing; the incident ends while the daemon is down."""
    wait_for(rx.bodies, timeout=TIMEOUT_S)
    d.kill()
    wait_for(lambda: time.monotonic() > began + FAULT_S + 2, timeout=TIMEOUT_S)


def while_the_incident_is_ending(rx: Receiver, d: Daemon, listen: str, began: float) -> None:
    """Killed after some clear evaluations, fewer than resolve_after."""
    wait_for(rx.bodies, timeout=TIMEOUT_S)
    wait_for(lambda: incident_state(listen) == "resolving", timeout=TIMEOUT_S, every=0.05)


def after_the_resolve_is_queued(rx: Receiver, d: Daemon, listen: str, began: float) -> None:
    """The receiver went down after the firing: the resolve is queued, tried once."""
    wait_for(rx.bodies, timeout=TIMEOUT_S)
    rx.stop()
    retries = len(d.seen("notification_retry"))
    d.wait_event("incident_resolved")
    wait_for(lambda: len(d.seen("notification_retry")) > retries, timeout=TIMEOUT_S)
    assert not resolved(rx)


KillPoint = Callable[[Receiver, Daemon, str, float], None]
#: The kill points at which the receiver is down; it comes back before the restart.
RECEIVER_DOWN_AT_KILL = (before_the_firing_is_delivered, after_the_resolve_is_queued)


def run_incident(tmp_path: Path, kill_at: KillPoint | None) -> tuple[Receiver, list[Daemon]]:
    """One incident from start to end, with the daemon killed at ``kill_at`` (and started
    again) or, with None, left alone. The receiver and both daemons' logs are returned."""
    rx = Receiver()
    listen = f"127.0.0.1:{free_port()}"
    daemons: list[Daemon] = []
    with simulator(tmp_path) as (target, began):
        cfg = write_config(tmp_path, target, rx.url, listen)
        if kill_at is not before_the_firing_is_delivered:
            rx.start()
        try:
            first = Daemon(cfg, tmp_path)
            daemons.append(first)
            first.wait_event("started", 30)
            if kill_at is not None:
                kill_at(rx, first, listen, began)
                if first.proc.poll() is None:
                    first.kill()
                if kill_at in RECEIVER_DOWN_AT_KILL:
                    rx.start()
                second = Daemon(cfg, tmp_path)
                daemons.append(second)
                second.wait_event("started", 30)
            wait_for(lambda: resolved(rx), timeout=TIMEOUT_S, every=0.1)
            time.sleep(1.0)  # anything that would follow the resolve arrives now
        finally:
            for d in daemons:
                d.stop()
            rx.stop()
    return rx, daemons


@pytest.fixture(scope="module")
def without_a_crash(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    """What the receiver hears when nothing is killed: one firing, one resolved."""
    rx, _ = run_incident(tmp_path_factory.mktemp("baseline"), None)
    told = [(status, fp) for status, fp, _ in story(rx)]
    assert [s for s, _ in told] == ["firing", "resolved"], told
    return told


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_at",
    [
        before_the_firing_is_delivered,
        after_the_firing_is_delivered,
        while_the_incident_is_ending,
        after_the_resolve_is_queued,
    ],
    ids=lambda f: f.__name__,
)
def test_kill_9_then_restart_delivers_as_without_the_crash(
    tmp_path: Path, kill_at: KillPoint, without_a_crash: list[tuple[str, str]]
) -> None:
    rx, (first, second) = run_incident(tmp_path, kill_at)
    told = story(rx)
    # The same notifications, in the same order, for the same alert identity ...
    assert [(status, fp) for status, fp, _ in told] == without_a_crash, told
    # ... of one incident that carried on: its firing and its resolve have one startsAt,
    # so the restart neither opened a second incident nor lost the first one's start.
    assert len({starts for _, _, starts in told}) == 1, told
    # The restarted daemon found the state it needed, and said so.
    assert first.seen("state_opened") and second.seen("state_restored")
    restored = second.seen("state_restored")[0]
    assert restored["incidents"] + restored["undelivered"] >= 1
    # Nothing was reported lost.
    for d in (first, second):
        assert not d.seen("notification_failed") and not d.seen("notification_dropped")
