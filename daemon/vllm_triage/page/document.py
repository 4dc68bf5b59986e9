"""The page's document, shaped from the core's results: one shape for the post-mortem
report (``recording.report``) and the live status page (``serve.status``), so one
template draws both:

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

Times are unix seconds; values are rounded to four significant digits for the page (the
evidence of each incident is kept as the diagnosis gave it). Pure: the callers drive the
core and hand over what it gave.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vllm_triage.core.model import Reason, Transition
from vllm_triage.core.predict import effect_dict, effect_text
from vllm_triage.core.report import iso
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.core.series import ChartPoints
from vllm_triage.core.timeline import (
    GAP_INTERVALS,
    Incident,
    breach_began,
    for_display,
    median_interval,
)
from vllm_triage.page.spec import PageSpec

#: What each naming era of vLLM's metrics says about the server's version (README,
#: "vLLM versions").
ERA_TEXT: dict[str, str] = {
    "v0": "vLLM 0.4 to 0.8 (V0 metric names)",
    "transitional": "vLLM 0.9 to 0.14 (old and new metric names)",
    "v1": "vLLM 0.15 or later (V1 metric names)",
    "unknown": "unknown (no naming era recognised)",
}


def rounded(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")


def duration(seconds: float) -> str:
    s = round(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def ceiling_text(rules: Rulebook) -> str:
    c = rules.ceiling
    if c is None:
        return "unknown: no hardware and model set"
    return (
        f"{c.tokens_per_second:.3g} tok/s per stream on {c.gpu} ({c.memory_bandwidth_gb_s:g} GB/s)"
    )


def base_document(
    spec: PageSpec, *, mode: str, title: str, subtitle: str, now: float
) -> dict[str, Any]:
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
    step: float = 0.0,
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
            breach_began(times, causes, i.started_at, step)
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
        # Each fix's predicted effect (or why none), in the fixes' order.
        "remediation_effects": [
            {**effect_dict(e), "text": effect_text(e)} for e in d.remediation_effects
        ],
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
        text = f"resolved after {duration(t.at - t.started_at)} ({why})"
    return {"at": t.at, "event": t.event, "cause": t.cause, "reason": str(t.reason), "text": text}


def section(
    spec: PageSpec,
    doc: dict[str, Any],
    *,
    sid: str,
    title: str,
    window: ChartPoints,
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
        gap_seconds=None if interval is None else GAP_INTERVALS * interval,
    )
    return {
        "id": sid,
        "title": title,
        "state_text": "",
        "firing": False,
        "note": "",
        "settings_values": dict(settings_values),
        "t": [round(t, 3) for t in shown.times],
        "values": {k: [rounded(v) for v in col] for k, col in shown.columns.items()},
        "causes": shown.causes,
        "evaluations": shown.evaluations,
        "thinned": shown.thinned,
        "incidents": [
            _incident_json(
                spec,
                doc,
                f"{sid}-i{n}",
                i,
                times=window.times,
                causes=window.causes,
                step=window.step,
            )
            for n, i in enumerate(found, start=1)
        ],
        "transitions": [_transition_json(t) for t in transitions],
    }
