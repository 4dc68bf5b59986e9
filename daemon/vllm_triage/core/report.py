"""Diagnoses and transitions as people and programs read them: text lines, or JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from vllm_triage.core.model import Diagnosis, Transition
from vllm_triage.core.predict import effect_dict, effect_text
from vllm_triage.core.shown import one_line


def iso(at: float) -> str:
    return (
        datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def diagnosis_dict(d: Diagnosis) -> dict[str, Any]:
    """One evaluation's verdict as JSON-ready values: the one shape ``replay``, the API
    and ``check`` all print."""
    evidence: dict[str, Any] = dict(d.evidence)
    if "breaches" in evidence:  # a list here as at the top level, not "a,b"
        evidence["breaches"] = list(d.breaches)
    return {
        "runtime": d.runtime,
        "confidence": d.confidence,
        "summary": d.summary,
        "breaches": list(d.breaches),
        "evidence": evidence,
        "remediation": list(d.remediation),
        "remediation_effects": [effect_dict(e) for e in d.remediation_effects],
        "secondary": list(d.secondary),
        "contributing": [
            {"cause": c.cause, "share": c.share, "evidence": c.evidence} for c in d.contributing
        ],
    }


def transition_dict(t: Transition, *, target: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "event": t.event,
        "reason": str(t.reason),
        "diagnosis": t.cause,
        "model_name": t.model_name,
        "at": t.at,
        "started_at": t.started_at,
        # The episode's alert identity, and for a change of cause what it replaced and why.
        "opened_as": t.identity_cause,
        "previous_diagnosis": t.previous_cause,
        "change": t.change or None,
        **diagnosis_dict(t.diagnosis),
    }
    if target is not None:
        out["target"] = target
    return out


def transition_json(t: Transition, *, target: str | None = None) -> str:
    return json.dumps(transition_dict(t, target=target), sort_keys=False, allow_nan=False)


def transition_text(t: Transition) -> str:
    """A transition as lines for a terminal: a peer's names are shown on one line, their
    control characters as escapes (a newline or a terminal's escape sequence in a
    ``model_name`` is shown, never obeyed)."""
    return "\n".join(one_line(line) for line in _transition_lines(t))


def _transition_lines(t: Transition) -> list[str]:
    d = t.diagnosis
    when = iso(t.at)
    model = t.model_name or "(no model_name)"
    if t.event == "firing":
        head = f"{when}  FIRING    {t.cause:<13}  {model}  confidence {d.confidence:.2f}"
        if t.previous_cause is not None:
            head += f"  (cause changed from {t.previous_cause})"
        lines = [head]
        if t.change:
            lines.append(f"    changed: {t.change}")
        lines.append(f"    {d.summary}")
        lines.extend(
            f"    also: {c.cause} ({c.share:.0%} of the evidence): {c.evidence}"
            for c in d.contributing
        )
        if d.secondary and not d.contributing:
            lines.append(f"    also: {', '.join(d.secondary)}")
        lines.extend(f"    fix: {item}" for item in d.remediation[:3])
        lines.extend(f"    effect: {effect_text(e)}" for e in d.remediation_effects[:3] if e.change)
        return lines
    lasted = t.at - t.started_at
    why = "cause changed" if t.reason == "cause_changed" else "clear again"
    opened = f", opened as {t.identity_cause}" if t.identity_cause != t.cause else ""
    return [f"{when}  RESOLVED  {t.cause:<13}  {model}  after {lasted:.0f} s ({why}{opened})"]
