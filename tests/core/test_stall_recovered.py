"""A stall that has just ended, seen only in its last seconds, is ``stalled`` (recovered),
not ``queue_bound`` with nothing waiting (daemon/vllm_triage/core/stall.py).

``check`` started as a 10-minute hang ended used to say "queue_bound ... 0.0 waiting" with
a TTFT p99 of 609 s: the requests that finished in its window had waited through the
hang, in a queue the frozen gauges never showed, and that queue was already gone. Two
things say a stall has just ended even when watching began during it: the engine had not
moved since the first snapshot and then moved (a stall already under way, of unknown
length), or an inter-token gap longer than ``stall_after_seconds`` ended in the window
(no step for that long while a request ran; only without preemptions, which also make a
request wait between tokens). A stall watched whole is judged as before: its window
after is clear, so its incident resolves. (``check`` on a simulated hang:
tests/diagnosis/test_stall_recovered_sim.py.)"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm_triage.core.diagnose import diagnose
from vllm_triage.core.model import Histogram, Progress
from vllm_triage.core.signals import longest_at_least

from support.diagnosis import q, rules, signals


def progress(**changes: Any) -> Progress:
    base = Progress(
        last_progress_at=95.0,
        seconds_without_progress=0.0,
        running=4.0,
        waiting=0.0,
        checked=("generation_tokens", "iterations", "running", "waiting"),
        interval_seconds=5.0,
        # Watching began inside the 60 s window (check's, or a daemon just started).
        watched_seconds=15.0,
    )
    return dataclasses.replace(base, **changes)


#: What the window after a hang shows, read at face value: a queue (queue time most of
#: a TTFT of minutes) with nobody waiting.
AFTER_HANG: dict[str, Any] = dict(
    ttft_p99=q(600.0), ttft_mean=200.0, queue_time_mean=190.0, waiting_mean=0.0
)


def test_an_inter_token_gap_of_a_stall_is_a_stall_recovered() -> None:
    s = signals(
        progress=progress(), itl_longest_at_least=80.0, preemptions_per_second=0.0, **AFTER_HANG
    )
    d = diagnose(s, rules())
    assert d.cause == "stalled" and d.evidence["stall_recovered"] is True
    assert d.breaches == ("ttft_p99",)


def test_a_gap_in_an_engine_watched_for_longer_is_not_taken_for_an_unseen_stall() -> None:
    """Watched for longer than the window, the engine's stalls were seen (one engine among
    several is watched on its own and judged stalled while it hangs): a gap is no news."""
    s = signals(
        progress=progress(watched_seconds=3600.0),
        itl_longest_at_least=80.0,
        preemptions_per_second=0.0,
        **AFTER_HANG,
    )
    assert diagnose(s, rules()).cause != "stalled"


def test_preempted_requests_wait_between_tokens_too() -> None:
    """With preemptions in the window a long gap may be a preempted request's wait: the
    symptoms are judged as usual."""
    s = signals(
        progress=progress(), itl_longest_at_least=80.0, preemptions_per_second=0.2, **AFTER_HANG
    )
    assert diagnose(s, rules()).cause != "stalled"


def test_a_gap_shorter_than_a_stall_is_no_stall() -> None:
    s = signals(
        progress=progress(), itl_longest_at_least=20.0, preemptions_per_second=0.0, **AFTER_HANG
    )
    assert diagnose(s, rules()).cause != "stalled"


def test_a_stall_watched_whole_is_judged_as_before() -> None:
    """Seen from its start (not censored) and as long as a stall: the window after it is
    clear, so the stall's incident resolves; a recovered verdict would keep it open."""
    after = progress(previous_stall_seconds=60.0, previous_stall_ended_seconds_ago=10.0)
    d = diagnose(
        signals(
            progress=after, itl_longest_at_least=80.0, preemptions_per_second=0.0, **AFTER_HANG
        ),
        rules(),
    )
    assert d.cause is None and "resumed 10 s ago" in d.summary


def test_a_censored_pause_without_a_latency_breach_is_healthy() -> None:
    """Seen still from the first snapshot, then moving, but nothing slow: nothing to say."""
    seen = progress(
        previous_stall_seconds=10.0,
        previous_stall_ended_seconds_ago=5.0,
        previous_stall_censored=True,
    )
    assert diagnose(signals(progress=seen), rules()).cause is None


def test_the_longest_observation_is_its_buckets_lower_bound() -> None:
    h = Histogram(
        bounds=(1.0, 10.0, 80.0, float("inf")), cumulative=(5.0, 7.0, 7.0, 8.0), count=8, sum=700
    )
    assert longest_at_least(h) == 80.0
    h = Histogram(
        bounds=(1.0, 10.0, 80.0, float("inf")), cumulative=(5.0, 7.0, 7.0, 7.0), count=7, sum=20
    )
    assert longest_at_least(h) == 1.0
    empty = Histogram(bounds=(1.0, float("inf")), cumulative=(0.0, 0.0), count=0, sum=0)
    assert longest_at_least(empty) is None
