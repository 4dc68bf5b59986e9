"""The daemon's HTTP endpoint, served from a thread so a slow client never stalls scraping.

    GET /metrics            derived metrics (prometheus_client's WSGI app: content
                            negotiation, OpenMetrics, gzip)
    GET /healthz            200 while the process lives
    GET /readyz             200 once settings are loaded and the scheduler runs; 503
                            before and while shutting down. Never tied to a target
                            being up: a sidecar must not hold its pod out of service.
    GET /api/v1/diagnoses   JSON state per target and model (``?target=NAME`` filters)
    GET /api/v1/series      the status page's document: each target's last hour of
                            evaluations, its incidents and transitions (``daemon.pagedata``)
    GET /                   the status page (``daemon/page/``): the same panels as a
                            report, fed by /api/v1/series, reloading itself

Anything but GET on a route is 405; unknown paths are 404. The page runs only its own
scripts and connects only to this origin (Content-Security-Policy); it shows no target's
credentials or query string, and no receiver at all.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

import structlog
from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import CollectorRegistry

from daemon.api import diagnoses_json
from daemon.page.render import content_security_policy, status_page
from daemon.page.spec import load_spec
from daemon.pagedata import live_document
from daemon.state import TargetState

log = structlog.get_logger("vllm_triage.http")

StartResponse = Callable[..., Any]
ROUTES = ("/", "/metrics", "/healthz", "/readyz", "/api/v1/diagnoses", "/api/v1/series")
SeriesDocument = Callable[[float], dict[str, Any]]
#: Headers of the status page: its own scripts only, no framing, no sniffing, no caching.
PAGE_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)


class Endpoints:
    """The WSGI application."""

    def __init__(
        self,
        registry: CollectorRegistry,
        targets: Callable[[], Sequence[TargetState]],
        ready: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        series: SeriesDocument | None = None,
    ) -> None:
        self._metrics = make_wsgi_app(registry)
        self._targets = targets
        self._ready = ready
        self._clock = clock
        self._series = series or (lambda now: live_document(self._targets(), now=now))
        spec = load_spec()
        self._page = status_page(
            source="api/v1/series",
            refresh_seconds=spec.refresh_seconds,
            routes=[r for r in ROUTES if r != "/"],
        ).encode("utf-8")
        self._page_headers = [
            ("Content-Security-Policy", content_security_policy(live=True)),
            *PAGE_HEADERS,
        ]

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path not in ROUTES:
            return _reply(start_response, "404 Not Found", b"not found\n")
        method = environ.get("REQUEST_METHOD")
        if method != "GET":
            return _reply(
                start_response,
                "405 Method Not Allowed",
                b"" if method == "HEAD" else b"only GET is allowed\n",  # HEAD has no body
                extra=[("Allow", "GET")],
            )
        if path == "/metrics":
            return self._metrics(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            return _reply(start_response, "200 OK", b"ok\n")
        if path == "/readyz":
            if self._ready():
                return _reply(start_response, "200 OK", b"ready\n")
            return _reply(start_response, "503 Service Unavailable", b"not ready\n")
        if path == "/api/v1/diagnoses":
            query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
            only = query.get("target", [None])[0]
            targets = self._targets()
            if only is not None and all(t.name != only for t in targets):
                # An unknown target is not "no incidents": say so, with the names there are.
                known = sorted(t.name for t in targets)
                error = {"error": f"no target named {only!r}", "targets": known}
                body = json.dumps(error, indent=2).encode("utf-8") + b"\n"
                return _reply(start_response, "404 Not Found", body, ctype="application/json")
            doc = diagnoses_json(targets, now=self._clock(), only=only)
            body = json.dumps(doc, indent=2, allow_nan=False).encode("utf-8") + b"\n"
            return _reply(start_response, "200 OK", body, ctype="application/json")
        if path == "/api/v1/series":
            body = json.dumps(self._series(self._clock()), allow_nan=False).encode("utf-8")
            return _reply(
                start_response, "200 OK", body, ctype="application/json", extra=PAGE_HEADERS
            )
        return _reply(
            start_response,
            "200 OK",
            self._page,
            ctype="text/html; charset=utf-8",
            extra=self._page_headers,
        )


def _reply(
    start_response: StartResponse,
    status: str,
    body: bytes,
    *,
    ctype: str = "text/plain; charset=utf-8",
    extra: Sequence[tuple[str, str]] = (),
) -> list[bytes]:
    start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body))), *extra])
    return [body]


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http_request", client=self.client_address[0], line=format % args)


class _Server6(ThreadingWSGIServer):
    """For an IPv6 listen address ("[::]:9468")."""

    address_family = socket.AF_INET6


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


class HttpServer:
    """Binds in the constructor (a port in use fails before anything starts)."""

    def __init__(self, listen: str, app: Endpoints) -> None:
        host, port = split_listen(listen)
        server_class = _Server6 if ":" in host else ThreadingWSGIServer
        self._server = make_server(host, port, app, server_class, handler_class=_Handler)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="vllm-triage-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5.0)
        self._server.server_close()
