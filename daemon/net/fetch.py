"""Fetching a target's /metrics: ``fetch_async`` for the daemon's event loop, ``fetch`` for
the blocking commands (``record``, ``check``); both share the status check, the body
limit, the redirect rule and the mapping of transport errors to failure reasons.

The body is streamed and refused past ``max_body_bytes``, so a target that sends 50 MiB
costs at most the limit in memory. In the daemon ``asyncio.timeout`` bounds the whole
scrape, body included: httpx's timeout is per read, and a target trickling bytes would
outlast it.

Compression: the request asks for ``Accept-Encoding: identity`` (a sidecar reads vLLM
over loopback, where compressing costs both sides CPU and saves nothing), and a server
that compresses anyway may use one layer of ``gzip`` or ``deflate``. The body is then
inflated here, a slice at a time, with the same limit applied to the *decoded* bytes
inside the loop: a 3 KB gzip bomb stops at ``max_body_bytes`` of output, never a byte
more. httpx's own decoder is not used: it inflates each received chunk whole, and for
stacked encodings (``gzip, gzip``) it inflates the inner layer before any limit can be
checked. Stacked or other encodings are refused (``reason="encoding"``).

Redirects: followed only within the target's own origin (scheme, host and port), at most
``MAX_REDIRECTS`` times: ``/metrics`` -> ``/metrics/`` is common (an ASGI mount), and it
keeps the target's ``headers``, bearer token and basic auth with the server they were
configured for. A redirect to another origin is a failed scrape (``reason="redirect"``)
whose message names where it points, so the URL can be configured if it is right; that
server's data is never diagnosed as the target's.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from vllm_triage.errors import ParseError, ScrapeError
from vllm_triage.net.redact import safe_url, scrub_url

#: vLLM serves the classic text format; prometheus_client's OpenMetrics output would
#: garble names with colons, so ask for 0.0.4 explicitly.
ACCEPT = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
#: Same-origin redirects followed per scrape.
MAX_REDIRECTS = 3
#: Output slice of one inflate call: the limit is checked between slices.
_INFLATE_SLICE = 64 * 1024
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def metrics_url_hint(url: str) -> str:
    """What to try when ``url`` is not vLLM's metrics page: most often the path is missing
    (``http://host:8000``) or names another page (``/healthz``)."""
    parts = urlsplit(url)
    if parts.path.rstrip("/").endswith("/metrics"):
        return "is this the vLLM server's /metrics endpoint?"
    fixed = urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))
    return f"vLLM serves its metrics at /metrics: try {safe_url(fixed)}"


def not_metrics_hint(url: str, exc: ParseError) -> str:
    """A parse error as a user reads it: a body that is not metrics at all (its first line
    is not a sample: a health check's ``ok``, an HTML page) gets the URL hint."""
    shown = safe_url(url)
    if exc.line == 1:
        return f"{shown} did not answer with Prometheus metrics ({exc}): {metrics_url_hint(url)}"
    return f"unreadable /metrics from {shown}: {exc}"


def request_headers(headers: dict[str, str] | None) -> dict[str, str]:
    return {"Accept": ACCEPT, "Accept-Encoding": "identity", **(headers or {})}


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


