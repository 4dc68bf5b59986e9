"""The daemon's scheduling and failure handling (daemon/vllm_triage/service.py,
daemon/vllm_triage/scrape/loop.py, daemon/vllm_triage/target.py), against misbehaving targets on
127.0.0.1."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import structlog

from vllm_triage.assemble import build_daemon
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.simulator import get_scenario

from support.clirun import HANG_S
from support.harness import (
    Answer,
    metrics_url,
    refused_port,
    running_daemon,
    simulated,
    target,
    wait_for,
)
from support.paths import VLLM_CAPTURES

FIXTURE = VLLM_CAPTURES


#: The scrape timeout of the test of a slow target: long enough that the fast target
#: beside it never reaches it, even on a busy machine.
SLOW_S = 3.0


def settings_for(*targets: tuple[str, str], **extra: object) -> Settings:
    return load_settings(
        flags={
            "listen": "127.0.0.1:0",
            "interval_seconds": 0.3,
            "targets": [{"name": n, "url": u} for n, u in targets],
            **extra,
        }
    )


class TestScheduling:
    def test_a_hanging_target_skips_its_own_ticks_and_delays_no_other(self) -> None:
        """A target slower than the interval: its overlapping ticks are skipped and counted;
        a healthy target beside it is scraped meanwhile, not at the slow one's pace. (Each
        slow scrape spans ten ticks of 0.3 s; counts, not seconds, so that a busy machine
        that runs fewer ticks does not fail it.)"""
        with (
            target(delay=SLOW_S + 1.0) as slow,
            simulated(get_scenario("healthy"), speed=1.0) as sim,
        ):
            settings = settings_for(
                ("slow", slow), ("fast", metrics_url(sim)), scrape_timeout_seconds=SLOW_S
            )
            with running_daemon(settings) as daemon:
                slow_state, fast_state = (w.state for w in daemon.targets)
                wait_for(lambda: slow_state.failures["timeout"] >= 2, timeout=HANG_S)
                skipped = slow_state.skipped_ticks
                fast_scrapes, slow_scrapes = fast_state.scrapes, slow_state.scrapes
                metrics = httpx.get(daemon.url + "/metrics", timeout=HANG_S).text
        assert skipped >= slow_scrapes >= 2  # at least one tick skipped per slow scrape
        # At the slow target's pace it would have had one scrape per slow one.
        assert fast_scrapes >= 2 * slow_scrapes, (fast_scrapes, slow_scrapes)
        assert fast_state.up and not fast_state.failures
        assert slow_state.failures["timeout"] >= 1
        assert 'vllm_triage_scrape_skipped_total{target="slow"}' in metrics
        assert 'vllm_triage_scrape_failures_total{reason="timeout",target="slow"}' in metrics

    def test_a_new_interval_reschedules_every_scrape_and_nothing_else(self) -> None:
        """``set_interval`` (the live demo, slowing its clock): each target's scrape job
        takes the new interval; the notifier's tick is not a scrape and keeps its own."""

        async def run() -> dict[str, float]:
            daemon = build_daemon(
                settings_for(
                    ("a", f"http://127.0.0.1:{refused_port()}/metrics"),
                    ("b", f"http://127.0.0.1:{refused_port()}/metrics"),
                )
            )
            with pytest.raises(RuntimeError, match="not running"):
                daemon.set_interval(1.0)
            stop = asyncio.Event()
            task = asyncio.create_task(daemon.run(stop))
            while not daemon.ready:
                await asyncio.sleep(0.01)
            daemon.set_interval(1.2)
            assert daemon._scheduler is not None
            jobs = {j.id: j.trigger.interval.total_seconds() for j in daemon._scheduler.get_jobs()}
            stop.set()
            await task
            return jobs

        assert asyncio.run(run()) == {"scrape:a": 1.2, "scrape:b": 1.2, "notifier": 1.0}


class TestFailures:
    def test_each_failure_is_counted_by_reason_and_logged_once(self) -> None:
        garbage = b"\x00\xff not metrics at all \x89PNG"
        dead = f"http://127.0.0.1:{refused_port()}/metrics"
        with (
            target(status=500) as err,
            target(body=garbage) as junk,
            structlog.testing.capture_logs() as logs,
        ):
            settings = settings_for(("err", err), ("junk", junk), ("dead", dead))
            with running_daemon(settings) as daemon:
                states = {w.state.name: w.state for w in daemon.targets}
                wait_for(lambda: all(s.scrapes >= 4 for s in states.values()), timeout=HANG_S)
                assert daemon.ready
                ready = httpx.get(daemon.url + "/readyz", timeout=HANG_S).status_code
            assert not daemon.ready
        assert ready == 200  # readiness does not depend on the targets
        assert states["err"].failures["http_status"] >= 4
        assert states["junk"].failures["parse"] >= 4
        assert states["dead"].failures["connect"] >= 4
        assert not any(s.up for s in states.values())
        failed = [e for e in logs if e["event"] == "scrape_failed"]
        # Rate-limited: the first failure of each target is logged, the next ones are not
        # (within a minute), though every one is counted.
        assert sorted(e["target"] for e in failed) == ["dead", "err", "junk"]
        assert {e["reason"] for e in failed} == {"http_status", "parse", "connect"}

    def test_a_recovering_target_logs_its_recovery(self) -> None:
        answer = Answer(status=503)
        good = (FIXTURE / "kvwarden-vllm-0.19.1-v1.txt").read_bytes()
        with (
            target(answer) as url,
            structlog.testing.capture_logs() as logs,
            running_daemon(settings_for(("t", url))) as daemon,
        ):
            state = daemon.targets[0].state
            wait_for(lambda: state.failures["http_status"] >= 2, timeout=HANG_S)
            answer.status, answer.body = 200, good
            wait_for(lambda: state.up, timeout=HANG_S)
        events = [e["event"] for e in logs if e.get("target") == "t"]
        assert events.count("scrape_failed") == 1
        assert events.index("scrape_failed") < events.index("scrape_recovered")

    def test_a_body_over_the_limit_is_refused(self) -> None:
        big = b"# " + b"x" * 4096 + b"\n"
        with target(body=big * 64) as huge:
            settings = settings_for(("huge", huge), max_body_bytes=65536)
            with running_daemon(settings) as daemon:
                state = daemon.targets[0].state
                wait_for(lambda: state.failures["too_large"] >= 2, timeout=HANG_S)
        assert "larger than 65536 bytes" in state.last_error
