"""Tests for daemon/vllm_triage/core/stall.py: no progress with work outstanding is ``stalled``,
judged before anything else; a shorter pause, and the window after a stall, judge nothing."""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm_triage.core.diagnose import diagnose
from vllm_triage.core.model import Progress

from support.diagnosis import q, rules, signals


def progress(**changes: Any) -> Progress:
    """An engine 8 requests deep whose series stopped moving ``seconds_without_progress`` ago."""
    base = Progress(
        last_progress_at=40.0,
        seconds_without_progress=60.0,
        running=8.0,
        waiting=0.0,
        checked=("generation_tokens", "prompt_tokens", "iterations", "running", "waiting"),
        last_values={"generation_tokens": 1234.0, "running": 8.0},
        interval_seconds=5.0,
    )
    return dataclasses.replace(base, **changes)


# Signals whose symptoms, taken at face value, would be queue_bound (a frozen queue).
QUEUED: dict[str, Any] = dict(waiting_mean=6.0, ttft_p99=q(9.0), ttft_mean=4.0)


class TestStalled:
    def test_no_progress_with_work_outstanding_is_stalled(self) -> None:
        """A minute without a token or a step, 8 requests running: stalled, with the
        numbers that decided it and how to get a stack dump."""
        d = diagnose(signals(progress=progress()), rules())
        assert d.cause == "stalled" and d.breaches == ("no_progress",)
        assert d.evidence["seconds_without_progress"] == 60.0
        assert d.evidence["stall_after_seconds"] == 30.0
        assert d.evidence["requests_running"] == 8.0
        assert d.evidence["last_generation_tokens"] == 1234.0
        assert "iterations" in str(d.evidence["progress_series_checked"])
        assert "no progress for 60 s" in d.summary and "8 requests running" in d.summary
        assert "py-spy dump" in d.remediation[0]
        assert d.secondary == ()
        # gauges and the step counter hold, no probe: (1 + 1 + 0.5 + 1) / 4
        assert d.confidence == 0.88

    def test_stalled_comes_first(self) -> None:
        """Frozen gauges keep showing a queue; the stall explains it, so it wins."""
        d = diagnose(signals(progress=progress(waiting=6.0), **QUEUED), rules())
        assert d.cause == "stalled" and d.secondary == ()

    def test_not_yet_a_stall_judges_nothing(self) -> None:
        """10 s without progress: too short for a stall, and the gauges are frozen, so the
        queue they show is not judged either (it would fire before the stall could)."""
        d = diagnose(signals(progress=progress(seconds_without_progress=10.0), **QUEUED), rules())
        assert d.cause is None and d.breaches == () and d.held
        assert "no engine progress for 10 s" in d.summary

    def test_the_window_after_a_stall_is_the_stalls(self) -> None:
        """The engine resumed 20 s ago after 60 s without progress: the minute-long TTFTs
        now in the window are the stall's, not a queue's or prefill's."""
        after = progress(
            seconds_without_progress=0.0,
            previous_stall_seconds=60.0,
            previous_stall_ended_seconds_ago=20.0,
        )
        d = diagnose(signals(progress=after, **QUEUED), rules())
        assert d.cause is None and "resumed 20 s ago" in d.summary
        assert not d.held  # clear: the stall is over, and it resolves

    def test_a_short_pause_before_is_no_alibi(self) -> None:
        """A pause shorter than a stall leaves the symptoms to be judged as usual."""
        brief = progress(
            seconds_without_progress=0.0,
            previous_stall_seconds=5.0,
            previous_stall_ended_seconds_ago=20.0,
        )
        d = diagnose(signals(progress=brief, **QUEUED), rules())
        assert d.cause == "queue_bound"

    def test_the_breach_is_stall_after_seconds_and_sustained(self) -> None:
        """Stalled from stall_after_seconds (30 s) of no progress, not a second earlier
        whatever the scrape interval, and ``sustained``: the tracker opens on it at once
        (the test is already one of time), so the alert does not wait open_after more
        scrapes of an overloaded host."""
        at = diagnose(signals(progress=progress(seconds_without_progress=30.0)), rules())
        assert at.cause == "stalled" and at.sustained
        for interval in (1.0, 5.0, 60.0):
            before = progress(seconds_without_progress=29.0, interval_seconds=interval)
            d = diagnose(signals(progress=before), rules())
            assert d.cause is None and d.held and not d.sustained

    def test_an_unanswered_probe_on_an_idle_looking_engine(self) -> None:
        """The gauges say idle, but a one-token probe has had no answer for 35 s while
        nothing moved: the hang the metrics cannot show."""
        idle = progress(
            running=0.0,
            waiting=0.0,
            seconds_without_progress=35.0,
            probe_unanswered_seconds=35.0,
            probe_last_reason="timeout",
        )
        d = diagnose(signals(progress=idle), rules())
        assert d.cause == "stalled"
        assert "probe unanswered for 35 s" in d.summary
        assert d.evidence["probe_last_reason"] == "timeout"
        # the gauges do not show it, the probe and the step counter do: (1 + 0 + 1 + 1) / 4
        assert d.confidence == 0.75

    def test_an_idle_engine_is_healthy(self) -> None:
        d = diagnose(signals(progress=progress(running=0.0, seconds_without_progress=0.0)), rules())
        assert d.cause is None and d.summary == ""
