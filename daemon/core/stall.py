"""The stall judgement, made before any other cause (``docs/physics.md``, "stalled").

A hung engine freezes every gauge at its last value and stops every counter, so the
other signals are stale or empty, and it explains every symptom the users feel. While
the engine shows no progress with work outstanding it is ``stalled`` once that has
lasted long enough, and until then nothing is judged (held); for one window after a
stall ends its delayed observations are still in the histograms, so nothing else is
judged on them either.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_triage.core.checks import confidence_of
from vllm_triage.core.facts import rounded
from vllm_triage.core.model import Diagnosis, Progress, Signals
from vllm_triage.core.rulebook import Rulebook


def stall_breach_seconds(rules: Rulebook, interval: float | None, open_after: int) -> float:
    """Seconds without progress from which an evaluation is a ``stalled`` breach.

    The incident tracker fires after ``open_after`` breached evaluations; a stall is
    already a test of persistence, so waiting ``open_after`` more scrape intervals on top
    would only delay the worst incident. The breach therefore starts that many intervals
    early, so the alert fires at ``stall_after_seconds`` (never earlier than half of it).
    """
    after = rules.thresholds.stall_after_seconds
    lead = (open_after - 1) * (interval or 0.0)
    return max(after - lead, after / 2)


@dataclass(frozen=True, slots=True)
class _Stall:
    progress: Progress
    breach_at: float
    stalled: bool  # no progress with work outstanding for breach_at seconds
    frozen: bool  # no progress with work outstanding, not (yet) that long
    aftermath: bool  # a stall ended inside the window


def _stall(s: Signals, rules: Rulebook, open_after: int) -> _Stall | None:
    p = s.progress
    if p is None:
        return None
    breach_at = stall_breach_seconds(rules, p.interval_seconds, open_after)
    without = p.seconds_without_progress
    return _Stall(
        progress=p,
        breach_at=breach_at,
        stalled=without > 0 and without >= breach_at,
        frozen=without > 0,
        aftermath=p.previous_stall_seconds is not None and p.previous_stall_seconds >= breach_at,
    )


def _stall_evidence(
    s: Signals, st: _Stall, rules: Rulebook
) -> dict[str, float | int | str | bool | None]:
    p = st.progress
    ev: dict[str, float | int | str | bool | None] = {
        "seconds_without_progress": p.seconds_without_progress,
        "stall_after_seconds": rules.thresholds.stall_after_seconds,
        "last_progress_at": p.last_progress_at,
        "requests_running": p.running,
        "requests_waiting": p.waiting,
        "probe_unanswered_seconds": p.probe_unanswered_seconds,
        "probe_last_reason": p.probe_last_reason,
        "progress_series_checked": ",".join(p.checked),
        **{f"last_{name}": value for name, value in p.last_values.items()},
        "scrape_interval_seconds": p.interval_seconds,
        "previous_stall_seconds": p.previous_stall_seconds,
        "previous_stall_ended_seconds_ago": p.previous_stall_ended_seconds_ago,
        "window_seconds": s.span_seconds,
    }
    return rounded(ev)


def _stalled(s: Signals, st: _Stall, rules: Rulebook) -> Diagnosis:
    p = st.progress
    outstanding = p.outstanding
    gauges = None if outstanding is None else outstanding > 0
    probe = p.probe_unanswered_seconds
    probe_check = None if probe is None and p.probe_last_reason is None else probe is not None
    checks: list[bool | None] = [True, gauges, probe_check, "iterations" in p.checked]
    without = p.seconds_without_progress
    if gauges:
        owed = (
            f"{p.running or 0:g} requests running and {p.waiting or 0:g} waiting "
            "(gauges frozen at the last engine update)"
        )
    else:
        owed = f"a one-token probe unanswered for {probe or 0:.0f} s while the gauges say idle"
    summary = (
        f"engine made no progress for {without:.0f} s with {owed}: no tokens, no engine "
        "steps; /metrics still answers, so the API server lives and the engine does not"
    )
    evidence = _stall_evidence(s, st, rules)
    evidence["breaches"] = "no_progress"
    return Diagnosis(
        model_name=s.model_name,
        at=s.at,
        breaches=("no_progress",),
        cause="stalled",
        confidence=confidence_of(checks),
        summary=summary,
        evidence=evidence,
        secondary=(),
        remediation=rules.remediation.get("stalled", ()),
        present=("stalled",),
    )


def _held(s: Signals, st: _Stall, rules: Rulebook) -> Diagnosis:
    """Nothing judged: the engine is not moving, yet not for long enough to call it
    stalled (held: no verdict at all), or the window still holds a stall's delayed
    observations (clear: the stall is over, and they are its)."""
    p = st.progress
    if st.frozen:
        summary = (
            f"no engine progress for {p.seconds_without_progress:.0f} s with work "
            f"outstanding: the gauges are frozen, so no other cause is judged on them; "
            f"stalled from {st.breach_at:.0f} s"
        )
    else:
        summary = (
            f"the engine resumed {p.previous_stall_ended_seconds_ago or 0:.0f} s ago after "
            f"{p.previous_stall_seconds or 0:.0f} s without progress: this window's "
            "latencies still hold the stall, so they are not judged until it has passed"
        )
    return Diagnosis(
        model_name=s.model_name,
        at=s.at,
        breaches=(),
        cause=None,
        summary=summary,
        evidence=_stall_evidence(s, st, rules),
        # Frozen: no verdict yet, so an open incident is neither resolved nor advanced (a
        # hang would otherwise "resolve" it). After a stall: clear, so the stall resolves.
        held=st.frozen,
    )


def stall_diagnosis(s: Signals, rules: Rulebook, open_after: int) -> Diagnosis | None:
    """``stalled``, or a diagnosis that judges nothing (the engine frozen but not yet for
    long enough, or a stall just over); None when the engine steps or its progress is
    not known, and the symptoms are judged as usual."""
    stall = _stall(s, rules, open_after)
    if stall is None:
        return None
    if stall.stalled:
        return _stalled(s, stall, rules)
    if stall.frozen or stall.aftermath:
        return _held(s, stall, rules)
    return None
