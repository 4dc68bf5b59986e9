"""``vllm-triage run --record DIR`` as a user runs it: the installed daemon keeps each scrape
it takes in DIR/<target>/, in the format ``record`` writes, and ``report`` makes the
post-mortem of that folder (daemon/vllm_triage/commands/run.py, daemon/vllm_triage/scrape/keep.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from support.captures import fixture_text
from support.clirun import COMMAND, HANG_S, stop, vllm_triage
from support.harness import wait_for
from support.localserver import replies, serving

BODY = fixture_text("kvwarden-vllm-0.19.1-v1.txt").encode()


def test_run_record_keeps_the_daemons_scrapes_for_report(tmp_path: Path) -> None:
    folder = tmp_path / "rec" / "local"
    with serving(replies((200, BODY))) as srv:
        proc = subprocess.Popen(
            [
                str(COMMAND),
                "run",
                "--target",
                f"local={srv.url('/metrics')}",
                "--listen",
                "127.0.0.1:0",
                "--interval",
                "0.2",
                "--record",
                "rec",
            ],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
        )
        try:
            wait_for(
                lambda: len(list((tmp_path / "rec" / "local").glob("*.prom"))) >= 3, timeout=HANG_S
            )
        finally:
            stop(proc)
        served = len(srv.requests)
    assert proc.returncode == 0
    files = sorted(folder.glob("*.prom"))
    assert 3 <= len(files) <= served
    assert all(p.read_bytes() == BODY for p in files)
    report = vllm_triage("report", "rec/local", "--out", "local.html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "local.html").stat().st_size > 0


def test_run_help_names_record(tmp_path: Path) -> None:
    result = vllm_triage("run", "--help", cwd=tmp_path)
    assert "--record DIR" in result.stdout and "DIR/<target>/" in result.stdout
