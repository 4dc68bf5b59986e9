"""Fetching a target's /metrics: ``fetch_async`` for the daemon's event loop, ``fetch`` for
the blocking commands (``record``, ``check``); both share the status check, the body
limit and the mapping of transport errors to failure reasons.

The body is streamed and refused past ``max_body_bytes``, so a target that sends 50 MiB
costs at most the limit in memory. In the daemon ``asyncio.timeout`` bounds the whole
scrape, body included: httpx's timeout is per read, and a target trickling bytes would
outlast it.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import httpx

from daemon.errors import ParseError, ScrapeError

#: vLLM serves the classic text format; prometheus_client's OpenMetrics output would
#: garble names with colons, so ask for 0.0.4 explicitly.
ACCEPT = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


def metrics_url_hint(url: str) -> str:
    """What to try when ``url`` is not vLLM's metrics page: most often the path is missing
    (``http://host:8000``) or names another page (``/healthz``)."""
    parts = urlsplit(url)
    if parts.path.rstrip("/").endswith("/metrics"):
        return "is this the vLLM server's /metrics endpoint?"
    fixed = urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))
    return f"vLLM serves its metrics at /metrics: try {fixed}"


def not_metrics_hint(url: str, exc: ParseError) -> str:
    """A parse error as a user reads it: a body that is not metrics at all (its first line
    is not a sample: a health check's ``ok``, an HTML page) gets the URL hint."""
    if exc.line == 1:
        return f"{url} did not answer with Prometheus metrics ({exc}): {metrics_url_hint(url)}"
    return f"unreadable /metrics from {url}: {exc}"


def request_headers(headers: dict[str, str] | None) -> dict[str, str]:
    return {"Accept": ACCEPT, **(headers or {})}


class BodyLimit:
    """Collects a body's chunks, refusing it once it passes ``max_bytes`` (never held whole)."""

    def __init__(self, max_bytes: int, url: str) -> None:
        self.max_bytes, self.url = max_bytes, url
        self.size = 0
        self.chunks: list[bytes] = []

    @classmethod
    def of(cls, resp: httpx.Response, url: str, max_bytes: int) -> BodyLimit:
        """A limit for ``resp``'s body, once its status says there is a body to read."""
        if resp.status_code // 100 != 2:
            hint = f": {metrics_url_hint(url)}" if resp.status_code == 404 else ""
            raise ScrapeError(f"HTTP {resp.status_code} from {url}{hint}", reason="http_status")
        return cls(max_bytes, url)

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise ScrapeError(
                f"body larger than {self.max_bytes} bytes from {self.url}", reason="too_large"
            )
        self.chunks.append(chunk)

    def body(self) -> bytes:
        return b"".join(self.chunks)


def scrape_error(exc: httpx.HTTPError, url: str, timeout: float) -> ScrapeError:
    """A transport error as a ``ScrapeError`` with its reason."""
    if isinstance(exc, httpx.TimeoutException):
        return ScrapeError(f"timed out after {timeout:g} s: {url}", reason="timeout")
    reason = "connect" if isinstance(exc, httpx.ConnectError) else "http_error"
    return ScrapeError(f"{type(exc).__name__}: {exc} ({url})", reason=reason)


def fetch(
    client: httpx.Client,
    url: str,
    *,
    timeout: float,
    max_body_bytes: int,
    headers: dict[str, str] | None = None,
) -> bytes:
    """GET one /metrics body, refusing bodies over ``max_body_bytes`` without reading them whole."""
    try:
        with client.stream("GET", url, headers=request_headers(headers), timeout=timeout) as resp:
            limit = BodyLimit.of(resp, url, max_body_bytes)
            for chunk in resp.iter_bytes():
                limit.add(chunk)
            return limit.body()
    except httpx.HTTPError as exc:
        raise scrape_error(exc, url, timeout) from exc


async def fetch_async(
    client: httpx.AsyncClient,
    url: str,
    *,
    timeout: float,
    max_body_bytes: int,
    headers: dict[str, str] | None = None,
) -> bytes:
    try:
        async with asyncio.timeout(timeout):
            async with client.stream(
                "GET", url, headers=request_headers(headers), timeout=timeout
            ) as resp:
                limit = BodyLimit.of(resp, url, max_body_bytes)
                async for chunk in resp.aiter_bytes():
                    limit.add(chunk)
                return limit.body()
    except TimeoutError as exc:
        raise ScrapeError(f"timed out after {timeout:g} s: {url}", reason="timeout") from exc
    except httpx.HTTPError as exc:
        raise scrape_error(exc, url, timeout) from exc
