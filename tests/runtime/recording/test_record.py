"""Tests for daemon/vllm_triage/recording/record.py: one raw file per scrape, failures logged, never
fatal."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from structlog.testing import capture_logs

from vllm_triage.errors import ScrapeError
from vllm_triage.net.fetch import BlockingFetcher
from vllm_triage.recording.record import record

from support.captures import fixture_text
from support.clock import FakeClock
from support.localserver import replies, serving

BODY = fixture_text("kvwarden-vllm-0.19.1-v1.txt").encode()


class TestRecord:
    def test_writes_raw_bodies_named_by_time(self, tmp_path: Path) -> None:
        """Each scrape of a local server is saved byte for byte as <unix_time_ms>.prom."""
        clock = FakeClock()
        with serving(replies((200, BODY))) as srv:
            url = srv.url("/metrics")
            stats = record(url, tmp_path, interval=5, duration=15, clock=clock, sleep=clock.sleep)
        files = sorted(tmp_path.glob("*.prom"))
        assert stats.written == 3 and len(files) == 3
        assert [f.name for f in files] == [f"{1_700_000_000_000 + 5000 * i}.prom" for i in range(3)]
        assert all(f.read_bytes() == BODY for f in files)
        assert all("version=0.0.4" in r.header("Accept") for r in srv.requests)

    def test_failed_scrapes_are_logged_and_skipped(self, tmp_path: Path) -> None:
        """An HTTP 500 writes no file, logs scrape_failed, and the recording goes on."""
        clock = FakeClock()
        with serving(replies((500, b"boom"), (200, BODY))) as srv, capture_logs() as logs:
            url = srv.url("/metrics")
            stats = record(url, tmp_path, interval=5, duration=10, clock=clock, sleep=clock.sleep)
        assert (stats.failed, stats.written) == (1, 1)
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["scrape_failed"]
        assert "HTTP 500" in next(e["err"] for e in logs if e["event"] == "scrape_failed")

    def test_dead_target(self, tmp_path: Path) -> None:
        """A refused first connection ends the recording at once, with the scrape's
        error (a target that dies later is recorded as failures:
        tests/commands/test_record_fails_fast.py)."""
        clock = FakeClock()
        with serving(replies((200, BODY))) as srv:
            url = srv.url("/metrics")
        # the server is gone: its port now refuses connections
        with pytest.raises(ScrapeError) as info:
            record(url, tmp_path, interval=5, duration=10, clock=clock, sleep=clock.sleep)
        assert info.value.reason == "connect"
        assert list(tmp_path.iterdir()) == []

    def test_unparseable_body_is_kept_and_reported(self, tmp_path: Path) -> None:
        """A body that is not vLLM metrics is still recorded (raw truth) and flagged."""
        clock = FakeClock()
        with serving(replies((200, b"<html>oops</html>"))) as srv, capture_logs() as logs:
            url = srv.url("/metrics")
            stats = record(url, tmp_path, interval=5, duration=5, clock=clock, sleep=clock.sleep)
        assert stats.unparseable == 1 and stats.written == 1
        assert any(e["event"] == "recorded_unparseable" for e in logs)


class TestFetch:
    def test_body_limit(self) -> None:
        """A body over the limit is refused without being kept whole."""
        # A stream, as from a socket (``content=`` would hand fetch a body already read).
        body = httpx.ByteStream(b"x" * 5000)
        client = httpx.AsyncClient(
            transport=httpx.MockTransport(lambda r: httpx.Response(200, stream=body))
        )
        with (
            BlockingFetcher(client) as fetcher,
            pytest.raises(ScrapeError, match="larger than 1000"),
        ):
            fetcher.fetch("http://127.0.0.1:1/metrics", timeout=1, max_body_bytes=1000)

    def test_timeout(self) -> None:
        """A target that times out is a ScrapeError that says so."""

        def hang(request: httpx.Request) -> httpx.Response:
            raise httpx.ReadTimeout("slow", request=request)

        client = httpx.AsyncClient(transport=httpx.MockTransport(hang))
        with BlockingFetcher(client) as fetcher, pytest.raises(ScrapeError, match="timed out"):
            fetcher.fetch("http://127.0.0.1:1/metrics", timeout=0.5, max_body_bytes=1000)