class BodyLimit:
    """Collects a body's decoded bytes, refusing it once they pass ``max_bytes`` (never
    held whole); ``add`` takes the bytes as they came off the wire."""

    def __init__(self, max_bytes: int, url: str, content_encoding: str = "") -> None:
        self.max_bytes, self.url = max_bytes, url
        self.size = 0
        self.raw_size = 0
        self.chunks: list[bytes] = []
        self._inflate = _decompressor(content_encoding, url)

    @classmethod
    def of(cls, resp: httpx.Response, url: str, max_bytes: int) -> BodyLimit:
        """A limit for ``resp``'s body, once its status says there is a body to read."""
        if resp.status_code // 100 != 2:
            hint = f": {metrics_url_hint(url)}" if resp.status_code == 404 else ""
            raise ScrapeError(
                f"HTTP {resp.status_code} from {safe_url(url)}{hint}", reason="http_status"
            )
        return cls(max_bytes, url, resp.headers.get("Content-Encoding", ""))

    def _keep(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_bytes:
            raise ScrapeError(
                f"body larger than {self.max_bytes} bytes from {safe_url(self.url)}"
                + (" once decompressed" if self._inflate is not None else ""),
                reason="too_large",
            )
        if data:
            self.chunks.append(data)

    def add(self, raw: bytes) -> None:
        self.raw_size += len(raw)
        if self.raw_size > self.max_bytes:
            raise ScrapeError(
                f"body larger than {self.max_bytes} bytes from {safe_url(self.url)}",
                reason="too_large",
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
                    f"compressed body from {safe_url(self.url)} is corrupt: {exc}",
                    reason="http_error",
                ) from exc
            self._keep(out)
            data = z.unconsumed_tail
            if z.eof:
                if data or z.unused_data:
                    raise ScrapeError(
                        f"data after the end of the compressed body from {safe_url(self.url)}",
                        reason="encoding",
                    )
                return
            if not data and len(out) < _INFLATE_SLICE:
                return

    def body(self) -> bytes:
        if self._inflate is not None and not self._inflate.eof:
            raise ScrapeError(
                f"compressed body from {safe_url(self.url)} ends early", reason="http_error"
            )
        return b"".join(self.chunks)


def _decompressor(content_encoding: str, url: str) -> zlib._Decompress | None:
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in _WBITS:
        return zlib.decompressobj(wbits=_WBITS[codings[0]])
    raise ScrapeError(
        f"Content-Encoding {content_encoding[:60]!r} from {safe_url(url)} refused: "
        "one layer of gzip or deflate at most (vllm-triage asks for identity)",
        reason="encoding",
    )


def redirect_to(resp: httpx.Response, current: str, configured: str) -> str | None:
    """Where a same-origin redirect leads; ``None`` when ``resp`` is not a redirect.
    A redirect elsewhere is a ``ScrapeError``."""
    if not resp.is_redirect:
        return None
    try:
        nxt = urljoin(current, resp.headers["Location"])
        elsewhere = origin(nxt) != origin(configured)
    except ValueError as exc:
        raise ScrapeError(
            f"HTTP {resp.status_code} from {safe_url(configured)} with an unusable Location",
            reason="redirect",
        ) from exc
    if elsewhere:
        raise ScrapeError(
            f"HTTP {resp.status_code} from {safe_url(configured)} redirects to another origin, "
            f"{safe_url(nxt)}: not followed (a target's credentials go to its own origin "
            "only, and another server's data is not this target's); if that is the right "
            "server, configure it as the target's url",
            reason="redirect",
        )
    return nxt


def _too_many(url: str) -> ScrapeError:
    return ScrapeError(
        f"more than {MAX_REDIRECTS} redirects from {safe_url(url)}; configure the final URL",
        reason="redirect",
    )


def scrape_error(exc: httpx.HTTPError, url: str, timeout: float) -> ScrapeError:
    """A transport error as a ``ScrapeError`` with its reason (and no secret of the URL)."""
    if isinstance(exc, httpx.TimeoutException):
        return ScrapeError(f"timed out after {timeout:g} s: {safe_url(url)}", reason="timeout")
    reason = "connect" if isinstance(exc, httpx.ConnectError) else "http_error"
    text = scrub_url(str(exc)[:300], url)
    return ScrapeError(f"{type(exc).__name__}: {text} ({safe_url(url)})", reason=reason)


@contextmanager
def _errors(url: str, timeout: float) -> Iterator[None]:
    try:
        yield
    except httpx.HTTPError as exc:
        raise scrape_error(exc, url, timeout) from exc
    except httpx.InvalidURL as exc:
        raise ScrapeError(f"invalid URL {safe_url(url)}", reason="http_error") from exc


def fetch(
    client: httpx.Client,
    url: str,
    *,
    timeout: float,
    max_body_bytes: int,
    headers: dict[str, str] | None = None,
) -> bytes:
    """GET one /metrics body, refusing bodies over ``max_body_bytes`` without reading them whole."""
    current = url
    with _errors(url, timeout):
        for _ in range(MAX_REDIRECTS + 1):
            with client.stream(
                "GET",
                current,
                headers=request_headers(headers),
                timeout=timeout,
                follow_redirects=False,
            ) as resp:
                nxt = redirect_to(resp, current, url)
                if nxt is None:
                    limit = BodyLimit.of(resp, url, max_body_bytes)
                    for chunk in resp.iter_raw():
                        limit.add(chunk)
                    return limit.body()
            current = nxt
    raise _too_many(url)


async def fetch_async(
    client: httpx.AsyncClient,
    url: str,
    *,
    timeout: float,
    max_body_bytes: int,
    headers: dict[str, str] | None = None,
) -> bytes:
    current = url
    try:
        async with asyncio.timeout(timeout):
            with _errors(url, timeout):
                for _ in range(MAX_REDIRECTS + 1):
                    async with client.stream(
                        "GET",
                        current,
                        headers=request_headers(headers),
                        timeout=timeout,
                        follow_redirects=False,
                    ) as resp:
                        nxt = redirect_to(resp, current, url)
                        if nxt is None:
                            limit = BodyLimit.of(resp, url, max_body_bytes)
                            async for chunk in resp.aiter_raw():
                                limit.add(chunk)
                            return limit.body()
                    current = nxt
    except TimeoutError as exc:
        raise ScrapeError(
            f"timed out after {timeout:g} s: {safe_url(url)}", reason="timeout"
        ) from exc
    raise _too_many(url)
