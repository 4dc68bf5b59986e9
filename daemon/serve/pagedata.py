"""The page's document: from a recording (the report) or from the daemon's state (the live
status page, ``/api/v1/series``). Both have one shape, so one template draws both:

    {mode, title, subtitle, generated_at, generated_at_unix, range: [from, to],
     facts: [[label, text]], settings: [[key, text]], links: [[text, href]],
     causes: {cause: {label, color}}, panels: [...], deciding: {cause: [...]},
     sections: [{id, title, state_text, firing, note, settings_values: {key: value},
                 t: [unix s], values: {key: [number | null]}, causes: [cause | null],
                 evaluations, thinned,
                 incidents: [{id, cause, start, end, breach_began, confidence, summary,
                              breaches, evidence, secondary, contributing:
                              [{cause, share, evidence}], remediation, opened_as,
                              segments: [{start, end, cause}], changes: [{at, from, to,
                              why}], opened_because, closed_because}],
                 transitions: [{at, event, cause, reason, text}]}],
     skipped: [[file, reason]]}

Times are unix seconds; values are rounded to four significant digits for the page (the
evidence of each incident is kept as the diagnosis gave it).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from vllm_triage import __version__
from vllm_triage.assemble import build_evaluator, build_rulebook
from vllm_triage.config.schema import Settings
from vllm_triage.core.model import Reason, Transition
from vllm_triage.core.report import iso
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.core.timeline import (
    Incident,
    breach_began,
    for_display,
    incidents,
    median_interval,
    point_values,
    setting_values,
)
from vllm_triage.net.redact import safe_url
from vllm_triage.page.spec import PageSpec, load_spec
from vllm_triage.recording.replay import Skipped, snapshots
from vllm_triage.serve.history import Window
from vllm_triage.state import TargetState

#: What each naming era of vLLM's metrics says about the server's version (README,
#: "vLLM versions").
ERA_TEXT: dict[str, str] = {
    "v0": "vLLM 0.4 to 0.8 (V0 metric names)",
    "transitional": "vLLM 0.9 to 0.14 (old and new metric names)",
    "v1": "vLLM 0.15 or later (V1 metric names)",
    "unknown": "unknown (no naming era recognised)",
}
#: What the status page links to (all on the daemon's listener).
LIVE_LINKS = ("/metrics", "/api/v1/diagnoses", "/api/v1/series", "/healthz", "/readyz")
#: Unusable files named in a report (all are counted).
SKIPPED_LISTED = 50
#: A recording's own notes, if whoever made it left them (the committed ones do).
NOTES_FILE = "RECORDED.json"


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _settings_rows(settings: Settings) -> list[list[str]]:
    """The settings the diagnosis used (not the daemon's targets or receivers)."""
    doc = settings.model_dump(
        mode="json",
        include={"window_seconds", "slo", "incident", "thresholds", "hardware", "model"},
    )
    rows: list[list[str]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif value is not None:
            rows.append([prefix, str(value)])

    walk("", doc)
    return rows


def _ceiling_text(rules: Rulebook) -> str:
    c = rules.ceiling
    if c is None:
        return "unknown: no hardware and model set"
    return (
        f"{c.tokens_per_second:.3g} tok/s per stream on {c.gpu} ({c.memory_bandwidth_gb_s:g} GB/s)"
    )


def _base(spec: PageSpec, *, mode: str, title: str, subtitle: str, now: float) -> dict[str, Any]:
    return {
        "schema": 1,
        "mode": mode,
        "title": title,
        "subtitle": subtitle,
        "generated_at": iso(now),
        "generated_at_unix": now,
        "range": None,
        "facts": [],
        "settings": [],
        "links": [],
        "causes": {name: style.model_dump() for name, style in spec.causes.items()},
        "panels": [p.model_dump() for p in spec.panels],
        "deciding": {c: [d.model_dump() for d in items] for c, items in spec.deciding.items()},
        "sections": [],
        "skipped": [],
    }


def _incident_json(
    spec: PageSpec,
    doc: dict[str, Any],
    index: str,
    i: Incident,
    *,
    times: Sequence[float],
    causes: Sequence[str | None],
) -> dict[str, Any]:
    segments = i.segments()
    for cause in {i.cause, *i.diagnosis.secondary, *(c for _, _, c in segments)}:
        doc["causes"].setdefault(cause, spec.cause_style(cause).model_dump())
    d = i.diagnosis
    return {
        "id": index,
        "cause": i.cause,
        "model_name": i.model_name,
        "start": i.started_at,
        "end": i.ended_at,
        # When the cause changed, the breach began under the previous incident: only an
        # incident that opened from clear has a lead-up of its own.
        "breach_began": (
            breach_began(times, causes, i.started_at)
            if i.opened_because is not Reason.CAUSE_CHANGED
            else None
        ),
        "confidence": d.confidence,
        "summary": d.summary,
        "breaches": list(d.breaches),
        "evidence": {k: v for k, v in d.evidence.items() if v is not None},
        "secondary": list(d.secondary),
        "contributing": [
            {"cause": c.cause, "share": c.share, "evidence": c.evidence} for c in d.contributing
        ],
        "remediation": list(d.remediation),
        "opened_as": i.opened_as or i.cause,
        "segments": [{"start": a, "end": b, "cause": c} for a, b, c in segments],
        "changes": [
            {"at": c.at, "from": c.previous, "to": c.cause, "why": c.why} for c in i.changes
        ],
        "opened_because": None if i.opened_because is None else str(i.opened_because),
        "closed_because": None if i.closed_because is None else str(i.closed_because),
    }


def _transition_json(t: Transition) -> dict[str, Any]:
    d = t.diagnosis
    if t.event == "firing" and t.previous_cause is not None and t.change:
        text = f"cause changed from {t.previous_cause}: {t.change}\n{d.summary}"
    elif t.event == "firing":
        text = d.summary
    else:
        why = "the cause changed" if t.reason == "cause_changed" else "clear again"
        text = f"resolved after {_duration(t.at - t.started_at)} ({why})"
    return {"at": t.at, "event": t.event, "cause": t.cause, "reason": str(t.reason), "text": text}


@dataclass(slots=True)
class _Points:
    """One model's evaluations, as they came."""

    keys: tuple[str, ...]
    times: list[float] = field(default_factory=list)
    columns: dict[str, list[float | None]] = field(default_factory=dict)
    causes: list[str | None] = field(default_factory=list)

    def add(self, at: float, values: Mapping[str, float], cause: str | None) -> None:
        self.times.append(at)
        for key in self.keys:
            self.columns.setdefault(key, []).append(values.get(key))
        self.causes.append(cause)


def _section(
    spec: PageSpec,
    doc: dict[str, Any],
    *,
    sid: str,
    title: str,
    window: Window | _Points,
    transitions: Sequence[Transition],
    found: Iterable[Incident],
    settings_values: Mapping[str, float],
) -> dict[str, Any]:
    keys = spec.measured_keys
    columns = {k: window.columns.get(k, [None] * len(window.times)) for k in keys}
    interval = median_interval(window.times)
    shown = for_display(
        window.times,
        columns,
        window.causes,
        max_points=spec.max_points,
        gap_seconds=None if interval is None else 2.5 * interval,
    )
    return {
        "id": sid,
        "title": title,
        "state_text": "",
        "firing": False,
        "note": "",
        "settings_values": dict(settings_values),
        "t": [round(t, 3) for t in shown.times],
        "values": {k: [_round(v) for v in col] for k, col in shown.columns.items()},
        "causes": shown.causes,
        "evaluations": shown.evaluations,
        "thinned": shown.thinned,
        "incidents": [
            _incident_json(spec, doc, f"{sid}-i{n}", i, times=window.times, causes=window.causes)
            for n, i in enumerate(found, start=1)
        ],
        "transitions": [_transition_json(t) for t in transitions],
    }


def _notes(directory: Path) -> dict[str, Any]:
    try:
        notes = json.loads((directory / NOTES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return notes if isinstance(notes, dict) else {}


def report_document(directory: str | Path, settings: Settings, *, now: float) -> dict[str, Any]:
    """Replay a recording through the core and describe everything it did."""
    spec = load_spec()
    folder = Path(directory)
    rules = build_rulebook(settings)
    evaluator = build_evaluator(settings, rules)
    points: dict[str, _Points] = {}
    transitions: list[Transition] = []
    skipped: list[list[str]] = []
    eras: Counter[str] = Counter()
    prefixes: Counter[str] = Counter()
    files: list[float] = []
    for item in snapshots(folder):
        files.append(item.at)
        if isinstance(item, Skipped):
            skipped.append([item.path.name, item.reason])
            continue
        eras[item.era] += 1
        prefixes[item.prefix] += 1
        evaluation = evaluator.step(item)
        if not evaluation.accepted:
            skipped.append([f"{round(item.at * 1000)}.prom", "out of order"])
            continue
        for model, d in evaluation.diagnoses.items():
            acc = points.setdefault(model, _Points(spec.measured_keys))
            values = point_values(evaluation.measurements[model], spec.measured_keys)
            acc.add(evaluation.at, values, d.cause)
        transitions.extend(evaluation.transitions)
    found = incidents(transitions)
    start, end = files[0], files[-1]
    notes = _notes(folder)
    interval = median_interval(files)
    doc = _base(
        spec,
        mode="report",
        title=f"vllm-triage report: {folder.resolve().name}",
        subtitle=(
            f"{iso(start)} to {iso(end)} ({_duration(end - start)}): {len(found)} "
            f"incident{'s' if len(found) != 1 else ''}"
        ),
        now=now,
    )
    era_text = "; ".join(f"{ERA_TEXT.get(e, e)} in {n} scrapes" for e, n in eras.most_common())
    version = notes.get("vllm")
    doc["range"] = [start, end]
    doc["facts"] = [
        ["recording", str(folder)],
        ["span", f"{iso(start)} to {iso(end)} ({_duration(end - start)})"],
        ["scrapes", f"{len(files)} files, {len(skipped)} not usable"],
        ["scrape interval", "unknown" if interval is None else f"{interval:g} s (median)"],
        ["vLLM", str(version) if version else f"not recorded; the metric names say {era_text}"],
        ["metric names", era_text or "none readable"],
        ["decode ceiling", _ceiling_text(rules)],
        ["generated by", f"vllm-triage {__version__} at {iso(now)}"],
    ]
    if any(p for p in prefixes):
        doc["facts"].insert(6, ["prefix", ", ".join(sorted(p for p in prefixes if p))])
    doc["settings"] = _settings_rows(settings)
    # A recording of thousands of unusable files lists the first ones and counts the rest.
    doc["skipped"] = skipped[:SKIPPED_LISTED]
    doc["skipped_count"] = len(skipped)
    constants = setting_values(rules)
    for n, (model, acc) in enumerate(sorted(points.items()), start=1):
        mine = [t for t in transitions if t.model_name == model]
        section = _section(
            spec,
            doc,
            sid=f"m{n}",
            title=f"model {model or '(no model_name)'}",
            window=acc,
            transitions=mine,
            found=[i for i in found if i.model_name == model],
            settings_values=constants,
        )
        count = len(section["incidents"])
        section["state_text"] = f"{count} incident{'s' if count != 1 else ''}"
        doc["sections"].append(section)
    if not points:
        doc["empty"] = "No scrape of this recording could be evaluated (see the files below)."
    return doc


def _display_url(url: str) -> str:
    """A target's address for people: no credentials, no query (it may carry a token)."""
    parts = urlsplit(safe_url(url))
    return urlunsplit(parts._replace(query="", fragment=""))


def _live_incidents(st: TargetState, model: str, since: float) -> list[Incident]:
    """Incidents of the last hour: from the transitions kept, plus any still open whose
    firing is no longer among them (a long incident)."""
    mine = [t for t in list(st.recent) if t.model_name == model]
    found = incidents(mine)
    view = st.view
    if view is not None:
        known = {(i.cause, i.started_at) for i in found if i.ended_at is None}
        d = view.evaluation.diagnoses.get(model)
        for a in view.active:
            if a.model_name == model and (a.cause, a.started_at) not in known and d is not None:
                found.append(
                    Incident(
                        model_name=model,
                        cause=a.cause,
                        started_at=a.started_at,
                        diagnosis=d,
                        opened_because=None,
                        opened_as=a.opened_as or a.cause,
                    )
                )
    return [i for i in found if i.ended_at is None or i.ended_at >= since]


def _state_text(st: TargetState, model: str) -> tuple[str, bool]:
    view = st.view
    if view is None:
        return "not evaluated yet", False
    d = view.evaluation.diagnoses.get(model)
    active = next((a for a in view.active if a.model_name == model), None)
    if active is not None:
        conf = f", confidence {d.confidence:.2f}" if d is not None else ""
        return f"now: {active.cause} firing since {iso(active.started_at)}{conf}", True
    if d is not None and d.breaches:
        return f"now: breaching {', '.join(d.breaches)} (not yet long enough to fire)", False
    return "now: healthy", False


def live_document(
    targets: Sequence[TargetState], *, now: float, settings: Settings | None = None
) -> dict[str, Any]:
    """The status page's document: every target's last hour."""
    spec = load_spec()
    since = now - spec.history_seconds
    up = sum(1 for t in targets if t.up)
    doc = _base(
        spec,
        mode="live",
        title="vllm-triage status",
        subtitle=f"{len(targets)} target{'s' if len(targets) != 1 else ''}, {up} up; "
        f"the last {_duration(spec.history_seconds)}",
        now=now,
    )
    doc["range"] = [since, now]
    # Relative links: the page works behind a proxy that serves it under a prefix.
    doc["links"] = [[route, route.lstrip("/")] for route in LIVE_LINKS]
    doc["facts"] = [["daemon", f"vllm-triage {__version__}"]]
    if settings is not None:
        doc["facts"].append(["scrape interval", f"{settings.interval_seconds:g} s"])
        doc["settings"] = _settings_rows(settings)
    doc["empty"] = "No target to show: give the daemon targets (README, Run it)."
    for n, st in enumerate(targets, start=1):
        health = "up" if st.up else f"DOWN: {st.last_error or 'not scraped yet'}"
        windows = st.history.windows(since) if st.history is not None else {}
        constants = st.history.settings_values if st.history is not None else {}
        models: list[str | None] = [*sorted(windows)] or [None]
        for k, model in enumerate(models, start=1):
            window = windows.get(model) if model is not None else None
            section = _section(
                spec,
                doc,
                sid=f"t{n}m{k}",
                title=st.name if model is None else f"{st.name} · {model or '(no model_name)'}",
                window=window or Window(times=[], columns={}, causes=[]),
                transitions=[t for t in list(st.recent) if t.model_name == model and t.at >= since],
                found=[] if model is None else _live_incidents(st, model, since),
                settings_values=constants,
            )
            section["state_text"], section["firing"] = (
                ("no model reported yet", False) if model is None else _state_text(st, model)
            )
            section["note"] = f"{_display_url(st.url)}: {health}; {st.scrapes} scrapes"
            doc["sections"].append(section)
    return doc
