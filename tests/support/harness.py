"""End-to-end pieces on 127.0.0.1: simulated vLLM servers, the daemon on its own event
loop thread, and a webhook receiver that records what it gets and can misbehave."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from vllm_triage.assemble import build_daemon
from vllm_triage.config.schema import Settings
from vllm_triage.service import Daemon
from vllm_triage.simulator import Scenario
from vllm_triage.simulator.serve import SimulatedServer


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
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> Any:
        return json.loads(self.raw)


@dataclass
class Behaviour:
    """How the receiver answers: ``status`` and a ``delay`` before answering."""

    status: int = 200
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


class Receiver:
    """A webhook receiver on 127.0.0.1 that keeps every request. ``behaviour`` can be
    changed while it runs; ``start``/``stop`` can bring it up and down on the same port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.behaviour = Behaviour()
        self.requests: list[Received] = []
        self.attempts = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r.body for r in self.requests]

    def start(self) -> Receiver:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                b = owner.behaviour
                with owner._lock:
                    owner.attempts += 1
                if b.delay:
                    time.sleep(b.delay)
                if b.status // 100 == 2:
                    with owner._lock:
                        owner.requests.append(Received(self.path, dict(self.headers), raw))
                self.send_response(b.status)
                for k, v in b.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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


@contextmanager
def target(answer: Answer | None = None, **kwargs: Any) -> Iterator[str]:
    """A target on 127.0.0.1 answering every GET as ``answer`` says."""
    answer = answer or Answer(**kwargs)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(answer.delay)
            with lock:
                answer.gets += 1
                body = answer.body
                if answer.sequence:
                    body = (
                        answer.sequence.pop(0) if len(answer.sequence) > 1 else answer.sequence[0]
                    )
            try:
                self.send_response(answer.status)
                if answer.stream_bytes:
                    self._stream(answer.stream_bytes)
                    return
                length = len(body) + (100 if answer.truncate else 0)
                self.send_header("Content-Length", str(length))
                self.end_headers()
                self.wfile.write(body)
                if answer.truncate:
                    self.close_connection = True
            except OSError:
                pass  # the scraper gave up first

        def _stream(self, total: int) -> None:
            self.send_header("Content-Length", str(total))
            self.end_headers()
            answer.sent = 0  # per request
            chunk = (b"# " + b"x" * 1021 + b"\n") * 64  # 64 KiB of comment lines
            while answer.sent < total:
                self.wfile.write(chunk)
                answer.sent += len(chunk)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
