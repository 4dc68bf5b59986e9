"""The live status page's document: every target's last hour, from what the targets
published (``state``), shaped by ``page.document``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from vllm_triage import __version__
from vllm_triage.core.counts import counted
from vllm_triage.core.report import iso
from vllm_triage.core.series import ChartPoints
from vllm_triage.core.timeline import Incident, incidents
from vllm_triage.net.redact import safe_url
from vllm_triage.page.document import base_document, duration, section
from vllm_triage.page.spec import load_spec
from vllm_triage.state import ReceiverView, TargetState

#: What the status page links to (all on the daemon's listener).
LIVE_LINKS = ("/metrics", "/api/v1/diagnoses", "/api/v1/series", "/healthz", "/readyz")


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


def _delivery(r: ReceiverView) -> str:
    """Whether a receiver is reached: what it was sent, what failed, what waits."""
    st = r.stats
    health = "reached" if st.failed == 0 and (st.last_error == "" or st.sent) else "FAILING"
    if st.sent == 0 and st.failed == 0:
        health = "nothing sent yet"
    text = f"{health}: {st.sent} sent, {st.failed} failed, {r.pending} pending"
    if st.last_error and st.failed:
        text += f"; last error: {st.last_error[:120]}"
    return text


def live_document(
    targets: Sequence[TargetState],
    *,
    now: float,
    interval_seconds: float | None = None,
    settings_rows: list[list[str]] | None = None,
    receivers: Sequence[ReceiverView] = (),
) -> dict[str, Any]:
    """The status page's document: every target's last hour. ``interval_seconds`` and
    ``settings_rows``: what the daemon scrapes at and judges by, shown as facts;
    ``receivers``: whether its alerts are reaching anyone."""
    spec = load_spec()
    since = now - spec.history_seconds
    up = sum(1 for t in targets if t.up)
    doc = base_document(
        spec,
        mode="live",
        title="vllm-triage status",
        subtitle=f"{counted(len(targets), 'target')}, {up} up; "
        f"the last {duration(spec.history_seconds)}",
        now=now,
    )
    # The axis fits the data until an hour of it is there: three minutes after a start,
    # the charts span three minutes, not a sliver at the right of an empty hour.
    windows_of = [t.history.windows(since) if t.history is not None else {} for t in targets]
    first = min(
        (w.times[0] for windows in windows_of for w in windows.values() if w.times),
        default=since,
    )
    doc["range"] = [max(since, first), now]
    # Relative links: the page works behind a proxy that serves it under a prefix.
    doc["links"] = [[route, route.lstrip("/")] for route in LIVE_LINKS]
    doc["facts"] = [["daemon", f"vllm-triage {__version__}"]]
    if interval_seconds is not None:
        doc["facts"].append(["scrape interval", f"{interval_seconds:g} s"])
    steps = [t.history.step_seconds for t in targets if t.history is not None]
    if any(steps):
        # Fleet mode keeps each server's hour coarser (``History``): the page says so.
        doc["facts"].append(
            [
                "chart points",
                f"one per {duration(max(steps))} per server, the last evaluation of each "
                "(prometheus.history_step_seconds)",
            ]
        )
    if settings_rows is not None:
        doc["settings"] = settings_rows
    for r in receivers:
        doc["facts"].append([f"receiver {r.name}", _delivery(r)])
    if settings_rows is not None and not receivers:
        doc["facts"].append(["receivers", "none configured: incidents are shown, not sent"])
    doc["empty"] = "No target to show: give the daemon targets (README, Run it)."
    for n, (st, windows) in enumerate(zip(targets, windows_of, strict=True), start=1):
        health = "up" if st.up else f"DOWN: {st.last_error or 'not scraped yet'}"
        constants = st.history.settings_values if st.history is not None else {}
        models: list[str | None] = [*sorted(windows)] or [None]
        for k, model in enumerate(models, start=1):
            window = windows.get(model) if model is not None else None
            part = section(
                spec,
                doc,
                sid=f"t{n}m{k}",
                title=st.name if model is None else f"{st.name} · {model or '(no model_name)'}",
                window=window or ChartPoints(times=[], columns={}, causes=[]),
                transitions=[t for t in list(st.recent) if t.model_name == model and t.at >= since],
                found=[] if model is None else _live_incidents(st, model, since),
                settings_values=constants,
            )
            part["state_text"], part["firing"] = (
                ("no model reported yet", False) if model is None else _state_text(st, model)
            )
            part["note"] = f"{_display_url(st.url)}: {health}; {counted(st.scrapes, 'scrape')}"
            part["target"] = st.name  # what an alert's status_page link opens at
            doc["sections"].append(part)
    return doc
