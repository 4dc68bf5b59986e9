"""A simulated vLLM server on the network: ``GET /metrics`` as vLLM serves it, in scaled time.

What it is for: pointing the daemon, Prometheus or a dashboard at something that
behaves like a slow vLLM server, without a GPU. Each scrape first advances the
simulation to virtual time = (wall time since start) x ``speed``, never backwards, then
renders it; a pacing loop also advances it a few times a second, so that a scrape after
a long silence does not have to simulate the whole gap while the scraper waits.

The scenario's last phase goes on for as long as the server runs
(``hold_last_phase``): a fault scenario stays faulty, ``tour`` ends healthy. Looping
back to t = 0 was the alternative; it would reset every counter, which a scraper reads
as a server restart. ``until_s`` ends the run after that many simulated seconds.

Virtual time is a ``Pace``: ``speed`` virtual seconds per wall second, a speed that may be
lowered while it runs (the live demo slows itself on a host that cannot keep up) with
virtual time going on from where it was. Several servers, and the demo's daemon, may
share one ``Pace``, so that they all see one time.

Only the standard library serves (``http.server``); requests are handled on threads, and
one lock guards the simulation, which is not thread-safe.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import urlsplit

import structlog

from vllm_triage.simulator.dialects import OPENMETRICS_TYPE, RUST
from vllm_triage.simulator.exposition import Naming
from vllm_triage.simulator.scenarios import Scenario, hold_last_phase
from vllm_triage.simulator.simulation import Simulation

#: What vLLM (prometheus_client) sends for the classic text format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: trtllm-serve's Prometheus path; its /metrics answers JSON iteration stats.
TRTLLM_PATH = "/prometheus/metrics"


def metrics_path(naming: Naming) -> str:
    """Where the simulated engine serves its Prometheus metrics (as the real one does)."""
    return TRTLLM_PATH if naming == "trtllm" else "/metrics"


#: Seconds between the pacing loop's advances; also how soon a stop request is seen.
PACE_S = 0.25

log = structlog.get_logger("vllm_triage.simulate")

StopReason = Literal["signal", "duration"]


class Pace:
    """Virtual seconds since it was made, running ``speed`` times faster than ``clock``.

    ``set_speed`` changes the rate from now on; virtual time goes on from where it was,
    never jumping, so that whatever reads it (a simulation, a daemon's clock) sees one
    continuous time. Reading is lock-free (one tuple, swapped whole), from any thread.
    """

    def __init__(self, speed: float, clock: Callable[[], float] = time.monotonic) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self._clock = clock
        self._lock = threading.Lock()
        #: (clock at the last change, virtual seconds then, speed since).
        self._since = (clock(), 0.0, speed)

    @property
    def speed(self) -> float:
        return self._since[2]

    def __call__(self) -> float:
        at, virtual, speed = self._since
        return virtual + (self._clock() - at) * speed

    def set_speed(self, speed: float) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        with self._lock:
            now = self._clock()
            at, virtual, old = self._since
            self._since = (now, virtual + (now - at) * old, speed)


class LiveSimulation:
    """A ``Simulation`` that follows a clock, safe to call from several threads.

    Its virtual time is ``pace`` (shared), else a ``Pace`` of its own at ``speed`` on
    ``clock``. ``behind`` counts the pacing loop's steps that could not keep up.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        speed: float,
        naming: Naming,
        until_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        pace: Pace | None = None,
    ) -> None:
        self.pace = pace if pace is not None else Pace(speed, clock)
        self.scenario = scenario
        self.naming: Naming = naming
        self.until_s = until_s
        self.scrapes = 0
        self.behind = 0
        self._sim = Simulation(hold_last_phase(scenario))
        self._lock = threading.Lock()
        self._t = 0.0
        #: The unix time of t = 0, for V1's ``_created`` gauges (as a process start).
        self.created_at = wall()

    @property
    def speed(self) -> float:
        """Virtual seconds per wall second, now."""
        return self.pace.speed

    @property
    def t(self) -> float:
        """Virtual seconds simulated so far."""
        return self._t

    @property
    def finished(self) -> bool:
        return self.until_s is not None and self._t >= self.until_s

    def _advance_locked(self) -> float:
        t = self.pace()
        if self.until_s is not None:
            t = min(t, self.until_s)
        t = max(t, self._t)  # never backwards, whatever the clock does
        self._sim.advance_to(t)
        self._t = t
        return t

    def advance(self) -> float:
        """Bring the simulation up to now; the virtual time reached."""
        with self._lock:
            return self._advance_locked()

    def metrics(self) -> bytes:
        """The ``/metrics`` body at virtual time now."""
        with self._lock:
            self._advance_locked()
            self.scrapes += 1
            text = self._sim.render(created_at=self.created_at, naming=self.naming)
        return text.encode("utf-8")


