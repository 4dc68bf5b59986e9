"""``record`` against a URL where nothing answers says so at once (as ``check`` does),
instead of waiting out its whole --duration; a target that dies once the recording has
begun is still recorded as failures (daemon/vllm_triage/recording/record.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_triage.errors import ScrapeError
from vllm_triage.recording.record import record

from support.clirun import vllm_triage
from support.clock import FakeClock
from support.localserver import LocalServer, replies, serving

BODY = b'vllm:num_requests_running{model_name="m"} 1.0\n'


def test_a_dead_url_fails_at_once_without_waiting_out_the_duration(tmp_path: Path) -> None:
    """One try, no wait (a fake clock: its sleeps are what the recording waited)."""
    with serving(replies((200, BODY))) as srv:
        url = srv.url("/metrics")  # nothing listens there once the block is left
    clock = FakeClock()
    with pytest.raises(ScrapeError) as caught:
        record(url, tmp_path / "rec", interval=1.0, duration=20.0, clock=clock, sleep=clock.sleep)
    assert caught.value.reason == "connect"
    assert clock.slept == [], "it waited for the next tick of a URL where nothing listens"


def test_a_dead_url_is_said_in_a_line_and_exit_1(tmp_path: Path) -> None:
    """The command: an hour's --duration, so that waiting it out would be a hang."""
    with serving(replies((200, BODY))) as srv:
        url = srv.url("/metrics")
    result = vllm_triage("record", url, "--out", "rec", "--duration", "3600", cwd=tmp_path)
    assert result.returncode == 1
    assert "cannot connect, nothing recorded" in result.stderr
    assert "127.0.0.1" in result.stderr
    # The folder it made for nothing is not left behind.
    assert not (tmp_path / "rec").exists()


def test_an_existing_folder_is_left_in_place(tmp_path: Path) -> None:
    with serving(replies((200, BODY))) as srv:
        url = srv.url("/metrics")
    (tmp_path / "rec").mkdir()
    result = vllm_triage("record", url, "--out", "rec", "--duration", "20", cwd=tmp_path)
    assert result.returncode == 1
    assert (tmp_path / "rec").is_dir()


def test_a_target_that_dies_mid_recording_is_recorded_as_failures(tmp_path: Path) -> None:
    """Two good scrapes, then the server goes: the later scrapes are failures, counted,
    and the recording runs its whole duration (a fake clock: no waiting)."""
    srv = LocalServer(replies((200, BODY))).start()
    now = [1000.0]
    ticks = [0]

    def sleep(seconds: float) -> None:
        ticks[0] += 1
        if ticks[0] == 2:
            srv.stop()  # refused from now on
        now[0] += seconds

    try:
        stats = record(
            srv.url("/metrics"),
            tmp_path / "rec",
            interval=1.0,
            duration=5.0,
            timeout=2.0,
            clock=lambda: now[0],
            sleep=sleep,
        )
    finally:
        srv.close()
    assert stats.written == 2
    assert stats.failed == stats.scrapes - 2 == 3
    assert len(list((tmp_path / "rec").glob("*.prom"))) == 2


def test_a_404_fails_at_once_naming_the_path(tmp_path: Path) -> None:
    """The wrong path on a live server: said after one scrape, with the hint, and nothing
    left behind; not after the whole --duration."""
    with serving(replies((404, b"Not Found"))) as srv:
        result = vllm_triage(
            "record", srv.url("/metric"), "--out", "rec", "--duration", "600",
            cwd=tmp_path,
        )  # fmt: skip
        hits = len(srv.requests)
    assert result.returncode == 1
    assert "refused, nothing recorded: HTTP 404" in result.stderr
    assert hits == 1  # one scrape, not one per interval for ten minutes
    assert not (tmp_path / "rec").exists()


def test_a_server_error_is_recorded_as_a_failure_not_fatal(tmp_path: Path) -> None:
    """A 503 (vLLM still loading) may pass: the recording goes on (a fake clock)."""
    srv = LocalServer(replies((503, b"loading"), (200, BODY))).start()
    now = [1000.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    try:
        stats = record(
            srv.url("/metrics"),
            tmp_path / "rec",
            interval=5,
            duration=12,
            clock=lambda: now[0],
            sleep=sleep,
        )
    finally:
        srv.stop()
    assert stats.failed == 1 and stats.written == 2
