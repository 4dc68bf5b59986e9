"""Durations and counts on the command line are bounded as the settings' are
(daemon/vllm_triage/commands/argtypes.py): refused with the flag's name, exit 2, before
anything is sent.

Before: ``check --window 0.001 --scrapes 100000`` sent 1,968 requests and counting;
``--interval 1e-9`` was taken by ``record``, ``simulate`` and ``whatif``."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from vllm_triage.commands.argtypes import MAX_SECONDS, MIN_SECONDS
from vllm_triage.config.schema import Duration

from support.clirun import vllm_triage
from support.daemonproc import GOOD
from support.localserver import Exchange, serving


class Counting:
    def __init__(self) -> None:
        self.requests = 0

    def __call__(self, x: Exchange) -> None:
        self.requests += 1
        x.reply(200, GOOD, content_type="text/plain; version=0.0.4")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--window", "0.001", "--scrapes", "100000"], "--window: must be from 0.05"),
        (["--window", "60", "--scrapes", "100000"], "--scrapes must be from 2 to 1,000"),
        (["--window", "1", "--scrapes", "1000"], "at least 0.05 s"),
        (["--window", "0.001"], "--window: must be from 0.05"),
        (["--timeout", "1e-9"], "--timeout: must be from 0.05"),
        (["--window", "1e300"], "--window: must be from 0.05"),
        (["--scrapes", "1"], "--scrapes must be from 2"),
    ],
    ids=[
        "window-1ms-100000-scrapes",
        "100000-scrapes",
        "scrapes-1ms-apart",
        "window-1ms",
        "timeout-1ns",
        "window-1e300",
        "one-scrape",
    ],
)
def test_check_refuses_before_sending_anything(tmp_path: Path, args: list[str], says: str) -> None:
    server_counts = Counting()
    with serving(server_counts) as server:
        out = vllm_triage("check", server.url("/metrics"), *args, cwd=tmp_path)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert server_counts.requests == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["record", "http://127.0.0.1:1/metrics", "--out", "rec", "--interval", "1e-9"],
        ["record", "http://127.0.0.1:1/metrics", "--out", "rec", "--timeout", "inf"],
        [
            "simulate",
            "--scenario",
            "healthy",
            "--record",
            "r",
            "--duration",
            "5",
            "--interval",
            "0",
        ],
        ["whatif", "--target", "http://127.0.0.1:1/metrics", "--interval", "0.001"],
        ["whatif", "--target", "http://127.0.0.1:1/metrics", "--window", "7200"],
        ["run", "--target", "http://127.0.0.1:1/metrics", "--interval", "nan"],
    ],
    ids=[
        "record-interval",
        "record-timeout",
        "simulate",
        "whatif-interval",
        "whatif-window",
        "run",
    ],
)
def test_an_interval_out_of_bounds_is_refused(tmp_path: Path, argv: list[str]) -> None:
    out = vllm_triage(*argv, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "must be" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "rec").exists() and not (tmp_path / "r").exists()


def test_the_bounds_are_the_settings_bounds() -> None:
    """The same durations as config/schema.py's: one rule for a flag and a key."""
    _, field = get_args(Duration)
    assert (field.metadata[0].ge, field.metadata[1].le) == (MIN_SECONDS, MAX_SECONDS)