class _Server(ThreadingHTTPServer):
    """Carries the simulation to the handlers (``daemon_threads`` is on already)."""

    live: LiveSimulation

    def handle_error(self, request: object, client_address: Any) -> None:
        """A scraper that hangs up mid-reply is its business: one log line, no traceback."""
        err = sys.exc_info()[1]
        log.warning("http_error", client=str(client_address), err=repr(err))


class _Handler(BaseHTTPRequestHandler):
    """``GET /metrics`` and ``GET /health`` as vLLM answers them; 404 elsewhere, 405 for
    other methods (a scraper that POSTs is misconfigured and should hear so)."""

    server: _Server  # pyright: ignore[reportIncompatibleVariableOverride]
    server_version = "vllm-triage-simulate"

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        naming = self.server.live.naming
        if path == metrics_path(naming):
            ctype = OPENMETRICS_TYPE if naming == RUST else CONTENT_TYPE
            self._reply(HTTPStatus.OK, self.server.live.metrics(), ctype)
        elif path == "/metrics":  # trtllm-serve: its JSON iteration stats
            body = b'[{"iter": 0, "iterLatencyMS": 0.0, "numActiveRequests": 0}]'
            self._reply(HTTPStatus.OK, body, "application/json")
        elif path == "/health":  # vLLM: 200 with an empty body while the engine is up
            self._reply(HTTPStatus.OK, b"", "text/plain; charset=utf-8")
        else:
            self._reply(HTTPStatus.NOT_FOUND, b"Not Found\n", "text/plain; charset=utf-8")

    def _not_allowed(self) -> None:
        body = b"Method Not Allowed\n"
        self._reply(HTTPStatus.METHOD_NOT_ALLOWED, body, "text/plain; charset=utf-8", "GET")

    # http.server dispatches on these names.
    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed  # noqa: N815

    def _reply(self, status: HTTPStatus, body: bytes, ctype: str, allow: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if allow:
            self.send_header("Allow", allow)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http_request", client=self.client_address[0], line=format % args)


class SimulatedServer:
    """A listening socket in front of a ``LiveSimulation``; ``run`` serves until told to stop.

    Binding happens in the constructor, so a port in use is an ``OSError`` before
    anything starts.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        host: str,
        port: int,
        speed: float,
        naming: Naming,
        until_s: float | None = None,
        pace: Pace | None = None,
    ) -> None:
        self.live = LiveSimulation(scenario, speed=speed, naming=naming, until_s=until_s, pace=pace)
        self._http = _Server((host, port), _Handler)
        self._http.live = self.live

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._http.server_address[:2]
        return str(host), int(port)

    def run(self, stop: Callable[[], bool]) -> StopReason:
        """Serve until ``stop()`` is true (checked every ``PACE_S``) or ``until_s`` is reached.

        The HTTP server runs on a thread; this thread paces the simulation. Always
        closes the socket.
        """
        thread = threading.Thread(
            target=self._http.serve_forever,
            kwargs={"poll_interval": PACE_S},
            name="simulate-http",
            daemon=True,
        )
        thread.start()
        host, port = self.address
        live = self.live
        log.info(
            "simulate_serving",
            host=host,
            port=port,
            url=f"http://{host}:{port}{metrics_path(live.naming)}",
            scenario=live.scenario.name,
            speed=live.speed,
            naming=live.naming,
            duration_s=live.until_s,
        )
        reason: StopReason = "signal"
        warned = False
        try:
            while not stop():
                started = time.monotonic()
                before = live.t
                live.advance()
                if live.finished:
                    reason = "duration"
                    break
                spent = time.monotonic() - started
                behind = spent > PACE_S and (live.t - before) / spent < live.speed
                if behind:
                    live.behind += 1
                if behind and not warned:
                    warned = True
                    log.warning("simulate_falling_behind", speed=live.speed, step_s=spent)
                time.sleep(max(0.0, PACE_S - spent))
        finally:
            self._http.shutdown()
            self._http.server_close()
            thread.join(timeout=5.0)
        log.info("simulate_stopped", reason=reason, simulated_s=live.t, scrapes=live.scrapes)
        return reason

    def close(self) -> None:
        """Release the socket of a server that never ran."""
        self._http.server_close()
