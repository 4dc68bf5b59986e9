"""The one way the daemon reads a peer's answer over HTTP: streamed, capped, bounded in time.

Every request the daemon makes goes through ``request``: the scrapes (``net.fetch``), the
active probe, the fleet's query API and the receivers' answers. A peer controls what it
sends back, so each answer is read the same way, whoever asked:

- the whole exchange (connect, send, status, body) is bounded by ``timeout`` as a whole
  (``asyncio.timeout``): httpx's timeout is per read, and a peer trickling bytes would
  outlast it;
- the body is streamed and never held past ``max_bytes``: past it the answer is refused
  (``reason="too_large"``) or, for a caller that only needs its status (a receiver's
  answer), cut off there;
- compression: ``Accept-Encoding: identity`` unless the caller asks for gzip; an answer
  compressed anyway may use one layer of ``gzip`` or ``deflate``, inflated here a slice at
  a time with the limit applied to the *decoded* bytes inside the loop, so a 3 KB gzip
  bomb stops at ``max_bytes`` of output, never a byte more. httpx's own decoder is not
  used: it inflates each received chunk whole, and for stacked encodings (``gzip, gzip``)
  the inner layer before any limit can be checked. Stacked or other encodings are refused
  (``reason="encoding"``);
- a non-2xx answer's body is not read at all (its status and headers say what is needed),
  unless the caller asks for its first ``error_bytes`` (a query API's error says why);
- redirects are never followed here (the scrape follows same-origin ones itself);
- every transport failure is a ``ScrapeError`` with a short reason, and its message never
  holds the URL's secrets (``shown`` replaces the URL where even its path is secret).

``tests/test_architecture.py`` fails if any module but this one calls an httpx client.
"""

from __future__ import annotations

import asyncio
import errno
import os
import ssl
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from vllm_triage.errors import ScrapeError
from vllm_triage.net.redact import safe_url, scrub_url

#: Output slice of one inflate call: the limit is checked between slices.
_INFLATE_SLICE = 64 * 1024
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


@dataclass(frozen=True, slots=True)
class Answer:
    """A peer's answer: its status, headers and (for a 2xx) its decoded body."""

    status: int
    headers: httpx.Headers
    body: bytes
    #: The body went past the limit and was cut there (``overflow="truncate"`` only).
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.status // 100 == 2

    @property
    def is_redirect(self) -> bool:
        return self.status in (301, 302, 303, 307, 308) and "Location" in self.headers


