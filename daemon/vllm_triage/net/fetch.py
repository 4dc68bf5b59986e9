"""Fetching a target's /metrics: ``fetch_async`` for the daemon's event loop, and
``BlockingFetcher`` for the blocking commands (``record``, ``check``), which runs the same
coroutine on a loop of its own. The answer is read as every answer is (``net.bounded``:
streamed, capped, one layer of compression at most, bounded in time as a whole).

Redirects: followed only within the target's own origin (scheme, host and port), at most
``MAX_REDIRECTS`` times: ``/metrics`` -> ``/metrics/`` is common (an ASGI mount), and it
keeps the target's ``headers``, bearer token and basic auth with the server they were
configured for. A redirect to another origin is a failed scrape (``reason="redirect"``)
whose message names where it points, so the URL can be configured if it is right; that
server's data is never diagnosed as the target's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from vllm_triage.errors import ParseError, ScrapeError
from vllm_triage.net.bounded import Answer, request
from vllm_triage.net.redact import safe_url

#: vLLM serves the classic text format; prometheus_client's OpenMetrics output would
#: garble names with colons, so ask for 0.0.4 explicitly.
ACCEPT = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
#: Same-origin redirects followed per scrape.
MAX_REDIRECTS = 3


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


def request_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {"Accept": ACCEPT, "Accept-Encoding": "identity", **(headers or {})}


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def redirect_to(resp: Answer, current: str, configured: str) -> str | None:
    """Where a same-origin redirect leads; ``None`` when ``resp`` is not a redirect.
    A redirect elsewhere is a ``ScrapeError``."""
    if not resp.is_redirect:
        return None
    try:
        nxt = urljoin(current, resp.headers["Location"])
        elsewhere = origin(nxt) != origin(configured)
    except ValueError as exc:
        raise ScrapeError(
            f"HTTP {resp.status} from {safe_url(configured)} with an unusable Location",
            reason="redirect",
        ) from exc
    if elsewhere:
        raise ScrapeError(
            f"HTTP {resp.status} from {safe_url(configured)} redirects to another origin, "
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


def _status_error(resp: Answer, url: str) -> ScrapeError:
    hint = f": {metrics_url_hint(url)}" if resp.status == 404 else ""
    return ScrapeError(
        f"HTTP {resp.status} from {safe_url(url)}{hint}", reason="http_status", status=resp.status
    )


async def fetch_async(
    client: httpx.AsyncClient,
    url: str,
    *,
    timeout: float,
    max_body_bytes: int,
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """GET one /metrics body (``ScrapeError`` when there is none to read); the whole
    scrape, redirects included, takes at most ``timeout``."""
    current = url
    try:
        async with asyncio.timeout(timeout):
            for _ in range(MAX_REDIRECTS + 1):
                answer = await request(
                    client,
                    "GET",
                    current,
                    timeout=timeout,
                    max_bytes=max_body_bytes,
                    headers=request_headers(headers),
                    shown=safe_url(url),
                )
                nxt = redirect_to(answer, current, url)
                if nxt is None:
                    if not answer.ok:
                        raise _status_error(answer, url)
                    return answer.body
                current = nxt
    except TimeoutError as exc:
        raise ScrapeError(
            f"timed out after {timeout:g} s: {safe_url(url)}", reason="timeout"
        ) from exc
    raise _too_many(url)


class BlockingFetcher:
    """``fetch_async`` for a blocking command: an event loop and a client of its own, kept
    for the command's life (one kept-alive connection to the target)."""

    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = client or httpx.AsyncClient(follow_redirects=False)

    def fetch(
        self,
        url: str,
        *,
        timeout: float,
        max_body_bytes: int,
        headers: Mapping[str, str] | None = None,
    ) -> bytes:
        return self._loop.run_until_complete(
            fetch_async(
                self._client, url, timeout=timeout, max_body_bytes=max_body_bytes, headers=headers
            )
        )

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._client.aclose())
            self._loop.close()

    def __enter__(self) -> BlockingFetcher:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
