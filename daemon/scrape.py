"""Fetching a target's /metrics from the event loop (``record`` has the blocking twin).

The body is streamed and refused past ``max_body_bytes``, so a target that sends 50 MiB
costs at most the limit in memory. ``asyncio.timeout`` bounds the whole scrape, body
included: httpx's timeout is per read, and a target trickling bytes would outlast it.
"""

from __future__ import annotations

import asyncio

import httpx

from daemon.errors import ScrapeError
from daemon.record import ACCEPT, BodyLimit, check_status, scrape_error


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
                "GET", url, headers={"Accept": ACCEPT, **(headers or {})}, timeout=timeout
            ) as resp:
                check_status(resp, url)
                limit = BodyLimit(max_body_bytes, url)
                async for chunk in resp.aiter_bytes():
                    limit.add(chunk)
                return limit.body()
    except TimeoutError as exc:
        raise ScrapeError(f"timed out after {timeout:g} s: {url}", reason="timeout") from exc
    except httpx.HTTPError as exc:
        raise scrape_error(exc, url, timeout) from exc