class BodyLimit:
    """Collects a body's decoded bytes, refusing it once they pass ``max_bytes`` (never
    held whole); ``add`` takes the bytes as they came off the wire."""

    def __init__(
        self, max_bytes: int, shown: str, content_encoding: str = "", *, decode: bool = True
    ) -> None:
        self.max_bytes, self.shown = max_bytes, shown
        self.size = 0
        self.raw_size = 0
        self.chunks: list[bytes] = []
        self._inflate = _decompressor(content_encoding, shown) if decode else None

    def _keep(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_bytes:
            raise ScrapeError(
                f"body larger than {self.max_bytes} bytes from {self.shown}"
                + (" once decompressed" if self._inflate is not None else ""),
                reason="too_large",
            )
        if data:
            self.chunks.append(data)

    def add(self, raw: bytes) -> None:
        self.raw_size += len(raw)
        if self.raw_size > self.max_bytes:
            raise ScrapeError(
                f"body larger than {self.max_bytes} bytes from {self.shown}", reason="too_large"
            )
        z = self._inflate
        if z is None:
            self._keep(raw)
            return
        data = raw
        while True:
            try:
                out = z.decompress(data, _INFLATE_SLICE)
            except zlib.error as exc:
                raise ScrapeError(
                    f"compressed body from {self.shown} is corrupt: {exc}", reason="http_error"
                ) from exc
            self._keep(out)
            data = z.unconsumed_tail
            if z.eof:
                if data or z.unused_data:
                    raise ScrapeError(
                        f"data after the end of the compressed body from {self.shown}",
                        reason="encoding",
                    )
                return
            if not data and len(out) < _INFLATE_SLICE:
                return

    def body(self) -> bytes:
        if self._inflate is not None and not self._inflate.eof:
            raise ScrapeError(f"compressed body from {self.shown} ends early", reason="http_error")
        return b"".join(self.chunks)


def _decompressor(content_encoding: str, shown: str) -> zlib._Decompress | None:
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in _WBITS:
        return zlib.decompressobj(wbits=_WBITS[codings[0]])
    raise ScrapeError(
        f"Content-Encoding {content_encoding[:60]!r} from {shown} refused: "
        "one layer of gzip or deflate at most (vllm-triage asks for identity)",
        reason="encoding",
    )


def transport_error(
    exc: httpx.HTTPError, url: str, timeout: float, shown: str, *, answered: bool = False
) -> ScrapeError:
    """A transport error as a ``ScrapeError`` with its reason (and no secret of the URL).
    ``answered``: the peer's status line had come (the error cut its body short)."""
    if isinstance(exc, httpx.TimeoutException):
        return ScrapeError(f"timed out after {timeout:g} s: {shown}", reason="timeout")
    reason = "connect" if isinstance(exc, httpx.ConnectError) else "http_error"
    tls = _tls_error(exc)
    if tls is not None:
        return ScrapeError(_tls_text(tls, shown), reason="connect")
    if not answered and _reset(exc) and shown.startswith("http://"):
        # A TLS server reading a plain request hangs up without an answer; so does a
        # crashing server: said as a question, with the fix if it is the first.
        https = "https://" + shown.removeprefix("http://")
        return ScrapeError(
            f"{type(exc).__name__}: the connection was closed without an answer ({shown}); "
            f"if that port serves TLS, use {https}",
            reason=reason,
        )
    if not answered and shown.startswith("https://") and _closed(exc):
        # TLS 1.3 refuses a client certificate after the handshake: the server's alert
        # races the request, and a busy host often sees only the closed socket.
        return ScrapeError(
            f"{type(exc).__name__}: the connection was closed without an answer ({shown}); "
            "a TLS server that wants a client certificate it trusts closes it so",
            reason=reason,
        )
    text = scrub_url((_os_error(exc) or str(exc))[:300], url).replace(url, shown)
    return ScrapeError(f"{type(exc).__name__}: {text} ({shown})", reason=reason)


def _tls_error(exc: BaseException) -> ssl.SSLError | None:
    """The TLS library's error down a transport error's chain of causes, if any."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _tls_text(err: ssl.SSLError, shown: str) -> str:
    """A TLS failure as a user can act on it. ``WRONG_VERSION_NUMBER``: what came back
    was not TLS at all, almost always a plain-HTTP server behind an https:// URL."""
    if err.reason == "WRONG_VERSION_NUMBER" and shown.startswith("https://"):
        plain = "http://" + shown.removeprefix("https://")
        return f"the target answered plain HTTP to an https:// URL ({shown}); use {plain}"
    if isinstance(err, ssl.SSLCertVerificationError):
        why = err.verify_message or err.reason or "certificate verify failed"
        return f"TLS: the server's certificate is not trusted ({why}) ({shown})"
    if err.reason in ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_BAD_CERTIFICATE"):
        return f"TLS: the server wants a client certificate it trusts ({err.reason}) ({shown})"
    return f"TLS handshake failed: {err.reason or err} ({shown})"


def _reset(exc: httpx.HTTPError) -> bool:
    """The peer closed or reset the connection."""
    if isinstance(exc, httpx.RemoteProtocolError):
        return "without sending" in str(exc)
    if isinstance(exc, httpx.ReadError):
        return _os_error(exc) == os.strerror(errno.ECONNRESET) or not str(exc)
    return False


def _closed(exc: httpx.HTTPError) -> bool:
    """The peer closed the connection: reset, or a broken pipe as the request was sent."""
    return _reset(exc) or (
        isinstance(exc, httpx.ReadError | httpx.WriteError)
        and _os_error(exc) == os.strerror(errno.EPIPE)
    )


def _os_error(exc: BaseException) -> str | None:
    """What the system said, when a transport error comes from a refused or failed
    socket: the async transport reports "All connection attempts failed" and keeps the
    useful part ("Connection refused") down its chain of causes."""
    seen: BaseException | None = exc
    for _ in range(10):  # the chain is a few links long; never loop on a cycle
        if seen is None:
            return None
        # An SSLError is an OSError whose errno is the TLS library's code, not the
        # system's (1 would read "Operation not permitted"): ``_tls_error`` says those.
        if isinstance(seen, OSError) and not isinstance(seen, ssl.SSLError) and seen.errno:
            return os.strerror(seen.errno)
        seen = seen.__cause__ or seen.__context__
    return None


async def _head(resp: httpx.Response, limit: int, shown: str, encoding: str) -> bytes:
    """The first ``limit`` decoded bytes of an answer's body (nothing when 0)."""
    if limit <= 0:
        return b""
    kept = BodyLimit(limit, shown, encoding)
    try:
        async for chunk in resp.aiter_raw():
            kept.add(chunk)
    except ScrapeError:
        pass  # past the limit, or a broken encoding: what came so far is enough
    return b"".join(kept.chunks)[:limit]


async def request(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, str | list[str]] | None = None,
    data: Mapping[str, str | list[str]] | None = None,
    json: Any = None,
    content: bytes | None = None,
    overflow: Literal["refuse", "truncate"] = "refuse",
    decode: bool = True,
    shown: str | None = None,
    error_bytes: int = 0,
) -> Answer:
    """One request and its answer, read as the module says. ``shown`` is how the URL
    appears in errors (default: without credentials or query values); ``decode=False``
    keeps the bytes as they came (a receiver's answer, which only its status matters for);
    ``error_bytes``: how much of a non-2xx answer's body to keep (decoded), at most."""
    shown = shown or safe_url(url)
    sent = {"Accept-Encoding": "identity", **(headers or {})}
    answered = False
    try:
        async with asyncio.timeout(timeout):
            try:
                async with client.stream(
                    method,
                    url,
                    headers=sent,
                    params=params,
                    data=data,
                    json=json,
                    content=content,
                    timeout=timeout,
                    follow_redirects=False,
                ) as resp:
                    answered = True
                    encoding = resp.headers.get("Content-Encoding", "")
                    if resp.status_code // 100 != 2:
                        head = await _head(resp, error_bytes, shown, encoding)
                        return Answer(resp.status_code, resp.headers, head)
                    limit = BodyLimit(max_bytes, shown, encoding, decode=decode)
                    try:
                        async for chunk in resp.aiter_raw():
                            limit.add(chunk)
                    except ScrapeError as exc:
                        if overflow == "truncate" and exc.reason == "too_large":
                            return Answer(resp.status_code, resp.headers, b"", truncated=True)
                        raise
                    return Answer(resp.status_code, resp.headers, limit.body())
            except httpx.HTTPError as exc:
                raise transport_error(exc, url, timeout, shown, answered=answered) from exc
            except ssl.SSLError as exc:
                # TLS 1.3 says a refused client certificate after the handshake, at the
                # first read, where httpx lets the TLS library's error through unwrapped.
                raise ScrapeError(_tls_text(exc, shown), reason="connect") from exc
            except httpx.InvalidURL as exc:
                raise ScrapeError(f"invalid URL {shown}", reason="http_error") from exc
    except TimeoutError as exc:
        raise ScrapeError(f"timed out after {timeout:g} s: {shown}", reason="timeout") from exc
