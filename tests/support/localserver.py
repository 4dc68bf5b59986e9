"""A tiny HTTP server on 127.0.0.1 for tests: serves a sequence of prepared responses."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def serving(responses: list[tuple[int, bytes]]) -> Iterator[tuple[str, list[str]]]:
    """Serve ``responses`` in turn (the last one repeats); yields (url, request paths)."""
    seen: list[str] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                status, body = responses[min(len(seen), len(responses) - 1)]
                seen.append(self.headers.get("Accept", ""))
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
