"""Tests for daemon/vllm_triage/notify/delivery.py against a real HTTP receiver on 127.0.0.1.

``Receiver`` (support/receiver.py) records every request (path, headers, body, when) and
answers from a plan: a status (with headers), or a hang. It can be made before it serves,
its port held, to play a receiver that is down for a while.
Every test runs its own event loop with ``asyncio.run``. The retries wait on a fake
clock (``support.clock``): the schedule is checked exactly, and a busy machine slows
nothing but the requests themselves.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs
from tenacity import wait_fixed

from vllm_triage.config.schema import ReceiverSettings
from vllm_triage.notify.delivery import Delivery, signature
from vllm_triage.notify.receivers import build_receiver
from vllm_triage.store import Notification

from support.clock import FakeClock
from support.harness import refused_port
from support.receiver import Receiver, Reply

EXTERNAL = "http://triage.example:9468"
OK = Reply()
HANG = Reply(hang=True)
#: How long a test waits for its queue to empty before failing: a guard against a hang,
#: not a measure (the retries wait on a fake clock; only the requests take real time).
HANG_GUARD_S = 60.0


@contextlib.contextmanager
def receiving(plan: list[Reply] | None = None) -> Iterator[Receiver]:
    with Receiver(plan, http11=True) as r:
        yield r


def receiver_settings(url: str, **kw: Any) -> ReceiverSettings:
    """Short retries (fake seconds: they cost no real time); an attempt's own time limit
    long enough that only a test of it (a hung receiver) ever reaches it."""
    values: dict[str, Any] = {
        "type": "alertmanager_webhook",
        "url": url,
        "retry_initial_seconds": 0.05,
        "retry_max_seconds": 0.2,
        "retry_for_seconds": 2.0,
        "timeout_seconds": 30.0,
    }
    values.update(kw)
    return ReceiverSettings(**values)


def notes(n: int) -> list[Notification]:
    return [Notification(f'{{"n":{i}}}'.encode(), f"note {i}") for i in range(n)]


async def drain(
    settings: ReceiverSettings,
    items: list[Notification],
    *,
    clock: FakeClock | None = None,
    setup: Any = None,
) -> Delivery:
    """Submit ``items`` and run the worker until the queue is empty; its retries wait on
    ``clock`` (a fake one: its ``slept`` is the retry schedule)."""
    clock = clock or FakeClock(0.0)
    async with httpx.AsyncClient(trust_env=False) as client:
        receiver = build_receiver("test", settings, EXTERNAL)
        d = Delivery(receiver, client, clock=clock, sleep=clock.asleep)
        if setup is not None:
            setup(d)
        for n in items:
            d.submit(n)
        worker = asyncio.create_task(d.run())
        try:
            await asyncio.wait_for(d.wait_idle(), HANG_GUARD_S)
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
    return d


def no_jitter(d: Delivery) -> None:
    """A fixed 0.02 s backoff instead of tenacity's jittered one (the jitter alone is up to
    1 s, capped by retry_max_seconds), so that the gaps between attempts are predictable."""
    d._wait = wait_fixed(0.02)  # pyright: ignore[reportAttributeAccessIssue]


class TestInOrder:
    def test_delivers_every_notification_in_order(self) -> None:
        items = notes(5)
        with receiving() as r:
            d = asyncio.run(drain(receiver_settings(r.url), items))
        assert r.raw_bodies() == [n.body for n in items]
        assert [s.path for s in r.seen] == ["/hook"] * 5
        assert d.stats.sent == 5
        assert (d.stats.retried, d.stats.failed, d.stats.dropped) == (0, 0, 0)
        assert d.stats.last_success_at is not None
        assert d.pending == 0

    def test_a_retry_does_not_let_the_next_overtake(self) -> None:
        """The first notification fails once; the second waits for it."""
        items = notes(3)
        with receiving([Reply(500), OK]) as r:
            d = asyncio.run(drain(receiver_settings(r.url), items))
        assert r.raw_bodies() == [items[0].body, items[0].body, items[1].body, items[2].body]
        assert d.stats.sent == 3

    def test_headers(self) -> None:
        with receiving() as r:
            asyncio.run(drain(receiver_settings(r.url), notes(1)))
        headers = {k.lower(): v for k, v in r.seen[0].headers.items()}
        assert headers["content-type"] == "application/json"
        assert headers["user-agent"].startswith("vllm-triage/")
        assert "authorization" not in headers
        assert "x-vllm-triage-signature" not in headers

    @pytest.mark.parametrize(
        "given", ["/api/v2/alerts", "/api/v2/alerts/", "", "/"], ids=["full", "slash", "base", "/"]
    )
    def test_alertmanager_posts_to_the_alerts_api(self, given: str) -> None:
        """An ``alertmanager`` receiver takes the base URL (or the full API path)."""
        with receiving() as r:
            settings = receiver_settings(r.server.url(given), type="alertmanager")
            item = Notification(b"[]", "push", path="/api/v2/alerts")
            asyncio.run(drain(settings, [item]))
        assert [s.path for s in r.seen] == ["/api/v2/alerts"]


class TestRetries:
    def test_500_then_200_is_retried(self) -> None:
        with receiving([Reply(500), OK]) as r:
            d = asyncio.run(drain(receiver_settings(r.url), notes(1)))
        assert len(r.seen) == 2
        assert d.stats.sent == 1
        assert d.stats.retried >= 1
        assert d.stats.failed == 0
        assert d.stats.last_error == "HTTP 500"

    @pytest.mark.parametrize("status", [408, 429, 502, 503, 504])
    def test_other_passing_failures_are_retried(self, status: int) -> None:
        with receiving([Reply(status), OK]) as r:
            d = asyncio.run(drain(receiver_settings(r.url), notes(1), setup=no_jitter))
        assert len(r.seen) == 2
        assert (d.stats.sent, d.stats.retried, d.stats.failed) == (1, 1, 0)

    @pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
    def test_4xx_is_not_retried(self, status: int) -> None:
        """A refusal fails at once, counted and logged; the next notification still goes."""
        items = notes(2)
        clock = FakeClock(0.0)
        with receiving([Reply(status), OK]) as r, capture_logs() as logs:
            d = asyncio.run(drain(receiver_settings(r.url), items, clock=clock))
        assert clock.slept == [], "a refusal was waited on, as if it might pass"
        assert r.raw_bodies() == [items[0].body, items[1].body]
        assert (d.stats.failed, d.stats.retried, d.stats.sent) == (1, 0, 1)
        assert d.stats.last_error.startswith(f"HTTP {status}")
        failed = [e for e in logs if e["event"] == "notification_failed"]
        assert [e["what"] for e in failed] == ["note 0"]

    def test_receiver_down_then_up_on_the_same_port(self) -> None:
        """Connection refused is retried until the receiver starts; then it is delivered.
        The receiver starts while the delivery waits to try again: in that order."""
        late = Receiver(http11=True)  # its port held, refusing connections
        clock = FakeClock(0.0)

        async def start_while_waiting(seconds: float) -> None:
            if not clock.slept:
                late.start()
            await clock.asleep(seconds)

        def waiting_starts_the_receiver(d: Delivery) -> None:
            d._sleep = start_while_waiting

        try:
            d = asyncio.run(
                drain(
                    receiver_settings(late.url),
                    notes(2),
                    clock=clock,
                    setup=waiting_starts_the_receiver,
                )
            )
        finally:
            late.server.close()
        assert late.raw_bodies() == [n.body for n in notes(2)]
        assert d.stats.sent == 2
        assert d.stats.retried == 1 and len(clock.slept) == 1
        assert d.stats.failed == 0
        assert "ConnectError" in d.stats.last_error

    def test_gives_up_after_retry_for_seconds(self) -> None:
        """A receiver that keeps failing: retried for retry_for_seconds, then failed: the
        first attempt at or past retry_for_seconds is the last."""
        clock = FakeClock(0.0)
        with receiving([Reply(503)]) as r, capture_logs() as logs:
            settings = receiver_settings(r.url, retry_for_seconds=0.3, retry_max_seconds=0.1)
            d = asyncio.run(drain(settings, notes(1), clock=clock))
        waited = sum(clock.slept)
        assert waited >= 0.3 > waited - clock.slept[-1], clock.slept
        assert len(r.seen) == len(clock.slept) + 1 >= 2
        assert (d.stats.sent, d.stats.failed) == (0, 1)
        assert d.stats.retried == len(r.seen) - 1
        assert d.stats.last_error == "HTTP 503"
        failed = [e for e in logs if e["event"] == "notification_failed"]
        assert len(failed) == 1 and failed[0]["what"] == "note 0"

    def test_timeout_is_retried(self) -> None:
        """A receiver that does not answer within timeout_seconds is tried again. (On a
        busy machine an answer may miss the short limit too: it is then tried again, as
        the plan's last reply repeats; what counts is that the hang was retried.)"""
        with receiving([HANG, OK]) as r:
            d = asyncio.run(drain(receiver_settings(r.url, timeout_seconds=0.2), notes(1)))
        assert len(r.seen) >= 2
        assert (d.stats.sent, d.stats.failed) == (1, 0)
        assert d.stats.retried == len(r.seen) - 1
        assert "timed out" in d.stats.last_error

    def test_retry_after_is_honoured(self) -> None:
        """429 with Retry-After: 0.3: the next attempt waits 0.3 s, not the backoff."""
        clock = FakeClock(0.0)
        with receiving([Reply(429, {"Retry-After": "0.3"}), OK]) as r:
            settings = receiver_settings(r.url, retry_max_seconds=1.0)
            d = asyncio.run(drain(settings, notes(1), clock=clock, setup=no_jitter))
        assert len(r.seen) == 2
        assert clock.slept == [0.3]
        assert d.stats.sent == 1

    def test_without_retry_after_the_backoff_is_shorter(self) -> None:
        """The control for the test above: the same setup without the header waits the
        backoff (0.02 s)."""
        clock = FakeClock(0.0)
        with receiving([Reply(429), OK]) as r:
            settings = receiver_settings(r.url, retry_max_seconds=1.0)
            asyncio.run(drain(settings, notes(1), clock=clock, setup=no_jitter))
        assert len(r.seen) == 2
        assert clock.slept == [0.02]

    def test_errors_never_show_the_url(self) -> None:
        """The receiver URL may hold a token (Slack's does): not in errors nor logs."""
        url = f"http://127.0.0.1:{refused_port()}/services/T0/B0/s3cr3t-t0k3n"
        settings = receiver_settings(url, retry_for_seconds=0.2, retry_max_seconds=0.05)
        with capture_logs() as logs:
            d = asyncio.run(drain(settings, notes(1)))
        assert d.stats.failed == 1
        assert d.stats.last_error
        assert "s3cr3t-t0k3n" not in d.stats.last_error
        assert logs and "s3cr3t-t0k3n" not in repr(logs)


class TestAuth:
    def test_hmac_signature(self) -> None:
        """The receiver recomputes HMAC-SHA256 over the body it got: it matches."""
        secret = b"shared-hmac-secret"
        items = notes(3)
        with receiving() as r:
            r.hmac_secret = secret
            settings = receiver_settings(r.url, hmac_secret=secret.decode())
            asyncio.run(drain(settings, items))
        assert r.signature_ok == [True, True, True]
        for seen, n in zip(r.seen, items, strict=True):
            assert seen.headers["X-Vllm-Triage-Signature"] == signature(secret, n.body)
            assert seen.headers["X-Vllm-Triage-Signature"].startswith("sha256=")

    def test_hmac_with_the_wrong_secret_does_not_verify(self) -> None:
        with receiving() as r:
            r.hmac_secret = b"the-receivers-secret"
            asyncio.run(drain(receiver_settings(r.url, hmac_secret="another"), notes(1)))
        assert r.signature_ok == [False]

    def test_hmac_header_name(self) -> None:
        with receiving() as r:
            settings = receiver_settings(r.url, hmac_secret="k", hmac_header="X-Signature")
            asyncio.run(drain(settings, notes(1)))
        assert r.seen[0].headers["X-Signature"] == signature(b"k", r.seen[0].body)

    def test_bearer_token_and_headers(self) -> None:
        with receiving() as r:
            settings = receiver_settings(
                r.url, bearer_token="tok-123", headers={"X-Api-Key": "key-456"}
            )
            asyncio.run(drain(settings, notes(1)))
        assert r.seen[0].headers["Authorization"] == "Bearer tok-123"
        assert r.seen[0].headers["X-Api-Key"] == "key-456"

    def test_basic_auth(self) -> None:
        with receiving() as r:
            settings = receiver_settings(
                r.url, basic_auth={"username": "alice", "password": "pa:ss"}
            )
            asyncio.run(drain(settings, notes(1)))
        scheme, _, encoded = r.seen[0].headers["Authorization"].partition(" ")
        assert scheme == "Basic"
        assert base64.b64decode(encoded) == b"alice:pa:ss"


class TestQueue:
    def test_overflow_drops_the_oldest(self) -> None:
        """queue_size 2, five submitted before the worker runs: three dropped, counted."""
        items = notes(5)
        with receiving() as r, capture_logs() as logs:
            d = asyncio.run(drain(receiver_settings(r.url, queue_size=2), items))
        assert d.stats.dropped == 3
        assert r.raw_bodies() == [items[3].body, items[4].body]
        assert d.stats.sent == 2
        # Said once for the run of drops (then once per queue_size more), counted each.
        dropped = [e for e in logs if e["event"] == "notification_dropped"]
        assert [(e["what"], e["dropped_in_a_row"]) for e in dropped] == [
            ("note 0", 1),
            ("note 2", 3),
        ]

    def test_pending_counts_the_queue(self) -> None:
        async def go() -> int:
            async with httpx.AsyncClient(trust_env=False) as client:
                d = Delivery(
                    build_receiver("test", receiver_settings("http://127.0.0.1:9/"), EXTERNAL),
                    client,
                )
                for n in notes(4):
                    d.submit(n)
                return d.pending

        assert asyncio.run(go()) == 4

    def test_abandon_counts_the_queue_as_failed(self) -> None:
        async def go() -> tuple[int, Delivery]:
            async with httpx.AsyncClient(trust_env=False) as client:
                d = Delivery(
                    build_receiver("test", receiver_settings("http://127.0.0.1:9/"), EXTERNAL),
                    client,
                )
                for n in notes(3):
                    d.submit(n)
                return d.abandon("shutdown"), d

        with capture_logs() as logs:
            lost, d = asyncio.run(go())
        assert lost == 3
        assert d.stats.failed == 3
        assert d.stats.sent == 0
        assert d.pending == 0
        # One line for the three.
        (said,) = [e for e in logs if e["event"] == "notification_failed"]
        assert said["err"] == "shutdown" and said["count"] == 3 and len(said["what"]) == 3

    def test_abandon_counts_the_one_in_flight(self) -> None:
        """Stopped while the receiver hangs on the first: it and the two queued are failed."""

        async def go(r: Receiver) -> tuple[int, Delivery]:
            async with httpx.AsyncClient(trust_env=False) as client:
                d = Delivery(
                    build_receiver("test", receiver_settings(r.url), EXTERNAL),
                    client,
                )
                for n in notes(3):
                    d.submit(n)
                worker = asyncio.create_task(d.run())

                async def arrived() -> None:
                    while not r.seen:
                        await asyncio.sleep(0.01)

                await asyncio.wait_for(arrived(), HANG_GUARD_S)
                assert d.pending == 3
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
                return d.abandon("undelivered at shutdown"), d

        with receiving([HANG]) as r:
            lost, d = asyncio.run(go(r))
        assert len(r.seen) == 1
        assert lost == 3
        assert (d.stats.failed, d.stats.sent) == (3, 0)
