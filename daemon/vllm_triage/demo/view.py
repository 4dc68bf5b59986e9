"""The live demo's terminal view: plain text from the daemon's published state (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_triage.core.counts import counted
from vllm_triage.core.incidents import Active, State
from vllm_triage.core.model import Diagnosis, Quantile, Signals, Transition
from vllm_triage.state import TargetState, View


@dataclass(frozen=True, slots=True)
class DemoTarget:
    state: TargetState
    scenario: str
    phase: str


def _clock(seconds: float) -> str:
    m, s = divmod(int(max(seconds, 0)), 60)
    return f"{m:02d}:{s:02d}"


def _q(q: Quantile | None, unit: str = " s") -> str:
    if q is None:
        return "n/a"
    above = ">" if q.position == "above_last_bound" else ""
    return f"{above}{q.value:.3g}{unit}"


def _num(x: float | None, fmt: str = ".3g", suffix: str = "") -> str:
    return "n/a" if x is None else f"{x:{fmt}}{suffix}"


def _signals_lines(s: Signals, evidence: dict[str, object]) -> list[str]:
    lines = [
        f"TTFT p99 {_q(s.ttft_p99)}   ITL p99 {_q(s.itl_p99)}   "
        f"waiting {_num(s.waiting_mean, '.1f')}   running {_num(s.running_mean, '.1f')}   "
        f"KV {_num(None if s.kv_usage_max is None else 100 * s.kv_usage_max, '.0f', ' %')} peak"
    ]
    rate = s.decode_tokens_per_second_per_stream
    ceiling = evidence.get("decode_ceiling_tokens_per_second")
    ratio = evidence.get("decode_ceiling_ratio")
    line = f"decode {_num(rate, '.3g')} tok/s per stream"
    if isinstance(ceiling, float) and isinstance(ratio, float):
        line += f" = {ratio:.2f} of the {ceiling:.3g} tok/s ceiling ({evidence.get('gpu', '?')})"
    lines.append(line)
    return lines


def _incident_lines(
    view: View, model: str, incident: Active, d: Diagnosis, start_at: float
) -> list[str]:
    """An open incident: firing (with this evaluation's evidence and fix), or clearing
    (the SLOs are met again and it resolves after ``resolve_after`` clear evaluations)."""
    since = _clock(incident.started_at - start_at)
    head = f"    diagnosis: {incident.cause.upper()} (since {since})"
    if view.states.get(model) is State.RESOLVING:
        n = view.clear_runs.get(model, 0)
        m = view.resolve_needed.get(model, view.resolve_after)
        return [
            f"{head}, clearing: {n} of {counted(m, 'clear evaluation')}",
            f"      the SLOs are met again; it resolves after {m} in a row",
        ]
    if d.cause is not None and d.cause != incident.cause:
        return [f"{head}, firing; this evaluation points at {d.cause}"]
    if d.cause is None and d.inconclusive:
        return [f"{head}, firing; this evaluation could not judge it", f"      {d.summary}"]
    lines = [f"{head}, firing, confidence {d.confidence:.2f}"]
    if d.summary:
        lines.append(f"      {d.summary}")
    lines.extend(f"      fix: {item}" for item in d.remediation[:2])
    return lines


def _transition_line(t: Transition, start_at: float) -> str:
    when = _clock(t.at - start_at)
    if t.event == "firing" and t.previous_cause is not None:
        return (
            f"{when}  FIRING    {t.cause:<13}  (cause changed from {t.previous_cause}) {t.change}"
        )
    if t.event == "firing":
        return f"{when}  FIRING    {t.cause:<13}  {t.diagnosis.summary}"
    return f"{when}  RESOLVED  {t.cause:<13}  after {t.at - t.started_at:.0f} s"


def render(
    targets: Sequence[DemoTarget],
    *,
    sim_seconds: float,
    total_seconds: float,
    speed: float,
    metrics_url: str,
    delivered: int,
    start_at: float,
) -> str:
    out = [
        f"vllm-triage demo: a simulated vLLM at {speed:g}x speed -> the daemon -> "
        "a local webhook receiver",
        f"  status page      {metrics_url}/",
        f"  derived metrics  {metrics_url}/metrics",
        f"  diagnoses (JSON) {metrics_url}/api/v1/diagnoses",
        f"  simulated time   {_clock(sim_seconds)} of {_clock(total_seconds)}   "
        f"notifications delivered: {delivered}",
        "",
    ]
    recent: list[tuple[str, Transition]] = []
    for dt in targets:
        st = dt.state
        health = "up" if st.up else f"DOWN ({st.last_error or 'not scraped yet'})"
        out.append(f"target {st.name} [{dt.scenario}]  {health}  scrapes {st.scrapes}")
        out.append(f"  now playing: {dt.phase}")
        view = st.view
        if view is not None:
            active = {a.model_name: a for a in view.active}
            for model, d in sorted(view.evaluation.diagnoses.items()):
                out.append(f"  model {model or '(no model_name)'}")
                signals = view.evaluation.signals[model]
                out.extend("    " + line for line in _signals_lines(signals, dict(d.evidence)))
                incident = active.get(model)
                if incident is None:
                    verdict = "healthy" if not d.breaches else f"breaching {', '.join(d.breaches)}"
                    out.append(f"    diagnosis: {verdict}")
                else:
                    out.extend(_incident_lines(view, model, incident, d, start_at))
        recent.extend((st.name, t) for t in st.recent)
        out.append("")
    out.append("last transitions:")
    recent.sort(key=lambda item: item[1].at)
    out.extend(f"  [{name}] {_transition_line(t, start_at)}" for name, t in recent[-8:])
    if not recent:
        out.append("  (none yet: an incident fires after its breach persists)")
    return "\n".join(out)


def status_lines(state: TargetState, *, start_at: float) -> list[str]:
    """One line per model for a log that scrolls (the demo off a terminal): the signals
    the diagnosis reads, and what it makes of them."""
    view = state.view
    if view is None:
        return [
            f"[{state.name}] not scraped yet"
            + (f": {state.last_error}" if state.last_error else "")
        ]
    active = {a.model_name: a for a in view.active}
    out = []
    for model, d in sorted(view.evaluation.diagnoses.items()):
        s = view.evaluation.signals[model]
        kv = None if s.kv_usage_max is None else 100 * s.kv_usage_max
        incident = active.get(model)
        if incident is None:
            verdict = "healthy" if not d.breaches else f"breaching {', '.join(d.breaches)}"
        elif view.states.get(model) is State.RESOLVING:
            n = view.clear_runs.get(model, 0)
            of = counted(view.resolve_after, "clear evaluation")
            verdict = f"{incident.cause} clearing, {n} of {of}"
        else:
            verdict = f"{incident.cause} firing"
        out.append(
            f"[{state.name}] {_clock(view.evaluation.at - start_at)}  "
            f"TTFT p99 {_q(s.ttft_p99)}  ITL p99 {_q(s.itl_p99)}  "
            f"waiting {_num(s.waiting_mean, '.1f')}  running {_num(s.running_mean, '.0f')}  "
            f"KV {_num(kv, '.0f', ' %')} peak  "
            f"decode {_num(s.decode_tokens_per_second_per_stream, '.3g')} tok/s per stream  "
            f"-> {verdict}"
        )
    return out
