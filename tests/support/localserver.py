"""The test suite's one HTTP server: 127.0.0.1 only, on port 0 (any free port) or a given
one, answering every request through a handler callback.

The handler gets an ``Exchange``: the request (method, path, headers, body, arrival time)
and the means to answer it, whole (``reply``) or a piece at a time (``begin`` then
``write``: slowly, without end, or announcing more than it sends), or not at all
(``hang``, released when the server stops). Every request is kept in ``requests``.

The socket is bound when the server is made, so its URL is known before it serves; until
``start`` (and again after ``stop``) it holds the port without listening, so connections
are refused and no other test can take the port: a receiver that is down for a while.
Used as a context manager it serves inside the block and lets go of the port after it.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: How often the serving loop looks for a stop: a stopped server is gone within this.
POLL_S = 0.02
#: Connections waiting to be accepted (the fleet sends a tick's queries at once).
BACKLOG = 128
#: The text format's content type, as vLLM (prometheus_client) sends it.
METRICS_TYPE = "text/plain; version=0.0.4"


@dataclass(frozen=True)
class Request:
    """One request as it arrived."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() on arrival

    def header(self, name: str, default: str = "") -> str:
        """A header by name, whatever its case."""
        wanted = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == wanted), default)


class Exchange:
    """One request and its answer. Writing to a client that has gone ends the handler
    quietly (the server swallows the ``OSError``)."""

    def __init__(self, handler: _Handler, request: Request, server: LocalServer) -> None:
        self._h = handler
        self.request = request
        self.server = server

    def reply(
        self,
        status: int = 200,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        *,
        content_type: str | None = None,
    ) -> None:
        """The whole answer, with its Content-Length."""
        all_headers = dict(headers or {})
        if content_type is not None:
            all_headers["Content-Type"] = content_type
        self.begin(status, all_headers, length=len(body))
        self.write(body)

    def begin(
        self, status: int, headers: Mapping[str, str] | None = None, *, length: int | None = None
    ) -> None:
        """The status line and headers; the body follows with ``write``. Without a
        ``length`` the body ends when the connection closes."""
        self._h.send_response(status)
        for name, value in (headers or {}).items():
            self._h.send_header(name, value)
        if length is not None:
            self._h.send_header("Content-Length", str(length))
        else:
            self._h.close_connection = True
            if self._h.protocol_version >= "HTTP/1.1":
                self._h.send_header("Connection", "close")
        self._h.end_headers()

    def write(self, data: bytes) -> None:
        self._h.wfile.write(data)

    def hang_up(self) -> None:
        """Close the connection after this answer, whatever was announced."""
        self._h.close_connection = True

    def drop(self) -> None:
        """Close the connection at once, with no answer at all (no status line): what a
        TLS server does to a plain-HTTP request."""
        self._h.close_connection = True
        self._h.connection.close()

    def hang(self, seconds: float) -> None:
        """Answer nothing for ``seconds``, or until the server stops."""
        self.server.stopping.wait(seconds)


Handler = Callable[[Exchange], None]


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.protocol_version = self.server.protocol

    def _any(self) -> None:
        owner = self.server.owner()
        if owner is None:
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = Request(self.command, self.path, dict(self.headers), body, time.monotonic())
        owner._arrived(request)
        with contextlib.suppress(OSError):  # the client gave up first
            owner.handler(Exchange(self, request, owner))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _any  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _HTTPServer(ThreadingHTTPServer):
    """Bound at once, listening only once activated (``daemon_threads`` is on already)."""

    request_queue_size = BACKLOG

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        if self.tls is not None:
            # The handshake happens on the handler's thread, at its first read.
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def __init__(
        self, port: int, owner: LocalServer, protocol: str, tls: ssl.SSLContext | None = None
    ) -> None:
        super().__init__(("127.0.0.1", port), _Handler, bind_and_activate=False)
        self.owner = weakref.ref(owner)  # the socket's finalizer must not keep it alive
        self.protocol = protocol
        self.tls = tls
        try:
            self.server_bind()
        except OSError:
            self.server_close()
            raise


def _close(held: list[_HTTPServer | None]) -> None:
    if held[0] is not None:
        held[0].server_close()
        held[0] = None


class LocalServer:
    """An HTTP server on 127.0.0.1 answering every request with ``handler``."""

    def __init__(
        self,
        handler: Handler,
        *,
        port: int = 0,
        http11: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.handler = handler
        self.protocol = "HTTP/1.1" if http11 else "HTTP/1.0"
        self.tls = tls
        #: Set while stopping or stopped: ``Exchange.hang`` returns then.
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self._thread: threading.Thread | None = None
        # A list, so that the finalizer can close the socket without holding the server.
        self._held: list[_HTTPServer | None] = [_HTTPServer(port, self, self.protocol, tls)]
        self.port = self._bound().server_address[1]
        weakref.finalize(self, _close, self._held)

    def _bound(self) -> _HTTPServer:
        httpd = self._held[0]
        if httpd is None:
            httpd = self._held[0] = _HTTPServer(self.port, self, self.protocol, self.tls)
        return httpd

    def _arrived(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)

    @property
    def requests(self) -> list[Request]:
        """Every request so far, in order of arrival."""
        with self._lock:
            return list(self._requests)

    def url(self, path: str = "") -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    @property
    def serving(self) -> bool:
        return self._thread is not None

    def start(self) -> LocalServer:
        """Listen and serve on a thread (again, after a ``stop``, on the same port)."""
        if self._thread is None:
            httpd = self._bound()
            self.stopping.clear()
            httpd.server_activate()
            self._thread = threading.Thread(
                target=httpd.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; the port stays held, refusing connections, until ``close``."""
        self.stopping.set()
        if self._thread is not None:
            httpd = self._bound()
            httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
            _close(self._held)
            with contextlib.suppress(OSError):  # held again at the next start otherwise
                self._bound()

    def close(self) -> None:
        """Stop serving and let go of the port."""
        self.stop()
        _close(self._held)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def serving(
    handler: Handler, *, port: int = 0, http11: bool = False, tls: ssl.SSLContext | None = None
) -> Iterator[LocalServer]:
    """``handler`` served on 127.0.0.1 for the block (over TLS with ``tls``, a server
    context); the port is let go after it."""
    with LocalServer(handler, port=port, http11=http11, tls=tls) as server:
        yield server


def replies(*answers: tuple[int, bytes], content_type: str = METRICS_TYPE) -> Handler:
    """A handler answering with each (status, body) in turn, the last one repeating."""
    count = [0]
    lock = threading.Lock()

    def handle(x: Exchange) -> None:
        with lock:
            status, body = answers[min(count[0], len(answers) - 1)]
            count[0] += 1
        x.reply(status, body, content_type=content_type)

    return handle
