"""``vllm-triage run``: the daemon. Runs the parts the assembly built (``assemble.build_daemon``:
the scrape loops, the fleet source, the notifier, the HTTP endpoint) on one scheduler, and
takes them down in order.

Scheduling is APScheduler 3's ``AsyncIOScheduler``, one interval job per target with
``max_instances=1`` (a scrape never overlaps the previous one of its target; the tick
that would have is skipped and counted) and ``coalesce`` (a late loop runs one catch-up
scrape, not a burst). First runs are spread over one interval, so a hundred targets do
not all fire in the same millisecond. A slow target costs only its own job: each scrape
is an awaited HTTP request with a timeout, so others run meanwhile.

Shutdown (SIGTERM, SIGINT, or ``stop`` set): not ready; no new scrapes; scrapes in flight
finish (each bounded by its timeout); pending notifications are delivered until
``shutdown_grace_seconds`` have passed since the signal; whatever is still undelivered
then is counted as failed and logged, never dropped silently; with a state store it is
kept there and delivered at the next start.

State (``state_dir``, ``daemon/vllm_triage/store.py``): opened by the build, before anything
runs. The targets restore their incidents, the notifier its active alerts, its
log and each receiver's undelivered notifications; the first evaluations then carry on
as if the daemon had never stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import structlog
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.util import undefined

from vllm_triage import __version__
from vllm_triage.fleet.source import PrometheusSource
from vllm_triage.notify.notifier import Notifier
from vllm_triage.scrape.loop import Scraper
from vllm_triage.serve.listener import HttpServer
from vllm_triage.state import TargetState
from vllm_triage.store import StateStore
from vllm_triage.target import Target

log = structlog.get_logger("vllm_triage.service")

#: How often the notifier looks for repeats and Alertmanager re-sends.
NOTIFIER_TICK_S = 1.0


def _every(
    scheduler: AsyncIOScheduler,
    func: Callable[[], object],
    seconds: float,
    job_id: str,
    *,
    first: datetime | None = None,
) -> None:
    """One interval job, with the options every job here shares, written out even where
    they equal APScheduler's defaults: never two runs of one job at once (the tick that
    would overlap is skipped and counted), one catch-up run after a late loop rather
    than a burst, and a missed tick forgiven for about one interval."""
    # APScheduler reads ``next_run_time=None`` as "paused": its own "not given" is
    # ``undefined`` (then the first run is one interval from now).
    scheduler.add_job(
        func,
        "interval",
        seconds=seconds,
        id=job_id,
        max_instances=1,
        coalesce=True,
        misfire_grace_time=max(1, int(seconds)),
        next_run_time=undefined if first is None else first,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class DaemonParts:
    """Everything the daemon runs, built by the assembly (``assemble.build_daemon``)."""

    http: HttpServer
    store: StateStore | None
    notifier: Notifier
    #: One per configured target (none in fleet mode).
    scrapers: list[Scraper]
    fleet: PrometheusSource | None
    #: The receivers' and the query API's client (each scraped target has its own).
    client: httpx.AsyncClient
    interval_seconds: float
    shutdown_grace_seconds: float
    source: str
    ready: Readiness
    #: What the build opened (the store, the listener): closed last at shutdown, in the
    #: reverse order of opening. The build hands it over once everything is built.
    opened: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)


class Readiness:
    """Whether the daemon serves: /readyz says it (read from the listener's thread)."""

    def __init__(self) -> None:
        self.ready = False

    def __call__(self) -> bool:
        return self.ready


class Daemon:
    """Everything is built (and the port bound) before the constructor, so a bad setting or
    a port in use fails before anything runs; ``run`` then serves until stopped."""

    def __init__(self, parts: DaemonParts, *, clock: Callable[[], float] = time.time) -> None:
        self.parts = parts
        self.clock = clock
        self.http = parts.http
        self.store = parts.store
        self.notifier = parts.notifier
        self.scrapers = parts.scrapers
        self.fleet = parts.fleet
        self._client = parts.client
        self._scheduler: AsyncIOScheduler | None = None

    @property
    def ready(self) -> bool:
        return self.parts.ready.ready

    @property
    def targets(self) -> list[Target]:
        """The configured targets (fleet mode's are ``fleet.targets``)."""
        return [s.target for s in self.scrapers]

    def target_states(self) -> list[TargetState]:
        """Every target's state now (in fleet mode the list grows as servers appear)."""
        if self.fleet is not None:
            return self.fleet.states()
        return [s.target.state for s in self.scrapers]

    @property
    def address(self) -> tuple[str, int]:
        return self.http.address

    @property
    def url(self) -> str:
        host, port = self.address
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{host}:{port}"

    def set_interval(self, seconds: float) -> None:
        """Scrape every ``seconds`` from now on, each target (and the fleet source), with
        the next scrape one new interval away; on the event loop's thread, while running.
        For a clock whose pace changed (the live demo slowing itself down on a busy host):
        a scrape still comes every so many of that clock's seconds."""
        if self._scheduler is None:
            raise RuntimeError("the daemon is not running")
        for job in self._scheduler.get_jobs():
            if job.id.startswith("scrape:"):
                job.modify(misfire_grace_time=max(1, int(seconds)))
                job.reschedule("interval", seconds=seconds)

    def _on_skipped(self, event: JobEvent) -> None:
        states = [s.target.state for s in self.scrapers]
        if self.fleet is not None:
            states.append(self.fleet.api.state)
        for st in states:
            if event.job_id == f"scrape:{st.name}":
                st.skipped_ticks += 1
                log.warning("scrape_skipped", target=st.name, why="previous still running")

    async def run(self, stop: asyncio.Event | None = None, *, handle_signals: bool = False) -> None:
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        p = self.parts
        workers = [
            asyncio.create_task(d.run(), name=f"deliver:{d.name}") for d in self.notifier.deliveries
        ]
        scheduler = self._scheduler = AsyncIOScheduler(timezone=UTC, event_loop=loop)
        now = datetime.now(UTC)
        n = max(len(self.scrapers), 1)
        for i, sc in enumerate(self.scrapers):
            _every(
                scheduler,
                sc.scrape,
                p.interval_seconds,
                f"scrape:{sc.name}",
                first=now + timedelta(seconds=p.interval_seconds * i / n),
            )
        probers = [sc.prober for sc in self.scrapers if sc.prober is not None]
        for i, pr in enumerate(probers):
            # Spread like the scrapes; the first probe goes one interval after start,
            # once a scrape has said which model the server serves.
            _every(
                scheduler,
                pr.run,
                pr.settings.interval_seconds,
                f"probe:{pr.target}",
                first=now
                + timedelta(seconds=pr.settings.interval_seconds * (1 + i / len(probers))),
            )
        if self.fleet is not None:
            _every(scheduler, self.fleet.tick, p.interval_seconds, "scrape:prometheus", first=now)
        _every(scheduler, lambda: self.notifier.tick(self.clock()), NOTIFIER_TICK_S, "notifier")
        scheduler.add_listener(self._on_skipped, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        self.http.start()
        scheduler.start()
        p.ready.ready = True
        log.info(
            "started",
            version=__version__,
            listen=f"{self.address[0]}:{self.address[1]}",
            targets=[sc.name for sc in self.scrapers],
            source=p.source,
            receivers=[d.name for d in self.notifier.deliveries],
            interval_s=p.interval_seconds,
        )
        if not self.notifier.deliveries:
            log.warning(
                "no_receivers",
                consequence="incidents are shown on the status page, /metrics and the API, "
                "and sent nowhere",
                hint="add a receiver (`receivers:` in the config, or --webhook URL)",
            )
        try:
            await stop.wait()
        finally:
            await self._shutdown(scheduler, workers)

    async def _shutdown(
        self, scheduler: AsyncIOScheduler, workers: list[asyncio.Task[None]]
    ) -> None:
        began = time.monotonic()
        grace = self.parts.shutdown_grace_seconds
        deadline = began + grace
        self.parts.ready.ready = False
        log.info("stopping", grace_s=grace)
        scheduler.shutdown(wait=False)
        for sc in self.scrapers:
            if sc.prober is not None:
                sc.prober.cancel()  # nobody waits for a probe's answer at shutdown
        # Let scrapes the scheduler had just submitted start, so they are waited for
        # below rather than cancelled unstarted (which the scheduler logs as a crash).
        for _ in range(3):
            await asyncio.sleep(0)

        def busy() -> bool:
            fleet = self.fleet is not None and self.fleet.in_flight
            return fleet or any(sc.in_flight for sc in self.scrapers)

        while busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        pending = sum(d.pending for d in self.notifier.deliveries)
        if pending:
            log.info("delivering_before_exit", pending=pending)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await asyncio.gather(*(d.wait_idle() for d in self.notifier.deliveries))
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        lost = sum(d.abandon("undelivered at shutdown") for d in self.notifier.deliveries)
        kept = sum(d.kept for d in self.notifier.deliveries)
        closing = [self._client.aclose(), *(sc.close() for sc in self.scrapers)]
        if self.fleet is not None:
            closing.append(self.fleet.close())
        await asyncio.gather(*closing, return_exceptions=True)
        self.parts.opened.close()
        log.info(
            "stopped",
            took_s=round(time.monotonic() - began, 2),
            undelivered=lost,
            kept_for_next_start=kept,
        )
