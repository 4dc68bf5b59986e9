"""A small HTTP/1.1 server on one selector thread, for the daemon's endpoint (the routes
are ``serve.routes``): served from a thread so a slow client never stalls scraping.

The property that matters is that ``/healthz`` answers within a second whatever clients
do, and neither wsgiref (a thread per connection, no idle timeout, a backlog of 5) nor
waitress (it stops accepting at its ``connection_limit`` until an idle connection times
out: with 1,100 idle connections at a 1,024-descriptor limit, a probe timed out after 10 s
with ``connection_limit=100, channel_timeout=5``, and took 5.5 s with 900) has it:

- at most ``MAX_CONNECTIONS`` connections; one more evicts the oldest connection that is
  only waiting for a request (a held idle connection costs the holder, never the probe),
  and running out of file descriptors does the same instead of spinning;
- a request's head must arrive, and a response must be taken, within
  ``IDLE_TIMEOUT_S``, a kept-alive connection idles at most as long; heads over
  ``MAX_HEAD_BYTES`` are refused; request bodies are never read (only GET is served);
- cheap routes and every refusal are answered on the selector thread itself; the routes
  the application names as costly (``rendered``: /metrics and the API) are rendered by
  ``WORKERS`` threads, with at most ``MAX_QUEUED`` waiting (then 503), and while one
  renders, a rendering of the last ``RENDER_TTL_S`` is served: a flood of scrapes costs
  one rendering a second.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol
from urllib.parse import unquote

import structlog

log = structlog.get_logger("vllm_triage.http")


class App(Protocol):
    """A WSGI application that names its costly routes: those are rendered on a worker
    thread (and a recent rendering served again); the rest are answered at once."""

    rendered: frozenset[str]

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]: ...


#: Open connections at most (well below a 1,024 file-descriptor limit, leaving room for
#: the targets' and receivers' sockets).
MAX_CONNECTIONS = 256
#: A request head must arrive, a response be read, and a kept-alive connection idle,
#: within this many seconds.
IDLE_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 16 * 1024
#: Threads rendering /metrics and the API, and how many requests may wait for one.
WORKERS = 2
MAX_QUEUED = 64
LISTEN_BACKLOG = 1024
_READING, _WORKING, _WRITING, _CLOSING = 0, 1, 2, 3
#: While a rendering is under way, a recent one (per path, query and negotiated format)
#: is served again for this long, so that a flood of scrapes costs one rendering a second.
RENDER_TTL_S = 1.0
MAX_RENDERED_KEPT = 32
#: (status, headers, body) as the WSGI application gave them.
_Rendered = tuple[str, list[tuple[str, str]], bytes]
#: A closing connection's unread input is drained this long (so that the answer is not
#: lost to a reset), then it is closed.
LINGER_S = 2.0


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


class _Conn:
    __slots__ = ("addr", "buf", "deadline", "keep_alive", "out", "sock", "state")

    def __init__(self, sock: socket.socket, addr: str, deadline: float) -> None:
        self.sock, self.addr, self.deadline = sock, addr, deadline
        self.buf = b""
        self.out = b""
        self.state = _READING
        self.keep_alive = False


class _Request:
    """A parsed request head, or why it could not be parsed."""

    __slots__ = ("error", "has_body", "headers", "keep_alive", "method", "path", "query")

    def __init__(self, head: bytes) -> None:
        self.error = ""
        self.method = self.path = self.query = ""
        self.headers: dict[str, str] = {}
        self.has_body = False
        self.keep_alive = False
        try:
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
        except ValueError:
            self.error = "400 Bad Request"
            return
        if not version.startswith("HTTP/1."):
            self.error = "505 HTTP Version Not Supported"
            return
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                self.error = "400 Bad Request"
                return
            self.headers[name.lower()] = value.strip()
        path, _, self.query = target.partition("?")
        self.method, self.path = method, unquote(path)
        length = self.headers.get("content-length", "0")
        self.has_body = "transfer-encoding" in self.headers or length not in ("", "0")
        connection = self.headers.get("connection", "").lower()
        self.keep_alive = version == "HTTP/1.1" and "close" not in connection

    def environ(self, server: tuple[str, int]) -> dict[str, Any]:
        env: dict[str, Any] = {
            "REQUEST_METHOD": self.method,
            "PATH_INFO": self.path,
            "QUERY_STRING": self.query,
            "SERVER_NAME": server[0],
            "SERVER_PORT": str(server[1]),
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.url_scheme": "http",
        }
        for name, value in self.headers.items():
            env["HTTP_" + name.upper().replace("-", "_")] = value
        return env


def _response(status: str, headers: list[tuple[str, str]], body: bytes, keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {status}"]
    names = set()
    for name, value in headers:
        names.add(name.lower())
        lines.append(f"{name}: {value}")
    if "content-length" not in names:
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def bind(listen: str) -> socket.socket:
    """The listening socket for ``HOST:PORT``, bound and listening (a port in use fails
    here, before anything starts). The caller owns it: ``HttpServer.stop`` closes it, and
    so does whoever bound it if the server is never built."""
    host, port = split_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class HttpServer:
    """Serves ``app`` on a socket ``bind`` made. It owns the socket from here on, and its
    selector and wake-up pair: ``stop`` closes them all, started or not."""

    def __init__(self, listener: socket.socket, app: App) -> None:
        self._listener = listener
        # Kept: the address is still asked for (a URL to print) once the socket is closed.
        bound_host, bound_port = listener.getsockname()[:2]
        self._address = (str(bound_host), int(bound_port))
        self._app = app
        self._rendered = app.rendered
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._conns: dict[socket.socket, _Conn] = {}
        self._done: deque[tuple[_Conn, _Rendered]] = deque()
        #: (path, query, Accept, Accept-Encoding) -> (until when, what was rendered).
        self._cache: dict[tuple[str, ...], tuple[float, _Rendered]] = {}
        self._working = 0
        self._pool: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accept_paused_until = 0.0
        self._next_sweep = 0.0
        self.evicted = 0

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="vllm-triage-http-worker")
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._serve, name="vllm-triage-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stopping = True
            self._wake()
            self._thread.join(timeout=5.0)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for conn in list(self._conns.values()):
            self._close(conn)
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()
        self._sel.close()

    # -- the selector thread ------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stopping:
            try:
                self._turn()
            except Exception:
                # A bug of ours must not end the listener (and with it /healthz).
                log.exception("http_listener_failed")
                time.sleep(0.05)

    def _turn(self) -> None:
        """One turn of the selector loop: events, finished renderings, expired deadlines."""
        now = time.monotonic()
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, None)
        for key, mask in self._sel.select(timeout=0.25):
            if key.data is None:
                self._accept()
            elif key.data == "wake":
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            else:
                self._event(key.data, mask)
        while self._done:
            conn, rendered = self._done.popleft()
            self._working -= 1
            if conn.sock in self._conns:
                self._send(conn, _response(*rendered, conn.keep_alive))
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + 0.25
            for conn in [c for c in self._conns.values() if c.state != _WORKING]:
                if now > conn.deadline:
                    self._close(conn)

    def _event(self, conn: _Conn, mask: int) -> None:
        try:
            if conn.state == _CLOSING:
                self._drain(conn)
            elif mask & selectors.EVENT_READ:
                self._read(conn)
            elif mask & selectors.EVENT_WRITE:
                self._write(conn)
        except Exception:
            # A bug of ours must cost one connection, never the listener (and /healthz).
            log.exception("http_connection_failed", client=conn.addr)
            self._close(conn)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _evict_one(self) -> bool:
        """Close the oldest connection that is only waiting for a request."""
        for conn in self._conns.values():
            if conn.state in (_READING, _CLOSING):
                self._close(conn)
                self.evicted += 1
                return True
        return False

    def _accept(self) -> None:
        for _ in range(64):  # then let the connections already open have their turn
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if not self._evict_one():
                        # Nothing to give back: stop accepting briefly rather than spin.
                        self._sel.unregister(self._listener)
                        self._accept_paused_until = time.monotonic() + 0.1
                        return
                    continue
                return  # ECONNABORTED and the like: that client is gone
            if len(self._conns) >= MAX_CONNECTIONS and not self._evict_one():
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock, str(addr[0]), time.monotonic() + IDLE_TIMEOUT_S)
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _linger(self, conn: _Conn) -> None:
        """Half-close, then read and drop what the client still sends (a body we did not
        read) for ``LINGER_S``: closing with unread input would reset the connection and
        could destroy the answer before the client reads it."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.state = _CLOSING
        conn.buf = b""
        conn.deadline = time.monotonic() + LINGER_S
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _drain(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        conn.buf += data
        self._next_request(conn)

    def _next_request(self, conn: _Conn) -> None:
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.buf) > MAX_HEAD_BYTES:
                self._refuse(conn, "431 Request Header Fields Too Large")
            return
        if end > MAX_HEAD_BYTES:
            self._refuse(conn, "431 Request Header Fields Too Large")
            return
        head, conn.buf = conn.buf[:end], conn.buf[end + 4 :]
        req = _Request(head)
        if req.error:
            self._refuse(conn, req.error)
            return
        # A request body is never read (only GET is served): answer, then close.
        conn.keep_alive = req.keep_alive and not req.has_body
        log.debug("http_request", client=conn.addr, method=req.method[:16], path=req.path[:200])
        environ = req.environ(self.address)
        if req.method == "GET" and req.path in self._rendered:
            h = req.headers
            key = (req.path, req.query, h.get("accept", ""), h.get("accept-encoding", ""))
            hit = self._cache.get(key)
            # While a rendering is under way, a recent one serves: a flood costs one
            # rendering a second; a lone client always gets a fresh one.
            if self._working and hit is not None and hit[0] > time.monotonic():
                self._send(conn, _response(*hit[1], conn.keep_alive))
                return
            if self._working >= MAX_QUEUED or self._pool is None:
                self._refuse(conn, "503 Service Unavailable")
                return
            conn.state = _WORKING
            self._sel.unregister(conn.sock)
            self._working += 1
            self._pool.submit(self._render, conn, environ, key)
            return
        self._send(conn, _response(*self._call(environ), conn.keep_alive))

    def _refuse(self, conn: _Conn, status: str) -> None:
        conn.keep_alive = False
        body = status.split(" ", 1)[1].lower().encode() + b"\n"
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if status.startswith("503"):
            headers.append(("Retry-After", "1"))
        self._send(conn, _response(status, headers, body, False))

    def _call(self, environ: dict[str, Any]) -> _Rendered:
        got: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc: Any = None) -> None:
            got[:] = [status, headers]

        try:
            result = self._app(environ, start_response)
            body = b"".join(result)
        except Exception:
            log.exception("http_app_failed", path=str(environ.get("PATH_INFO", ""))[:200])
            return "500 Internal Server Error", [], b"internal error\n"
        return got[0], got[1], body

    def _render(self, conn: _Conn, environ: dict[str, Any], key: tuple[str, ...]) -> None:
        """On a worker thread: render, keep it for ``RENDER_TTL_S``, then hand it back to
        the selector thread."""
        rendered = self._call(environ)
        if rendered[0].startswith("200"):
            if len(self._cache) >= MAX_RENDERED_KEPT:
                self._cache.clear()
            self._cache[key] = (time.monotonic() + RENDER_TTL_S, rendered)
        self._done.append((conn, rendered))
        self._wake()

    def _send(self, conn: _Conn, out: bytes) -> None:
        conn.out = out
        conn.deadline = time.monotonic() + IDLE_TIMEOUT_S
        if conn.state == _READING:
            self._sel.unregister(conn.sock)
        conn.state = _WRITING
        self._sel.register(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        except OSError:
            self._close(conn)
            return
        conn.out = conn.out[sent:]
        if conn.out:
            return
        if not conn.keep_alive:
            self._linger(conn)
            return
        conn.state = _READING
        conn.deadline = time.monotonic() + IDLE_TIMEOUT_S
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        if conn.buf:
            self._next_request(conn)
