"""``vllm-triage run``: the daemon. Wires the watchers, the notifier, the scheduler and the
HTTP endpoint together, and takes them down in order.

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

State (``state_dir``, ``daemon/store.py``): opened in the constructor, before anything
runs. The watchers restore their targets' incidents, the notifier its active alerts, its
log and each receiver's undelivered notifications; the first evaluations then carry on
as if the daemon had never stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import ssl
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import structlog
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from vllm_triage import __version__
from vllm_triage.config.schema import Settings
from vllm_triage.fleet.source import PrometheusSource
from vllm_triage.notify.notifier import Notifier
from vllm_triage.serve.exporter import build_registry
from vllm_triage.serve.listener import HttpServer
from vllm_triage.serve.pagedata import live_document
from vllm_triage.serve.routes import Endpoints
from vllm_triage.state import TargetState
from vllm_triage.store import StateStore
from vllm_triage.watcher import TargetWatcher

log = structlog.get_logger("vllm_triage.service")

#: How often the notifier looks for repeats and Alertmanager re-sends.
NOTIFIER_TICK_S = 1.0


def external_url(settings: Settings, address: tuple[str, int]) -> str:
    if settings.alerting.external_url:
        return settings.alerting.external_url.rstrip("/")
    host, port = address
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"http://{host}:{port}"


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
    # APScheduler reads ``next_run_time=None`` as "paused": pass it only when given.
    start: dict[str, datetime] = {} if first is None else {"next_run_time": first}
    scheduler.add_job(
        func,
        "interval",
        seconds=seconds,
        id=job_id,
        max_instances=1,
        coalesce=True,
        misfire_grace_time=max(1, int(seconds)),
        **start,
    )


class Daemon:
    """Everything is built (and the port bound) in the constructor, so a bad setting or a
    port in use fails before anything runs; ``run`` then serves until stopped."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        default_state_dir: Path | None = None,
    ) -> None:
        """``default_state_dir``: what ``state_dir: auto`` means here (``run`` passes the
        XDG state directory; an in-process daemon, as the demo's, keeps nothing)."""
        self.settings = settings
        self.clock = clock
        self.ready = False
        # Receivers and the fleet's query API share one client. Each scraped target gets
        # a client of its own, with one kept-alive connection: in one shared pool every
        # request scans every idle connection, which made 500 targets cost a core
        # (bench/bench_daemon.py). The TLS context is built once and shared.
        self._tls = ssl.create_default_context()
        self._client = httpx.AsyncClient(follow_redirects=False, verify=self._tls)
        endpoints = Endpoints(
            build_registry(self.target_states, lambda: self.notifier.deliveries),
            self.target_states,
            lambda: self.ready,
            clock,
            series=lambda now: live_document(self.target_states(), now=now, settings=settings),
        )
        self.http = HttpServer(settings.listen, endpoints)
        state_dir = settings.state_path(default_state_dir)
        self.store = StateStore.open(state_dir) if state_dir is not None else None
        store = self.store
        self.notifier = Notifier(
            settings, self._client, external_url(settings, self.address), store
        )
        self.watchers = [
            TargetWatcher(
                t,
                settings,
                client=self._target_client(),
                notifier=self.notifier,
                clock=clock,
                store=store,
            )
            for t in settings.targets
        ]
        self.fleet: PrometheusSource | None = None
        if settings.source == "prometheus":
            self.fleet = PrometheusSource(
                settings, client=self._client, notifier=self.notifier, clock=clock, store=store
            )
        elif store is not None:
            # Targets no longer configured: nothing will evaluate them again. (In fleet
            # mode servers are discovered as they appear, so theirs wait in the store.)
            with store.batch():
                for name in sorted(store.restored.incidents):
                    log.warning("incidents_target_gone", target=name)
                    store.save_incidents(name, ())
                store.restored.incidents.clear()
                self.notifier.resolve_gone({t.name for t in settings.targets}, clock())

    def _target_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            follow_redirects=False,
            verify=self._tls,
            limits=httpx.Limits(max_connections=2, max_keepalive_connections=1),
        )

    def target_states(self) -> list[TargetState]:
        """Every target's state now (in fleet mode the list grows as servers appear)."""
        if self.fleet is not None:
            return self.fleet.states()
        return [w.state for w in self.watchers]

    @property
    def address(self) -> tuple[str, int]:
        return self.http.address

    @property
    def url(self) -> str:
        host, port = self.address
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{host}:{port}"

    def _on_skipped(self, event: JobEvent) -> None:
        watchers = list(self.watchers) + ([self.fleet.api] if self.fleet is not None else [])
        for w in watchers:
            if event.job_id == f"scrape:{w.state.name}":
                w.state.skipped_ticks += 1
                log.warning("scrape_skipped", target=w.state.name, why="previous still running")

    async def run(self, stop: asyncio.Event | None = None, *, handle_signals: bool = False) -> None:
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        s = self.settings
        workers = [
            asyncio.create_task(d.run(), name=f"deliver:{d.name}") for d in self.notifier.deliveries
        ]
        scheduler = AsyncIOScheduler(timezone=UTC, event_loop=loop)
        now = datetime.now(UTC)
        n = max(len(self.watchers), 1)
        for i, w in enumerate(self.watchers):
            _every(
                scheduler,
                w.scrape,
                s.interval_seconds,
                f"scrape:{w.state.name}",
                first=now + timedelta(seconds=s.interval_seconds * i / n),
            )
        probers = [w.prober for w in self.watchers if w.prober is not None]
        for i, p in enumerate(probers):
            # Spread like the scrapes; the first probe goes one interval after start,
            # once a scrape has said which model the server serves.
            _every(
                scheduler,
                p.run,
                p.settings.interval_seconds,
                f"probe:{p.target}",
                first=now + timedelta(seconds=p.settings.interval_seconds * (1 + i / len(probers))),
            )
        if self.fleet is not None:
            _every(scheduler, self.fleet.tick, s.interval_seconds, "scrape:prometheus", first=now)
        _every(scheduler, lambda: self.notifier.tick(self.clock()), NOTIFIER_TICK_S, "notifier")
        scheduler.add_listener(self._on_skipped, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        self.http.start()
        scheduler.start()
        self.ready = True
        log.info(
            "started",
            version=__version__,
            listen=f"{self.address[0]}:{self.address[1]}",
            targets=[w.state.name for w in self.watchers],
            source=s.source,
            receivers=[d.name for d in self.notifier.deliveries],
            interval_s=s.interval_seconds,
        )
        try:
            await stop.wait()
        finally:
            await self._shutdown(scheduler, workers)

    async def _shutdown(
        self, scheduler: AsyncIOScheduler, workers: list[asyncio.Task[None]]
    ) -> None:
        began = time.monotonic()
        deadline = began + self.settings.shutdown_grace_seconds
        self.ready = False
        log.info("stopping", grace_s=self.settings.shutdown_grace_seconds)
        scheduler.shutdown(wait=False)
        for w in self.watchers:
            if w.prober is not None:
                w.prober.cancel()  # nobody waits for a probe's answer at shutdown
        # Let scrapes the scheduler had just submitted start, so they are waited for
        # below rather than cancelled unstarted (which the scheduler logs as a crash).
        for _ in range(3):
            await asyncio.sleep(0)

        def busy() -> bool:
            fleet = self.fleet is not None and self.fleet.in_flight
            return fleet or any(w.in_flight for w in self.watchers)

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
        await asyncio.gather(
            self._client.aclose(), *(w.close() for w in self.watchers), return_exceptions=True
        )
        self.http.stop()
        if self.store is not None:
            self.store.close()
        log.info(
            "stopped",
            took_s=round(time.monotonic() - began, 2),
            undelivered=lost,
            kept_for_next_start=kept,
        )
