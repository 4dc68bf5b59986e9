"""Reading a recording made by ``record`` and running the core over it, file by file.

A recording is a directory of ``<unix_time_ms>.prom`` files, each the raw body of one
scrape. Files are taken in the order of their names' numbers, and each file's name is its
scrape time, so a replay sees exactly what the live daemon saw.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from daemon.errors import ParseError, RecordingError
from daemon.evaluate import Evaluation, Evaluator
from daemon.parse import SnapshotParser

FILE_NAME = re.compile(r"^(\d{1,16})\.prom$")


def recording_files(directory: str | Path) -> list[tuple[float, Path]]:
    """The scrape files of a recording, oldest first, with their times in unix seconds."""
    d = Path(directory)
    if not d.exists():
        raise RecordingError(f"{d}: no such directory")
    if not d.is_dir():
        raise RecordingError(f"{d}: not a directory (give the folder that `record --out` wrote)")
    try:
        names = [p for p in d.iterdir() if FILE_NAME.match(p.name)]
    except OSError as exc:
        raise RecordingError(f"{d}: cannot list: {exc.strerror or exc}") from exc
    if not names:
        raise RecordingError(
            f"{d}: no <unix_time_ms>.prom files: not a recording made by `vllm-triage record`"
        )
    return sorted((int(FILE_NAME.match(p.name).group(1)) / 1000.0, p) for p in names)  # type: ignore[union-attr]


@dataclass(frozen=True, slots=True)
class Skipped:
    """A file of the recording that could not be used, and why."""

    path: Path
    at: float
    reason: str


def replay(directory: str | Path, evaluator: Evaluator) -> Iterator[Evaluation | Skipped]:
    """Run the core over a recording; yields one item per file."""
    parser = SnapshotParser()
    for at, path in recording_files(directory):
        try:
            body = path.read_bytes()
        except OSError as exc:
            yield Skipped(path, at, f"cannot read: {exc.strerror or exc}")
            continue
        try:
            snapshot = parser.parse_bytes(body, at)
        except ParseError as exc:
            yield Skipped(path, at, str(exc))
            continue
        yield evaluator.step(snapshot)
