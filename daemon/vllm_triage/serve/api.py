"""``/api/v1/diagnoses``: the current state per target and model, with the evidence, as JSON.

Every time in the document is ISO 8601 in UTC with milliseconds (``2026-01-01T00:04:05.000Z``):
when it was generated, scraped and evaluated, when incidents and transitions started and
happened, and the signals' ``at``. (``replay`` and ``check`` keep unix seconds in their
``at``: a recording's file names are unix milliseconds.)

Pure: built from the watchers' published state, so a test can check it without HTTP.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from vllm_triage.core.model import Transition
from vllm_triage.core.report import diagnosis_dict, iso, transition_dict
from vllm_triage.net.redact import safe_url
from vllm_triage.state import ProbeStats, StoreStatus, TargetState


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: a broken target's numbers become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def probe_json(p: ProbeStats) -> dict[str, Any]:
    return {
        "url": safe_url(p.url),
        "probes": p.probes,
        "failures": dict(p.failures),
        "in_flight": p.in_flight,
        "last_at": None if p.last_at is None else iso(p.last_at),
        "last_seconds": p.last_seconds,
        "last_reason": p.last_reason,
        "unanswered_since": None if p.unanswered_since is None else iso(p.unanswered_since),
    }


def _transition(tr: Transition, target: str) -> dict[str, Any]:
    """A transition with its times in the document's one style."""
    return {
        **transition_dict(tr, target=target),
        "at": iso(tr.at),
        "started_at": iso(tr.started_at),
    }


def target_json(t: TargetState) -> dict[str, Any]:
    out: dict[str, Any] = {
        "target": t.name,
        "url": t.url,
        "up": t.up,
        "scrapes": t.scrapes,
        "scrape_failures": dict(t.failures),
        "last_error": t.last_error or None,
        "last_scrape_at": None if t.last_scrape_at is None else iso(t.last_scrape_at),
        "last_success_at": None if t.last_success_at is None else iso(t.last_success_at),
        "ceiling": dataclasses.asdict(t.ceiling) if t.ceiling else None,
        "probe": probe_json(t.probe) if t.probe is not None else None,
        "models": [],
        # A copy first: the event loop may append while this (HTTP) thread reads.
        "recent_transitions": [_transition(tr, t.name) for tr in list(t.recent)],
    }
    view = t.view
    if view is None:
        return _finite(out)  # type: ignore[no-any-return]
    active = {a.model_name: a for a in view.active}
    ev = view.evaluation
    for model, d in sorted(ev.diagnoses.items()):
        incident = active.get(model)
        out["models"].append(
            {
                "model_name": model,
                "evaluated_at": iso(ev.at),
                "diagnosis": incident.cause if incident else "healthy",
                "incident_state": str(view.states.get(model, "clear")),
                "incident_started_at": iso(incident.started_at) if incident else None,
                # The alert identity: the cause the incident opened with (labels stay put).
                "incident_opened_as": (incident.opened_as or incident.cause) if incident else None,
                "current_cause": d.cause,
                **diagnosis_dict(d),
                "signals": {
                    **dataclasses.asdict(ev.signals[model]),
                    "at": iso(ev.signals[model].at),
                    # The engine by name (what its metrics mean is docs/engines.md's).
                    "runtime": ev.signals[model].runtime.name,
                },
            }
        )
    return _finite(out)  # type: ignore[no-any-return]


def diagnoses_json(
    targets: Iterable[TargetState],
    *,
    now: float,
    only: str | None = None,
    store: StoreStatus | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "generated_at": iso(now),
        "targets": [target_json(t) for t in targets if only is None or t.name == only],
    }
    if store is not None:
        # Whether a restart now would keep open incidents and undelivered notifications.
        doc["state_store"] = {
            "path": store.path,
            "durable": store.durable,
            "error": store.error or None,
            "write_failures": store.write_failures,
        }
    return doc
