"""Recording a target: one file per scrape, the raw body, named ``<unix_time_ms>.prom``.

The body is written as received (not re-rendered), so a replay sees exactly what vLLM
sent, quirks included. Each file is written under a temporary name and renamed, so a
replay running beside a recording never reads half a file. A failed scrape writes no
file and is logged; the recording goes on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import structlog

from daemon.errors import ParseError, ScrapeError
from daemon.parse import SnapshotParser

#: vLLM serves the classic text format; prometheus_client's OpenMetrics output would
#: garble names with colons, so ask for 0.0.4 explicitly.
ACCEPT = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024

log = structlog.get_logger("vllm_triage.record")


def check_status(resp: httpx.Response, url: str) -> None:
    if resp.status_code // 100 != 2:
        raise ScrapeError(f"HTTP {resp.status_code} from {url}", reason="http_status")


class BodyLimit:
    """Collects a body's chunks, refusing it once it passes ``max_bytes`` (never held whole)."""

    def __init__(self, max_bytes: int, url: str) -> None:
        self.max_bytes, self.url = max_bytes, url
        self.size = 0
        self.chunks: list[bytes] = []

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
        with client.stream(
            "GET", url, headers={"Accept": ACCEPT, **(headers or {})}, timeout=timeout
        ) as resp:
            check_status(resp, url)
            limit = BodyLimit(max_body_bytes, url)
            for chunk in resp.iter_bytes():
                limit.add(chunk)
            return limit.body()
    except httpx.HTTPError as exc:
        raise scrape_error(exc, url, timeout) from exc


def write_atomically(directory: Path, at_ms: int, body: bytes) -> Path:
    final = directory / f"{at_ms}.prom"
    tmp = directory / f".{at_ms}.prom.tmp"
    tmp.write_bytes(body)
    os.replace(tmp, final)
    return final


@dataclass(slots=True)
class RecordStats:
    scrapes: int = 0
    written: int = 0
    failed: int = 0
    unparseable: int = 0


def record(
    url: str,
    out: str | Path,
    *,
    interval: float = 5.0,
    duration: float | None = None,
    timeout: float | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    client: httpx.Client | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> RecordStats:
    """Scrape ``url`` every ``interval`` seconds into ``out`` until ``duration`` has passed.

    With no duration it runs until interrupted (Ctrl-C), which ends it cleanly. Scrapes are
    paced from the start time, not from the end of the previous scrape, so a slow target
    does not stretch the interval; a scrape that overruns skips the missed ticks.
    """
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    scrape_timeout = timeout if timeout is not None else max(min(interval, 10.0), 0.1)
    own_client = client is None
    http = client or httpx.Client(follow_redirects=True)
    parser = SnapshotParser()
    stats = RecordStats()
    start = clock()
    next_tick = start
    try:
        while duration is None or clock() - start < duration:
            now = clock()
            if now < next_tick:
                sleep(next_tick - now)
                continue
            at = clock()
            stats.scrapes += 1
            try:
                body = fetch(http, url, timeout=scrape_timeout, max_body_bytes=max_body_bytes)
            except ScrapeError as exc:
                stats.failed += 1
                log.warning("scrape_failed", url=url, err=str(exc))
            else:
                at_ms = int(at * 1000)
                path = write_atomically(directory, at_ms, body)
                stats.written += 1
                try:
                    parser.parse_bytes(body, at)
                except ParseError as exc:
                    # Kept anyway: the recording is the raw truth, replay reports it too.
                    stats.unparseable += 1
                    log.warning("recorded_unparseable", path=str(path), err=str(exc))
            # Skip ticks that a slow scrape overran rather than firing them back to back.
            next_tick += interval
            behind = clock() - next_tick
            if behind > 0:
                next_tick += interval * (int(behind // interval) + 1)
    except KeyboardInterrupt:
        log.info("record_interrupted")
    finally:
        if own_client:
            http.close()
    log.info(
        "record_done",
        out=str(directory),
        scrapes=stats.scrapes,
        written=stats.written,
        failed=stats.failed,
        unparseable=stats.unparseable,
    )
    return stats
