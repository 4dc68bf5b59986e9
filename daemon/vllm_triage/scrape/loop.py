"""One target's scrape loop: fetch its /metrics, read it, hand the snapshot to its ``Target``.

The scheduler calls ``scrape`` once per tick; everything that can go wrong with a
target's answer (refused, slow, 500, garbage, too big) ends in ``Target.failed`` as a
counted, logged failure and the next tick tries again. The body is read a step at a time
on the event loop (``core.drive.Reader``), letting the other targets' scrapes and the
deliveries run between steps (a one-model vLLM body, about 600 lines, is one step).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx
import structlog

from vllm_triage.core.drive import Reader, Unusable
from vllm_triage.core.model import Snapshot
from vllm_triage.core.parse import ParseLimits
from vllm_triage.errors import ScrapeError
from vllm_triage.logs import Throttle
from vllm_triage.net.fetch import fetch_async, not_metrics_hint
from vllm_triage.rules import runtime_table
from vllm_triage.scrape.keep import ScrapeKeeper
from vllm_triage.scrape.probe import Prober
from vllm_triage.target import Target

log = structlog.get_logger("vllm_triage.watcher")


@dataclass(frozen=True, slots=True)
class ScrapeParts:
    """What the assembly builds for one scraped target, besides the ``Target`` itself."""

    url: str
    headers: Mapping[str, str]
    timeout: float
    max_body_bytes: int
    limits: ParseLimits
    #: The serving engine the target's settings name (None: detected from each scrape).
    runtime: str | None = None


class Scraper:
    def __init__(
        self,
        target: Target,
        parts: ScrapeParts,
        *,
        client: httpx.AsyncClient,
        prober: Prober | None = None,
        keeper: ScrapeKeeper | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.parts = parts
        #: The daemon's own recording of this target (``run --record``), when asked for.
        self.keeper = keeper
        if keeper is not None:
            target.state.recording = keeper.stats
        #: The target's active probe, when its settings enable one (``scrape.probe``).
        self.prober = prober
        self.in_flight = False
        self.reader = Reader(runtime_table(), parts.limits, named=parts.runtime)
        self._client = client
        self._clock = clock
        self._dropped = Throttle()
        if prober is not None:
            target.state.probe = prober.stats

    @property
    def name(self) -> str:
        return self.target.name

    async def close(self) -> None:
        await self._client.aclose()

    async def scrape(self) -> None:
        """One tick: never raises for anything the target did."""
        self.in_flight = True
        target = self.target
        at = self._clock()
        if self.keeper is not None:
            # Judged at the time the file's name keeps, so a replay sees this very scrape.
            at = self.keeper.file_time(at)
        started = time.monotonic()
        try:
            body = await fetch_async(
                self._client,
                self.parts.url,
                timeout=self.parts.timeout,
                max_body_bytes=self.parts.max_body_bytes,
                headers=dict(self.parts.headers),
            )
            if self.keeper is not None:
                # Kept before it is read: the raw truth, an unreadable body included, as
                # `record` keeps it. In a thread: a slow disk delays this target only.
                await asyncio.to_thread(self.keeper.keep, at, body)
            read = await self._read(body, at)
        except ScrapeError as exc:
            target.failed(exc.reason, str(exc))
            return
        except Exception as exc:  # whatever a peer's bytes set off (errors.py)
            # This target's failure, counted and logged once; never the scheduler's
            # traceback with the target frozen at its last view.
            target.unjudgeable(exc)
            return
        except asyncio.CancelledError:
            # Only shutdown cancels a scrape (a timeout arrives as ScrapeError): one that
            # started as the scheduler stopped is not the target's fault, and letting the
            # cancellation out would make the scheduler log it as a crash.
            log.debug("scrape_cancelled", target=target.name)
            return
        finally:
            target.state.attempted(at, time.monotonic() - started)
            self.in_flight = False
        if isinstance(read, Unusable):
            if read.reason == "too_costly":
                message = f"refused: reading it would cost too much: {read.message}"
            else:
                message = not_metrics_hint(target.state.url, read.error)
            target.failed(read.reason, message)
            return
        if self.reader.parser.models_dropped:
            self._log_dropped(len(read.models))
        target.consume(read, self.prober.status() if self.prober is not None else None)

    async def _read(self, body: bytes, at: float) -> Snapshot | Unusable:
        steps = self.reader.parse_steps(body, at, keep=self.target.known_models())
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result: Snapshot | Unusable = done.value
                return result
            await asyncio.sleep(0)

    def _log_dropped(self, kept: int) -> None:
        """The parser read at most ``max_models_per_target`` models (the ones already
        watched first, then the others in the order the target lists them); what it left
        out is counted and logged (once a minute at most), never silently lost."""
        parser = self.reader.parser
        dropped = parser.models_dropped
        self.target.state.models_dropped += dropped
        self._dropped.warn(
            log,
            "models_dropped",
            count=None,
            target=self.target.name,
            exposed=kept + dropped,
            kept=kept,
            dropped=dropped,
            first_dropped=parser.first_dropped[:80],
        )
