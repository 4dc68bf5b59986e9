"""Recording a target: one file per scrape, the raw body, named ``<unix_time_ms>.prom``.

The body is written as received (not re-rendered), so a replay sees exactly what vLLM
sent, quirks included (the format is ``vllm_triage.recording.files``). A failed scrape writes no
file and is logged; the recording goes on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from vllm_triage.core.parse import SnapshotParser
from vllm_triage.errors import ParseError, ScrapeError
from vllm_triage.net.fetch import DEFAULT_MAX_BODY_BYTES, BlockingFetcher, not_metrics_hint
from vllm_triage.net.redact import safe_url
from vllm_triage.recording.files import write_scrape
from vllm_triage.rules import runtime_table

log = structlog.get_logger("vllm_triage.record")


@dataclass(slots=True)
class RecordStats:
    scrapes: int = 0
    written: int = 0
    failed: int = 0
    unparseable: int = 0
    #: The latest failed scrape or unreadable body, said as a user reads it (with a hint).
    last_error: str = ""


def record(
    url: str,
    out: str | Path,
    *,
    interval: float = 5.0,
    duration: float | None = None,
    timeout: float | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    client: BlockingFetcher | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    runtime: str | None = None,
) -> RecordStats:
    """Scrape ``url`` every ``interval`` seconds into ``out`` until ``duration`` has passed.
    ``runtime``: the serving engine the bodies must be (default: any one vllm-triage reads).

    A first scrape that cannot connect, or that the server refuses as a client error (a
    404: the wrong path; a 401 or 403: credentials), raises its ``ScrapeError`` at once
    (and removes ``out`` if this call created it): a wrong URL is said in a second, not
    after the whole duration.

    With no duration it runs until interrupted (Ctrl-C), which ends it cleanly. Scrapes are
    paced from the start time, not from the end of the previous scrape, so a slow target
    does not stretch the interval; a scrape that overruns skips the missed ticks.
    """
    directory = Path(out)
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    scrape_timeout = timeout if timeout is not None else max(min(interval, 10.0), 0.1)
    own_client = client is None
    http = client or BlockingFetcher()
    parser = SnapshotParser(runtime_table(), named=runtime)
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
                body = http.fetch(url, timeout=scrape_timeout, max_body_bytes=max_body_bytes)
            except ScrapeError as exc:
                if stats.scrapes == 1 and wrong_url(exc):
                    # Nothing listens there (or not in that language): waiting out the
                    # duration would only write nothing. A target that dies later is
                    # recorded as failures, below: that is what a recording is for.
                    if created:
                        _remove_if_empty(directory)
                    raise
                stats.failed += 1
                stats.last_error = str(exc)
                log.warning("scrape_failed", url=safe_url(url), err=str(exc))
            else:
                at_ms = int(at * 1000)
                path = write_scrape(directory, at_ms, body)
                stats.written += 1
                try:
                    parser.parse_bytes(body, at)
                except ParseError as exc:
                    # Kept anyway: the recording is the raw truth, replay reports it too.
                    stats.unparseable += 1
                    stats.last_error = not_metrics_hint(url, exc)
                    log.warning("recorded_unparseable", path=str(path), err=stats.last_error)
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


def wrong_url(exc: ScrapeError) -> bool:
    """A failure no later scrape will mend: nothing listens there, or the server refuses
    the request itself (4xx; not 408 or 429, which ask to come back later)."""
    if exc.reason == "connect":
        return True
    status = exc.status or 0
    return exc.reason == "http_status" and 400 <= status < 500 and status not in (408, 429)


def _remove_if_empty(directory: Path) -> None:
    # Not empty, or not ours to remove: then it is left as it is.
    with contextlib.suppress(OSError):
        directory.rmdir()
