"""Run the installed ``vllm-triage`` command as a user would: a subprocess, from a
directory outside the checkout, with a time limit."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The script pip installed beside this interpreter (a venv), else the one on PATH.
_SIBLING = Path(sys.executable).parent / "vllm-triage"
COMMAND = _SIBLING if _SIBLING.exists() else Path(shutil.which("vllm-triage") or _SIBLING)


#: How long a command may run before the test calls it hung: a guard, not a measure. A
#: command that takes seconds on an idle machine can take minutes beside busy jobs (the
#: whole tour offline, 5 s of CPU, took 98 s at a load average of 13 on 2 cores).
HANG_S = 600.0


def vllm_triage(
    *args: str, cwd: Path, timeout: float = HANG_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``env`` is added to this process's environment; ``timeout`` guards against a hang."""
    return subprocess.run(
        [str(COMMAND), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


def stderr_lines(proc: subprocess.Popen[str], deadline: float) -> Iterator[str]:
    """The child's stderr lines as they come, until ``deadline`` (monotonic) or EOF."""
    assert proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                return
            line = proc.stderr.readline()
            if not line:
                return
            yield line


def spawn(cwd: Path, *args: str) -> subprocess.Popen[str]:
    """The command in the background, its JSON log lines on a stderr pipe (stdout ignored)."""
    return subprocess.Popen(
        [str(COMMAND), *args],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_event(proc: subprocess.Popen[str], event: str, timeout: float) -> dict[str, object]:
    """The child's first JSON log line of ``event``; the test fails (the child killed)
    when none comes within ``timeout`` seconds."""
    for line in stderr_lines(proc, time.monotonic() + timeout):
        if f'"event": "{event}"' in line:
            found: dict[str, object] = json.loads(line)
            return found
    proc.kill()
    pytest.fail(f"no {event} within {timeout} s (exit {proc.wait(5)})")


def stop(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """Stop a child as a service manager would: SIGTERM, then SIGKILL after ``timeout``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
