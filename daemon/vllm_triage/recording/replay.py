"""Running the core over a recording (``recording.files``), file by file.

Files are taken in the order of their names' numbers, and each file's name is its scrape
time, so a replay sees exactly what the live daemon saw; each body goes through the same
``core.drive.Driver`` as every other loop that feeds the core.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vllm_triage.core.drive import Driver, Fed, Unusable
from vllm_triage.core.evaluate import Evaluation, Evaluator
from vllm_triage.recording.files import read_scrape, recording_files
from vllm_triage.rules import runtime_table


@dataclass(frozen=True, slots=True)
class Skipped:
    """A file of the recording that could not be used, and why."""

    path: Path
    at: float
    reason: str


def fed(
    directory: str | Path, driver: Driver, files: list[tuple[float, Path]] | None = None
) -> Iterator[Fed | Skipped]:
    """Each file of a recording read and judged, in order: the snapshot and evaluation it
    gave, or why it could not be used. ``files``: the recording's listing, when the caller
    already took it (a recording may grow while it is read)."""
    for at, path in recording_files(directory) if files is None else files:
        body = read_scrape(path)
        if isinstance(body, str):
            yield Skipped(path, at, body)
            continue
        result = driver.feed(body, at)
        yield Skipped(path, at, result.message) if isinstance(result, Unusable) else result


def replay(
    directory: str | Path, evaluator: Evaluator, *, runtime: str | None = None
) -> Iterator[Evaluation | Skipped]:
    """Run the core over a recording; yields one item per file. ``runtime``: the serving
    engine the recording must be (default: detected from each body)."""
    for item in fed(directory, Driver(evaluator, runtime_table(), named=runtime)):
        yield item if isinstance(item, Skipped) else item.evaluation
