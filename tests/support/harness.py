"""End-to-end pieces on 127.0.0.1: simulated vLLM servers, the daemon on its own event
loop thread, a target that can misbehave (the webhook receiver is support/receiver.py),
ports, and waiting for a condition."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from vllm_triage.assemble import build_daemon
from vllm_triage.config.schema import Settings
from vllm_triage.service import Daemon
from vllm_triage.simulator import Scenario
from vllm_triage.simulator.dialects import OPENMETRICS_TYPE, RUST
from vllm_triage.simulator.exposition import Naming
from vllm_triage.simulator.serve import CONTENT_TYPE, LiveSimulation, SimulatedServer

from support.localserver import Exchange, Handler, serving


def wait_for(check: Callable[[], Any], *, timeout: float, every: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout} s")


#: Sockets held bound (never listening) for the life of the test process.
_HELD: list[socket.socket] = []


def refused_port() -> int:
    """A port that refuses connections and that nothing else can take: bound but not
    listening, for as long as the tests run. (A port from ``free_port`` may be handed
    out again by the next bind to port 0, such as the daemon's own listener.)"""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return int(s.getsockname()[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def simulated(scenario: Scenario, *, speed: float) -> Iterator[SimulatedServer]:
    server = SimulatedServer(scenario, host="127.0.0.1", port=0, speed=speed, naming="v1")
    stop = threading.Event()
    thread = threading.Thread(target=server.run, args=(stop.is_set,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(timeout=10)


@contextmanager
def simulated_on(
    clock: Callable[[], float], scenario: Scenario, *, speed: float, naming: Naming = "v1"
) -> Iterator[str]:
    """A simulated server on 127.0.0.1 whose virtual time is ``clock``'s time since it was
    made, times ``speed``: with a fake clock, time passes only when the test says. Its
    metrics URL. ``naming``: vLLM's names or another engine's dialect (served at any
    path, vLLM's Rust frontend as OpenMetrics)."""
    live = LiveSimulation(scenario, speed=speed, naming=naming, clock=clock, wall=clock)
    ctype = OPENMETRICS_TYPE if naming == RUST else CONTENT_TYPE

    def handle(x: Exchange) -> None:
        x.reply(200, live.metrics(), content_type=ctype)

    with serving(handle) as server:
        yield server.url("/metrics")


def metrics_url(server: SimulatedServer) -> str:
    return f"http://127.0.0.1:{server.address[1]}/metrics"


@contextmanager
def running_daemon(
    settings: Settings, *, clock: Callable[[], float] = time.time
) -> Iterator[Daemon]:
    """The daemon on an event loop of its own thread; stopped (as by SIGTERM) on exit."""
    daemon = build_daemon(settings, clock=clock)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(daemon.run(stop),), daemon=True)
    thread.start()
    try:
        wait_for(lambda: daemon.ready, timeout=10)
        yield daemon
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
    assert not thread.is_alive(), "the daemon did not stop"


@dataclass
class Answer:
    """What the target answers every GET with; change it while the target runs.

    ``sequence``: bodies served one per GET (the last one repeats), instead of ``body``.
    ``truncate``: announce more bytes than are sent, then hang up. ``stream_bytes``: send
    that many bytes (lines of junk) in 64 KiB chunks; ``sent`` counts what got out.
    """

    status: int = 200
    body: bytes = b""
    delay: float = 0.0
    sequence: list[bytes] = field(default_factory=list)
    truncate: bool = False
    stream_bytes: int = 0
    sent: int = 0
    gets: int = 0


def answering(answer: Answer) -> Handler:
    """A handler answering every GET as ``answer`` says."""
    lock = threading.Lock()

    def handle(x: Exchange) -> None:
        time.sleep(answer.delay)
        with lock:
            answer.gets += 1
            body = answer.body
            if answer.sequence:
                body = answer.sequence.pop(0) if len(answer.sequence) > 1 else answer.sequence[0]
        if answer.stream_bytes:
            x.begin(answer.status, length=answer.stream_bytes)
            answer.sent = 0  # per request
            chunk = (b"# " + b"x" * 1021 + b"\n") * 64  # 64 KiB of comment lines
            while answer.sent < answer.stream_bytes:
                x.write(chunk)
                answer.sent += len(chunk)
            return
        x.begin(answer.status, length=len(body) + (100 if answer.truncate else 0))
        x.write(body)
        if answer.truncate:
            x.hang_up()

    return handle


@contextmanager
def target(answer: Answer | None = None, **kwargs: Any) -> Iterator[str]:
    """A target on 127.0.0.1 answering every GET as ``answer`` says; its metrics URL."""
    with serving(answering(answer or Answer(**kwargs))) as server:
        yield server.url("/metrics")
