"""Which commit this vllm-triage was built from, for ``--version``.

In order: a source checkout asks git (the package sits in ``daemon/``, beside ``pyproject.toml`` in
a git work tree: an editable install, or ``python -m vllm_triage.cli`` in the repository); an
installed copy reads ``_commit.txt``, which ``setup.py`` writes into the wheel when it is built from
a git checkout (``pip install .`` in a clone); ``pip install git+URL@REF`` leaves the commit in the
install's ``direct_url.json`` (PEP 610). Anything else (a source archive without ``.git``) says so
rather than guess."""

from __future__ import annotations

import json
import subprocess
from importlib import metadata, resources
from pathlib import Path

DIST = "vllm-triage"
COMMIT_FILE = "_commit.txt"


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _from_checkout() -> str | None:
    root = Path(__file__).resolve().parents[2]  # daemon/vllm_triage/buildinfo.py
    if not (root / "pyproject.toml").is_file() or not (root / ".git").exists():
        return None
    sha = _git(root, "rev-parse", "--short=12", "HEAD")
    if sha is None:
        return None
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return f"{sha}+dirty" if dirty else sha


def _from_build() -> str | None:
    try:
        text = resources.files("vllm_triage").joinpath(COMMIT_FILE).read_text(encoding="utf-8")
    except (OSError, ModuleNotFoundError):
        return None
    return text.strip() or None


def _from_direct_url() -> str | None:
    try:
        raw = metadata.distribution(DIST).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    try:
        info = json.loads(raw or "{}")
    except ValueError:
        return None
    commit = info.get("vcs_info", {}).get("commit_id") if isinstance(info, dict) else None
    return str(commit)[:12] if commit else None


def commit() -> str | None:
    """The commit, 12 hex digits (``+dirty`` for a checkout with uncommitted changes)."""
    return _from_checkout() or _from_build() or _from_direct_url()


def version_line(version: str) -> str:
    """What ``vllm-triage --version`` prints."""
    sha = commit()
    return f"vllm-triage {version} ({f'commit {sha}' if sha else 'commit unknown'})"
