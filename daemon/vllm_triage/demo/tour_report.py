"""Where the live demo's post-mortem lives: the daemon records each simulated server it
scrapes (``run --record``, ``scrape.keep``), and when the demo ends the report of one of
them is written beside its recording (``vllm-triage report``).

The folder is kept, and named with its size when the demo ends: it holds the report the
demo points to (open it in a browser after the demo has gone), and the recordings for
``replay`` and ``report`` by hand. Deleting it at exit would delete the page the demo
has just told you to open.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

from vllm_triage.atomic import write_atomically
from vllm_triage.config.schema import Settings

#: What a diagnosis of a recording depends on (the daemon's own keys left out).
DIAGNOSIS_KEYS = {"window_seconds", "slo", "incident", "thresholds", "hardware", "model"}


def demo_folder(chosen: Path | None = None) -> Path:
    """``chosen`` (``demo --record DIR``), made if need be, else a new temporary folder
    for this run's recordings and report (nothing of another run's)."""
    if chosen is not None:
        chosen.mkdir(parents=True, exist_ok=True)
        return chosen
    return Path(tempfile.mkdtemp(prefix="vllm-triage-demo-"))


def folder_size(folder: Path) -> int:
    """The bytes of the regular files under ``folder`` (what deleting it frees)."""
    total = 0
    for p in folder.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:
            continue  # gone meanwhile: nothing to count
    return total


def write_diagnosis_settings(settings: Settings, path: Path) -> Path:
    """``settings``' diagnosis keys as a --config file (written whole, or not at all)."""
    doc = settings.model_dump(mode="json", include=DIAGNOSIS_KEYS, exclude_none=True)
    return write_atomically(
        path,
        "# The settings the live demo's daemon diagnosed this target with: give them to\n"
        "# `vllm-triage replay` or `report` (--config) to be told what its alerts said.\n"
        + yaml.safe_dump(doc, sort_keys=True),
    )
