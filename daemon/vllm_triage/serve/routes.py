"""The daemon's routes, a WSGI application served by ``serve.listener``.

    GET /metrics            derived metrics (as prometheus_client's WSGI app answers:
                            content negotiation, OpenMetrics, gzip; written by
                            ``serve.exposition``)
    GET /healthz            200 while the process lives
    GET /readyz             200 once settings are loaded and the scheduler runs; 503
                            before and while shutting down. Never tied to a target
                            being up: a sidecar must not hold its pod out of service.
    GET /api/v1/diagnoses   JSON state per target and model (``?target=NAME`` filters)
    GET /api/v1/series      the status page's document: each target's last hour of
                            evaluations, its incidents and transitions
                            (``vllm_triage.serve.status``)
    GET /                   the status page (``daemon/vllm_triage/page/``): the same panels as a
                            report, fed by /api/v1/series, reloading itself

Anything but GET on a route is 405; unknown paths are 404. The page runs only its own
scripts and connects only to this origin (Content-Security-Policy); it shows no target's
credentials or query string, and no receiver at all. ``/healthz``, ``/readyz`` and the
page are answered on the listener's own thread; ``RENDERED`` names the rest.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.registry import CollectorRegistry

from vllm_triage.page.render import content_security_policy, status_page
from vllm_triage.page.spec import load_spec
from vllm_triage.serve.api import diagnoses_json
from vllm_triage.serve.exposition import metrics_app
from vllm_triage.serve.status import live_document
from vllm_triage.state import StoreStatus, TargetState

StartResponse = Callable[..., Any]
#: Routes whose answer is rendered on a worker thread; the rest are answered at once.
RENDERED = frozenset({"/metrics", "/api/v1/diagnoses", "/api/v1/series"})
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

    rendered = RENDERED

    def __init__(
        self,
        registry: CollectorRegistry,
        targets: Callable[[], Sequence[TargetState]],
        ready: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        series: SeriesDocument | None = None,
        *,
        store: Callable[[], StoreStatus | None] = lambda: None,
    ) -> None:
        self._metrics = metrics_app(registry)
        self._targets = targets
        self._ready = ready
        self._store = store
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
            return self._metrics(environ, start_response)
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
            doc = diagnoses_json(targets, now=self._clock(), only=only, store=self._store())
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
