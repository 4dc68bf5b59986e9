"""Delivering notifications to one receiver: in order, retried, never dropped silently.

Each receiver has its own queue and one worker task, so a dead receiver delays only its
own notifications (never a scrape, never another receiver), and what it receives arrives
in the order it happened: a ``resolved`` never overtakes its ``firing``.

A delivery that fails for a reason that may pass (connection refused, a timeout, HTTP
5xx, 408, 429) is retried with exponential backoff and jitter by tenacity, honouring
``Retry-After`` (up to ``retry_max_seconds``, so one header cannot stall the queue),
for ``retry_for_seconds``; then it is counted in ``failed`` and logged
with what was lost. A 4xx other than 408/429 will not pass by retrying (a bad token, a
payload the receiver refuses) and fails at once, loudly. A full queue drops its oldest
notification, counted in ``dropped`` and logged.

With a state store (``daemon/vllm_triage/store.py``) every queued notification is also written to it
and removed once delivered, given up or dropped: after a kill, the next start delivers
what was pending (``restore``), and at shutdown what the grace period left is kept for
the next start rather than lost.

What a receiver may cost: one attempt (connect, send, status, and at most
``RESPONSE_READ_BYTES`` of the answer, never decoded: only the status counts) is bounded
by ``timeout_seconds`` as a whole, so an endless or trickling answer cannot hold the
queue or grow the daemon. A 3xx is a failed delivery, not followed and not retried: a
POST redirected becomes a bodiless GET in most clients, and the signature and
credentials belong to the configured URL only; the log line says where it points, so
that URL can be configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from vllm_triage.config.auth import auth_headers
from vllm_triage.errors import ScrapeError
from vllm_triage.net.bounded import Answer, request
from vllm_triage.net.redact import masked_location, scrub
from vllm_triage.notify.receivers import Receiver
from vllm_triage.state import ReceiverStats
from vllm_triage.store import Notification, StateStore

log = structlog.get_logger("vllm_triage.delivery")

#: Statuses worth retrying: the receiver may be restarting or shedding load.
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: Of a receiver's answer, at most this much is read (and dropped) before closing.
RESPONSE_READ_BYTES = 64 * 1024


class RetryableError(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(Exception):
    pass


def signature(secret: bytes, body: bytes) -> str:
    """The signature header's value: ``sha256=`` and the hex HMAC-SHA256 of the body."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def _retry_after(resp: Answer) -> float | None:
    value = resp.headers.get("Retry-After", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: rare from webhook receivers; back off as usual


#: Notifications a line about many of them names (the rest are counted).
_NAMED = 5


def _first(notes: list[Notification]) -> list[str]:
    return [n.what for n in notes[:_NAMED]] + (
        [f"and {len(notes) - _NAMED} more"] if len(notes) > _NAMED else []
    )


class Delivery:
    """The queue and worker of one receiver.

    ``clock`` (monotonic seconds) and ``sleep`` time the retries: how long a notification
    has been tried, and the wait before the next attempt. Tests hand in a fake pair, so
    that the retry schedule is checked exactly, whatever the machine's speed.
    """

    def __init__(
        self,
        receiver: Receiver,
        client: httpx.AsyncClient,
        store: StateStore | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.receiver = receiver
        self._clock = clock
        self._sleep = sleep
        self.name = receiver.name
        self.settings = settings = receiver.settings
        self.stats = ReceiverStats()
        #: Notifications dropped since the queue last had room (``_append``).
        self._dropping = 0
        self._client = client
        self._url = receiver.url
        self._headers = {
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
            **auth_headers(settings),
        }
        self._secret = (
            settings.hmac_secret.get_secret_value().encode() if settings.hmac_secret else None
        )
        self._store = store
        self._queue: deque[Notification] = deque()
        #: The store's row of each queued notification (None when nothing is stored),
        #: and of the one being tried: removed only once it is delivered or given up.
        self._rows: deque[int | None] = deque()
        self._trying: int | None = None
        self._current: Notification | None = None
        #: Undelivered at shutdown but kept in the store for the next start.
        self.kept = 0
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._busy = False
        # Jitter up to one initial step spreads the retries of many daemons after a
        # receiver outage, without stretching a short backoff by tenacity's default 1 s.
        self._wait = wait_exponential_jitter(
            multiplier=settings.retry_initial_seconds,
            jitter=settings.retry_initial_seconds,
            max=settings.retry_max_seconds,
        )

    @property
    def pending(self) -> int:
        """Notifications not yet delivered (queued, plus the one being tried)."""
        return len(self._queue) + self._busy

    def submit(self, n: Notification) -> None:
        row = self._store.enqueue(self.name, n) if self._store is not None else None
        self._append(row, n)

    def restore(self, kept: list[tuple[int, Notification]]) -> None:
        """Queue what a previous run left undelivered (before anything new), in order.
        Beyond ``queue_size`` the oldest are dropped as a full queue drops them: counted,
        and said in one line however many they are."""
        over = max(0, len(kept) - self.settings.queue_size)
        if over:
            dropped, kept = kept[:over], kept[over:]
            store = self._store
            with store.batch() if store is not None else contextlib.nullcontext():
                for row, _ in dropped:
                    self._forget(row)
            self.stats.dropped += over
            log.error(
                "notifications_dropped",
                receiver=self.name,
                count=over,
                first=dropped[0][1].what,
                last=dropped[-1][1].what,
                why=f"more undelivered than queue_size ({self.settings.queue_size}) at start",
            )
        for row, n in kept:
            self._append(row, n)
        if kept:
            log.info("notifications_restored", receiver=self.name, count=len(kept))

    def _append(self, row: int | None, n: Notification) -> None:
        size = self.settings.queue_size
        if len(self._queue) >= size:
            lost = self._queue.popleft()
            self._forget(self._rows.popleft())
            self.stats.dropped += 1
            # Said at the first drop, then once per queue_size more (not once each: a
            # fleet firing 2,000 alerts at once into a queue of 1,000 made 1,000 lines).
            self._dropping += 1
            if self._dropping % size == 1 or size == 1:
                log.error(
                    "notification_dropped",
                    receiver=self.name,
                    what=lost.what,
                    dropped_in_a_row=self._dropping,
                    why="queue full",
                )
        else:
            self._dropping = 0
        self._queue.append(n)
        self._rows.append(row)
        self._idle.clear()
        self._ready.set()

    def _forget(self, row: int | None) -> None:
        if self._store is not None:
            self._store.remove(row)

    async def run(self) -> None:
        """The worker: deliver the queue, oldest first, for ever (cancel to stop)."""
        while True:
            if not self._queue:
                self._busy = False
                self._idle.set()
                self._ready.clear()
                await self._ready.wait()
                continue
            n = self._queue.popleft()
            self._trying = self._rows.popleft()
            self._current = n
            self._busy = True
            # Its row stays in the store while it is tried: a shutdown or a kill in the
            # middle leaves it for the next start.
            await self._deliver(n)
            self._forget(self._trying)
            self._trying = self._current = None

    def resync(self, store: StateStore) -> None:
        """The store came back empty after a failing disk: keep what is pending again,
        the one being tried first, each under its new row."""
        if self._current is not None:
            self._trying = store.enqueue(self.name, self._current)
        self._rows = deque(store.enqueue(self.name, n) for n in self._queue)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def abandon(self, why: str) -> int:
        """At shutdown, everything still undelivered: kept for the next start when a
        working store holds it (counted in ``kept``), else counted and logged as failed;
        how many failed."""
        left = list(self._queue) + ([Notification(b"", "in flight")] if self._busy else [])
        self._queue.clear()
        self._rows.clear()
        if not left:
            return 0
        # One line per receiver, however long its queue (a thousand lines at shutdown
        # said nothing more than one): how many, and the first few.
        said = {"receiver": self.name, "count": len(left), "what": _first(left)}
        if self._store is not None and self._store.durable:
            self.kept = len(left)
            log.warning("notification_kept", **said, why=why)
            return 0
        self.stats.failed += len(left)
        log.error("notification_failed", **said, err=why)
        return len(left)

    def _wait_for(self, state: RetryCallState) -> float:
        backoff = float(self._wait(state))
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, RetryableError) and exc.retry_after is not None:
            return max(backoff, min(exc.retry_after, self.settings.retry_max_seconds))
        return backoff

    def _before_sleep(self, state: RetryCallState) -> None:
        self.stats.retried += 1
        exc = state.outcome.exception() if state.outcome else None
        self.stats.last_error = str(exc)
        log.warning(
            "notification_retry",
            receiver=self.name,
            attempt=state.attempt_number,
            err=str(exc),
            next_in_s=round(state.upcoming_sleep, 2),
        )

    async def _deliver(self, n: Notification) -> None:
        started = self._clock()

        def given_up(state: RetryCallState) -> bool:
            # tenacity's stop_after_delay reads time.monotonic itself; this reads ours.
            return self._clock() - started >= self.settings.retry_for_seconds

        retrying = AsyncRetrying(
            stop=given_up,
            wait=self._wait_for,
            sleep=self._sleep,
            retry=retry_if_exception_type(RetryableError),
            before_sleep=self._before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await self._post(n)
        except (RetryableError, PermanentError) as exc:
            self.stats.failed += 1
            self.stats.last_error = str(exc)
            log.error(
                "notification_failed",
                receiver=self.name,
                what=n.what,
                err=str(exc),
                gave_up_after_s=round(self._clock() - started, 1),
            )
            return
        self.stats.sent += 1
        self.stats.last_success_at = time.time()
        log.info(
            "notification_sent",
            receiver=self.name,
            what=n.what,
            took_s=round(self._clock() - started, 3),
        )

    async def _post(self, n: Notification) -> None:
        headers: dict[str, Any] = dict(self._headers)
        if self._secret is not None:
            headers[self.settings.hmac_header] = signature(self._secret, n.body)
        url = self._url + n.path
        timeout = self.settings.timeout_seconds
        try:
            # The status decides; what follows is read only to let the connection be
            # reused, at most RESPONSE_READ_BYTES, never decoded, within the attempt's time.
            # The URL may hold a token (Slack's does): errors name it "<receiver url>".
            resp = await request(
                self._client,
                "POST",
                url,
                content=n.body,
                headers=headers,
                timeout=timeout,
                max_bytes=RESPONSE_READ_BYTES,
                overflow="truncate",
                decode=False,
                shown="<receiver url>",
            )
        except ScrapeError as exc:
            raise RetryableError(scrub(str(exc), [url, self._url])) from exc
        if resp.ok:
            return
        if resp.status in RETRYABLE_STATUS:
            raise RetryableError(f"HTTP {resp.status}", _retry_after(resp))
        if resp.status // 100 == 3:
            where = masked_location(resp.headers.get("Location", ""), url)
            raise PermanentError(
                f"HTTP {resp.status}: the receiver redirects to {where}; not followed "
                "(a redirected POST loses its body, and the signature and credentials go to "
                "the configured URL only), not retried: set this receiver's url to where "
                "it points (segments shown as *** are the configured URL's own)"
            )
        raise PermanentError(f"HTTP {resp.status}: the receiver refused it; not retried")
