"""Writing a report: the page with a recording's document inline, in one HTML file."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from vllm_triage.atomic import write_atomically
from vllm_triage.page.render import render_page
from vllm_triage.recording.report import ReportParts, report_document


@dataclass(frozen=True, slots=True)
class WrittenReport:
    path: Path
    size_bytes: int
    incidents: int
    evaluations: int
    skipped: int


def write_report(
    directory: str | Path, parts: ReportParts, out: str | Path, *, now: float | None = None
) -> WrittenReport:
    """Replay ``directory`` and write its report to ``out`` (whole, or not at all)."""
    doc = report_document(directory, parts, now=time.time() if now is None else now)
    page = render_page(doc, title=str(doc["title"]))
    path = Path(out)
    write_atomically(path, page)
    return WrittenReport(
        path=path,
        size_bytes=path.stat().st_size,
        incidents=sum(len(s["incidents"]) for s in doc["sections"]),
        evaluations=max((s["evaluations"] for s in doc["sections"]), default=0),
        skipped=int(doc["skipped_count"]),
    )
