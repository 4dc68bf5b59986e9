"""A webhook receiver on 127.0.0.1 that keeps what it is sent: the demo's stand-in for
the user's Alertmanager receiver, so the demo shows notifications actually delivered."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    received: list[dict[str, Any]]
    lock: threading.Lock


class _Handler(BaseHTTPRequestHandler):
    server: _Server  # pyright: ignore[reportIncompatibleVariableOverride]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError:
            self.send_response(400)
            self.end_headers()
            return
        with self.server.lock:
            self.server.received.append(body)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


class WebhookSink:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._http = _Server((host, port), _Handler)
        self._http.received = []
        self._http.lock = threading.Lock()
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}/alerts"

    @property
    def received(self) -> list[dict[str, Any]]:
        with self._http.lock:
            return list(self._http.received)

    def __enter__(self) -> WebhookSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)
