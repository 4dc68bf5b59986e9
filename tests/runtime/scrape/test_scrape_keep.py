"""The daemon's own recording (``record.dir``, ``run --record``; daemon/vllm_triage/scrape/keep.py):
each body its scrape loop fetched, byte for byte, at the time it judged it; bounded as
every recording is; and nothing the disk does stops the scrape loop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from vllm_triage.assemble import build_scraped, record_folder_name
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.errors import ConfigError
from vllm_triage.recording.files import FILE_NAME, recording_files
from vllm_triage.scrape.keep import ScrapeKeeper
from vllm_triage.serve.exporter import build_registry

from support.captures import fixture_text
from support.clirun import HANG_S
from support.harness import running_daemon, wait_for
from support.localserver import Exchange, serving

BODY = fixture_text("kvwarden-vllm-0.19.1-v1.txt").encode()


def bodies_in_turn() -> tuple[list[bytes], Callable[[Exchange], None]]:
    """A handler that serves BODY with a different counter each time, and what it sent."""
    sent: list[bytes] = []

    def handle(x: Exchange) -> None:
        body = BODY + f"vllm_triage_test_serial {len(sent)}\n".encode()
        sent.append(body)
        x.reply(200, body, content_type="text/plain; version=0.0.4")

    return sent, handle


def settings(url: str, record: Path, **extra: object) -> Settings:
    return load_settings(
        flags={
            "listen": "127.0.0.1:0",
            "interval_seconds": 0.2,
            # Its own, not 0.8 of the interval: a scrape that waits for a busy machine
            # is late, not failed (the ticks it overran are skipped, and counted).
            "scrape_timeout_seconds": 30,
            "window_seconds": 60,
            "state_dir": None,
            "targets": [{"name": "local", "url": url}],
            "record": {"dir": str(record), **extra},
        }
    )


def test_each_scrape_the_daemon_takes_is_kept_byte_for_byte(tmp_path: Path) -> None:
    sent, handle = bodies_in_turn()
    with serving(handle) as srv, running_daemon(settings(srv.url("/metrics"), tmp_path)) as d:
        wait_for(lambda: len(list((tmp_path / "local").glob("*.prom"))) >= 3, timeout=HANG_S)
        (scraper,) = d.scrapers
    files = recording_files(tmp_path / "local")
    kept = [p.read_bytes() for _, p in files]
    # Each kept body is one the server sent, in order, none twice; the daemon may have
    # stopped between a fetch and its write, so the last one sent may be missing.
    assert kept == sent[: len(kept)] and len(sent) - len(kept) <= 1
    # The daemon judged each scrape at the time its file's name says.
    assert scraper.target.state.last_success_at in {at for at, _ in files}
    stats = scraper.target.state.recording
    assert stats is not None and stats.written == len(kept) and not stats.failures
    assert stats.bytes_written == sum(len(b) for b in kept)


def test_a_disk_that_refuses_writes_costs_the_recording_not_the_scrapes(
    tmp_path: Path,
) -> None:
    """The recording's folder cannot be made (a file is in the way): each scrape is still
    judged, the failure is counted on /metrics and logged once, not once per scrape."""
    (tmp_path / "local").write_text("in the way")
    _, handle = bodies_in_turn()
    with (
        capture_logs() as logs,
        serving(handle) as srv,
        running_daemon(settings(srv.url("/metrics"), tmp_path)) as d,
    ):
        state = d.scrapers[0].target.state
        wait_for(lambda: state.scrapes >= 4 and state.up, timeout=HANG_S)
        metrics = httpx.get(f"{d.url}/metrics", timeout=5).text
    assert state.recording is not None and state.recording.failures["disk"] >= 3
    assert state.recording.written == 0 and state.up and not state.failures
    samples = {
        (s.name, s.labels.get("reason", "")): s.value
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name.startswith("vllm_triage_record")
    }
    assert samples[("vllm_triage_recording_failures_total", "disk")] >= 3
    assert samples[("vllm_triage_recorded_scrapes_total", "")] == 0
    failed = [e for e in logs if e["event"] == "recording_failed"]
    assert len(failed) == 1 and failed[0]["reason"] == "disk" and "local" in failed[0]["err"]


def test_a_body_over_the_file_bound_is_not_kept(tmp_path: Path) -> None:
    keeper = ScrapeKeeper("t", tmp_path / "t", max_bytes=1 << 30, max_file_bytes=100)
    keeper.keep(1000.0, b"x" * 101)
    keeper.keep(1005.0, b"x" * 100)
    assert keeper.stats.failures == {"too_large": 1} and keeper.stats.written == 1
    assert [p.name for p in (tmp_path / "t").iterdir()] == ["1005000.prom"]


def test_recording_stops_at_its_byte_bound_and_says_so(tmp_path: Path) -> None:
    keeper = ScrapeKeeper("t", tmp_path / "t", max_bytes=250)
    with capture_logs() as logs:
        for n in range(5):
            keeper.keep(1000.0 + 5 * n, b"y" * 100)
    assert keeper.stats.written == 2 and keeper.stats.failures == {"full": 3}
    assert keeper.stats.bytes_written == 200
    assert [e["reason"] for e in logs if e["event"] == "recording_failed"] == ["full"]


def test_file_times_are_the_recordings_milliseconds() -> None:
    at = ScrapeKeeper.file_time(1_767_225_600.123456)
    assert at == 1_767_225_600.123
    assert FILE_NAME.match(f"{round(at * 1000)}.prom")


def test_a_target_name_with_a_slash_is_one_folder() -> None:
    assert record_folder_name("local") == "local"
    assert record_folder_name("127.0.0.1:8000") == "127.0.0.1:8000"
    a, b = record_folder_name("a/b"), record_folder_name("a_b")
    assert "/" not in a and a.startswith("a_b-") and a != b


def test_without_record_dir_nothing_is_kept() -> None:
    """Recording is asked for, never on by itself: no keeper, no recording metrics."""
    s = load_settings(flags={"targets": [{"name": "x", "url": "http://127.0.0.1:1/metrics"}]})
    scraper = build_scraped(s, s.targets[0], client=httpx.AsyncClient(), notifier=None)
    assert s.record.dir is None and scraper.keeper is None
    assert scraper.target.state.recording is None
    registry = build_registry(lambda: [scraper.target.state], list)
    assert "vllm_triage_record" not in generate_latest(registry).decode()


def test_fleet_mode_refuses_record_rather_than_keep_nothing() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(
            flags={
                "source": "prometheus",
                "prometheus": {"url": "http://127.0.0.1:9090"},
                "record": {"dir": "rec"},
            }
        )
    assert "record.dir (--record)" in str(info.value) and "source: prometheus" in str(info.value)
