"""One target's data never stops another's judgement, and a clock that goes back starts
the window again (``target.py``, ``scrape/loop.py``).

Before: an exception while judging one target's snapshot (a 400-digit label made the
core raise ``OverflowError``) escaped to the scheduler as a 38-line traceback per
scrape, counted nowhere, and the target stayed frozen at its last view with ``up`` at 1.
A wall clock stepped back (an NTP step, a VM restored) dropped every scrape as out of
order, one unthrottled log line each, ``up`` still 1, until the clock caught up."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from vllm_triage.assemble import build_scraped, build_target
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import TargetSettings
from vllm_triage.core.evaluate import Evaluator
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.rules import runtime_table
from vllm_triage.serve.exporter import build_registry
from vllm_triage.state import FAILURE_REASONS
from vllm_triage.target import Target

from support.clirun import HANG_S
from support.harness import running_daemon, wait_for
from support.localserver import replies, serving
from support.scenarios import recorded

SCRAPES = recorded("queue_bound", start_at=1_767_225_600.0, interval_s=5.0, duration_s=180.0)


def target(name: str = "t") -> Target:
    return build_target(load_settings(None), name, "http://127.0.0.1:1/metrics", notifier=None)


def feed(t: Target, scrapes: tuple[tuple[float, str], ...], *, at_shift: float = 0.0) -> None:
    parser = SnapshotParser(runtime_table())
    for at, body in scrapes:
        t.state.attempted(at + at_shift)
        t.consume(parser.parse(body, at + at_shift))


def explode_on(t: Target, calls: set[int]) -> list[int]:
    """Make ``t``'s evaluator raise on the given calls (1-based): a bug only some data
    finds. Returns the list of calls seen so far."""
    seen: list[int] = []
    step = t.evaluator.step

    def maybe(snapshot):  # type: ignore[no-untyped-def]
        seen.append(len(seen) + 1)
        if len(seen) in calls:
            raise OverflowError("int too large to convert to float")
        return step(snapshot)

    t.evaluator.step = maybe  # type: ignore[method-assign]
    return seen


class TestOneTargetsDataIsItsOwnFailure:
    def test_an_exception_while_judging_is_a_counted_failure_logged_once(self) -> None:
        bad, good = target("bad"), target("good")
        explode_on(bad, set(range(1, 11)))
        with capture_logs() as logs:
            for t in (bad, good):
                feed(t, SCRAPES[:10])
        st = bad.state
        assert st.failures == {"evaluate": 10} and not st.up and st.view is None
        assert "OverflowError" in st.last_error and "(at " in st.last_error
        said = [e for e in logs if e["event"] == "scrape_failed" and e["target"] == "bad"]
        assert len(said) == 1 and said[0]["reason"] == "evaluate"
        # The other target never noticed.
        assert good.state.up and not good.state.failures and good.state.view is not None

    def test_it_recovers_when_its_data_does(self) -> None:
        bad = target("bad")
        explode_on(bad, {1, 2, 3})
        with capture_logs() as logs:
            feed(bad, SCRAPES[:30])
        st = bad.state
        assert st.failures == {"evaluate": 3} and st.up and st.view is not None
        assert [e["event"] for e in logs if "scrape" in e["event"]] == [
            "scrape_failed",
            "scrape_recovered",
        ]
        # Judged from there on as if nothing had happened: the queue is found.
        assert [a.cause for a in bad.evaluator.incidents.active()] == ["queue_bound"]

    def test_reasons_are_a_bounded_set(self) -> None:
        t = target()
        t.failed("a reason no code path gives", "x")
        t.failed("timeout", "y")
        assert set(t.state.failures) == {"other", "timeout"} <= set(FAILURE_REASONS)


def test_the_scrape_loop_counts_whatever_reading_a_body_raises() -> None:
    """A parser bug set off by a body is that target's ``evaluate`` failure: the tick
    ends normally (no traceback reaches the scheduler)."""
    settings = load_settings(None)

    async def go(url: str) -> tuple[Target, list[dict[str, object]]]:
        async with httpx.AsyncClient() as client:
            scraper = build_scraped(
                settings,
                TargetSettings(name="odd", url=url),
                client=client,
                notifier=None,
            )
            reader = scraper.reader

            def broken(*_: object, **__: object):  # type: ignore[no-untyped-def]
                raise IndexError("list index out of range")
                yield  # a generator, as parse_steps is

            reader.parse_steps = broken  # type: ignore[method-assign]
            with capture_logs() as logs:
                for _ in range(3):
                    await scraper.scrape()
            return scraper.target, logs

    with serving(replies((200, SCRAPES[0][1].encode()))) as server:
        t, logs = asyncio.run(go(server.url("/metrics")))
    assert t.state.failures == {"evaluate": 3} and t.state.scrapes == 3 and not t.state.up
    assert len([e for e in logs if e["event"] == "scrape_failed"]) == 1


class TestClockGoingBack:
    def test_the_window_starts_again_said_once(self) -> None:
        """Five minutes back: every scrape after the step is judged (before: each was
        refused as out of order, one log line each, for five minutes)."""
        t = target()
        before, after = SCRAPES[:20], SCRAPES[20:]
        with capture_logs() as logs:
            feed(t, before)
            feed(t, after, at_shift=-300.0)
        st = t.state
        said = [e for e in logs if e["event"] == "clock_went_back"]
        refused = [e for e in logs if e["event"] == "snapshot_out_of_order"]
        assert len(said) == 1 and said[0]["back_seconds"] == pytest.approx(295.0)
        assert st.clock_steps_back == 1 and not refused
        assert st.view is not None and st.view.evaluation.accepted
        assert st.view.evaluation.at == after[-1][0] - 300.0
        # The window holds only what came after the step.
        assert len(t.evaluator.window) <= len(after)
        assert t.evaluator.window.newest is not None

    def test_an_open_incident_is_not_resolved_by_the_young_window(self) -> None:
        """The window is empty after the step: too young to say the queue is gone."""
        t = target()
        feed(t, SCRAPES[:30])
        assert [a.cause for a in t.evaluator.incidents.active()] == ["queue_bound"]
        feed(t, SCRAPES[30:33], at_shift=-600.0)
        assert [a.cause for a in t.evaluator.incidents.active()] == ["queue_bound"]

    def test_the_same_time_twice_is_a_duplicate_said_once_a_minute(self) -> None:
        t = target()
        parser = SnapshotParser(runtime_table())
        at, body = SCRAPES[0]
        with capture_logs() as logs:
            for _ in range(5):
                t.consume(parser.parse(body, at))
        refused = [e for e in logs if e["event"] == "snapshot_out_of_order"]
        assert len(refused) == 1 and t.state.clock_steps_back == 0


def test_an_evaluator_restarted_keeps_its_incidents() -> None:
    t = target()
    feed(t, SCRAPES[:30])
    ev: Evaluator = t.evaluator
    active = ev.incidents.active()
    ev.restart_window()
    assert len(ev.window) == 0 and ev.last_at is None and ev.incidents.active() == active


def test_a_running_daemon_judges_on_when_its_clock_steps_back() -> None:
    """The daemon itself, its wall clock stepped back five minutes after a few scrapes:
    every scrape after the step is judged (the target's view moves on), it is said once
    and counted on /metrics, and the target stays up."""
    stepped = {"back": 0.0}

    def clock() -> float:
        return time.time() - stepped["back"]

    with serving(replies((200, SCRAPES[0][1].encode()))) as server:
        settings = load_settings(
            flags={
                "listen": "127.0.0.1:0",
                "interval_seconds": 0.2,
                "state_dir": None,
                "targets": [{"name": "t", "url": server.url("/metrics")}],
            }
        )
        with capture_logs() as logs, running_daemon(settings, clock=clock) as d:
            (scraper,) = d.scrapers
            st = scraper.target.state
            wait_for(lambda: st.view is not None and st.scrapes >= 3, timeout=HANG_S)
            stepped["back"] = 300.0
            before = st.scrapes
            wait_for(lambda: st.scrapes >= before + 5, timeout=HANG_S)
            view = st.view
            metrics = generate_latest(build_registry(lambda: [st], list)).decode()
    assert view is not None and view.evaluation.at < time.time() - 250
    assert st.up and st.clock_steps_back == 1 and not st.failures
    assert len([e for e in logs if e["event"] == "clock_went_back"]) == 1
    assert not [e for e in logs if e["event"] == "snapshot_out_of_order"]
    assert 'vllm_triage_clock_steps_back_total{target="t"} 1.0' in metrics
