"""The post-mortem report's document: a recording replayed through the core, every
evaluation charted and every incident told (``page.document`` gives it its shape).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_triage import __version__
from vllm_triage.core.counts import counted
from vllm_triage.core.drive import Driver
from vllm_triage.core.evaluate import Evaluator
from vllm_triage.core.model import Transition
from vllm_triage.core.report import iso
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.core.series import Ring
from vllm_triage.core.timeline import incidents, median_interval, scrape_gaps, setting_values
from vllm_triage.page.document import (
    ERA_TEXT,
    base_document,
    ceiling_text,
    duration,
    section,
)
from vllm_triage.page.spec import load_spec
from vllm_triage.recording.files import recording_files
from vllm_triage.recording.replay import Skipped, fed
from vllm_triage.rules import runtime_table


@dataclass(frozen=True, slots=True)
class ReportParts:
    """What a report is made with (the assembly builds them from the settings)."""

    rulebook: Rulebook
    evaluator: Evaluator
    #: The settings the diagnosis used, as ``[key, value]`` rows.
    settings_rows: list[list[str]]


#: Unusable files named in a report (all are counted).
SKIPPED_LISTED = 50
#: A recording's own notes, if whoever made it left them (the committed ones do).
NOTES_FILE = "RECORDED.json"


def _notes(directory: Path) -> dict[str, Any]:
    try:
        notes = json.loads((directory / NOTES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return notes if isinstance(notes, dict) else {}


#: Gaps named one by one in a report's facts (all are counted).
GAPS_LISTED = 5


def gaps_text(times: list[float]) -> str:
    """The recording's stretches without a scrape: how many, how long in all, and the
    first few with their times; "none" when every scrape came on time."""
    gaps = scrape_gaps(times)
    if not gaps:
        return "none"
    missing = sum(b - a for a, b in gaps)
    listed = ", ".join(f"{iso(a)} to {iso(b)} ({duration(b - a)})" for a, b in gaps[:GAPS_LISTED])
    more = f", and {len(gaps) - GAPS_LISTED} more" if len(gaps) > GAPS_LISTED else ""
    return f"{counted(len(gaps), 'gap')} ({duration(missing)} without a scrape): {listed}{more}"


def report_document(directory: str | Path, parts: ReportParts, *, now: float) -> dict[str, Any]:
    """Replay a recording through the core and describe everything it did."""
    spec = load_spec()
    folder = Path(directory)
    rules = parts.rulebook
    # Each model's points are kept whole, as the evaluation gave them (float64).
    listing = recording_files(folder)
    capacity = max(1, len(listing))
    points: dict[str, Ring] = {}
    transitions: list[Transition] = []
    skipped: list[list[str]] = []
    eras: Counter[str] = Counter()
    prefixes: Counter[str] = Counter()
    files: list[float] = []
    for item in fed(folder, Driver(parts.evaluator, runtime_table()), listing):
        if isinstance(item, Skipped):
            files.append(item.at)
            skipped.append([item.path.name, item.reason])
            continue
        snapshot, evaluation = item.snapshot, item.evaluation
        files.append(snapshot.at)
        eras[snapshot.era] += 1
        prefixes[snapshot.prefix] += 1
        if not evaluation.accepted:
            skipped.append([f"{round(snapshot.at * 1000)}.prom", "out of order"])
            continue
        for model, d in evaluation.diagnoses.items():
            ring = points.get(model)
            if ring is None:
                ring = points[model] = Ring(spec.measured_keys, capacity, typecode="d")
            ring.append(evaluation.at, evaluation.measurements.get(model, {}), d.cause)
        transitions.extend(evaluation.transitions)
    found = incidents(transitions)
    start, end = files[0], files[-1]
    notes = _notes(folder)
    interval = median_interval(files)
    doc = base_document(
        spec,
        mode="report",
        title=f"vllm-triage report: {folder.resolve().name}",
        subtitle=(
            f"{iso(start)} to {iso(end)} ({duration(end - start)}): "
            f"{counted(len(found), 'incident')}"
        ),
        now=now,
    )
    era_text = "; ".join(
        f"{ERA_TEXT.get(e, e)} in {counted(n, 'scrape')}" for e, n in eras.most_common()
    )
    version = notes.get("vllm")
    doc["range"] = [start, end]
    doc["facts"] = [
        ["recording", str(folder)],
        ["span", f"{iso(start)} to {iso(end)} ({duration(end - start)})"],
        ["scrapes", f"{counted(len(files), 'file')}, {len(skipped)} not usable"],
        ["scrape interval", "unknown" if interval is None else f"{interval:g} s (median)"],
        ["scrape gaps", gaps_text(sorted(files))],
        ["vLLM", str(version) if version else f"not recorded; the metric names say {era_text}"],
        ["metric names", era_text or "none readable"],
        ["decode ceiling", ceiling_text(rules)],
        ["generated by", f"vllm-triage {__version__} at {iso(now)}"],
    ]
    if any(p for p in prefixes):
        doc["facts"].insert(6, ["prefix", ", ".join(sorted(p for p in prefixes if p))])
    doc["settings"] = parts.settings_rows
    # A recording of thousands of unusable files lists the first ones and counts the rest.
    doc["skipped"] = skipped[:SKIPPED_LISTED]
    doc["skipped_count"] = len(skipped)
    constants = setting_values(rules)
    for n, (model, ring) in enumerate(sorted(points.items()), start=1):
        mine = [t for t in transitions if t.model_name == model]
        part = section(
            spec,
            doc,
            sid=f"m{n}",
            title=f"model {model or '(no model_name)'}",
            window=ring.window(),
            transitions=mine,
            found=[i for i in found if i.model_name == model],
            settings_values=constants,
        )
        count = len(part["incidents"])
        part["state_text"] = counted(count, "incident")
        doc["sections"].append(part)
    if not points:
        doc["empty"] = "No scrape of this recording could be evaluated (see the files below)."
    return doc
