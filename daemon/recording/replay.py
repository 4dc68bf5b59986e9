"""Running the core over a recording (``vllm_triage.recording.files``), file by file.

Files are taken in the order of their names' numbers, and each file's name is its scrape
time, so a replay sees exactly what the live daemon saw.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vllm_triage.core.evaluate import Evaluation, Evaluator
from vllm_triage.core.model import Snapshot
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.errors import ParseError
from vllm_triage.recording.files import recording_files


@dataclass(frozen=True, slots=True)
class Skipped:
    """A file of the recording that could not be used, and why."""

    path: Path
    at: float
    reason: str


def replay(directory: str | Path, evaluator: Evaluator) -> Iterator[Evaluation | Skipped]:
    """Run the core over a recording; yields one item per file."""
    for item in snapshots(directory):
        yield item if isinstance(item, Skipped) else evaluator.step(item)


def snapshots(directory: str | Path) -> Iterator[Snapshot | Skipped]:
    """A recording's files parsed, in order: one snapshot (or why not) per file."""
    parser = SnapshotParser()
    for at, path in recording_files(directory):
        try:
            body = path.read_bytes()
        except OSError as exc:
            yield Skipped(path, at, f"cannot read: {exc.strerror or exc}")
            continue
        try:
            yield parser.parse_bytes(body, at)
        except ParseError as exc:
            yield Skipped(path, at, str(exc))
