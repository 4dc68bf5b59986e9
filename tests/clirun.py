"""Run the installed ``vllm-triage`` command as a user would: a subprocess, from a
directory outside the checkout, with a time limit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

# The script pip installed beside this interpreter (a venv), else the one on PATH.
_SIBLING = Path(sys.executable).parent / "vllm-triage"
COMMAND = _SIBLING if _SIBLING.exists() else Path(shutil.which("vllm-triage") or _SIBLING)


def vllm_triage(*args: str, cwd: Path, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(COMMAND), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
