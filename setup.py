"""Build hook: record the git commit a wheel is built from, for ``vllm-triage --version``.

Everything else about the build is in pyproject.toml. Built outside a git checkout (a
source archive), no file is written and ``--version`` says "commit unknown"
(daemon/vllm_triage/buildinfo.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


def _commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        done = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    if done.returncode != 0:
        return ""
    dirty = subprocess.run(
        ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    ).stdout.strip()
    return done.stdout.strip() + ("+dirty" if dirty else "")


class BuildPyWithCommit(build_py):
    def run(self) -> None:
        super().run()
        commit = _commit()
        if commit:
            target = Path(self.build_lib) / "vllm_triage" / "_commit.txt"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(commit + "\n", encoding="utf-8")


setup(cmdclass={"build_py": BuildPyWithCommit})
