"""The stall judgement, made before any other cause (``docs/physics.md``, "stalled").

A hung engine freezes every gauge at its last value and stops every counter, so the
other signals are stale or empty, and it explains every symptom the users feel. While
the engine shows no progress with work outstanding it is ``stalled`` once that has
lasted long enough, and until then nothing is judged (held); for one window after a
stall ends its delayed observations are still in the histograms, so nothing else is
judged on them either.

With data-parallel engines each one is judged on its own (the merged series move while
any one steps): the server is stalled when any engine with work outstanding is, and the
evidence names those engines (``stalled_engines``). A stall has a kind
(``stall_kind``), because its fix does:

- ``hung``: the engine stopped stepping (a stuck kernel or collective): dump and restart;
- ``asleep``: the engine is in vLLM's sleep mode while requests wait on it: wake it or
  route around it;
- ``stale_gauges``: the engine serves (tokens and steps flow) while its running, waiting
  and KV gauges sit frozen at non-zero values (vLLM issues #22545, #29928, after mass
  aborts): the gauges are wrong, so neither KV pressure nor queueing is judged from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_triage.core import predict
from vllm_triage.core.checks import breaches_of, confidence_of
from vllm_triage.core.counts import counted
from vllm_triage.core.facts import facts_of, rounded
from vllm_triage.core.model import Diagnosis, EvidenceValue, Progress, Signals
from vllm_triage.core.rulebook import Rulebook

#: Frozen gauges over this many scrapes while the counters move hold the judgement (the
#: gauges may be stale) until they are stale for ``stall_after_seconds``; one identical
#: pair of scrapes on a steady load is not enough to doubt them.
STILL_SCRAPES = 2


@dataclass(frozen=True, slots=True)
class _Stall:
    progress: Progress
    stalled: bool  # no progress with work outstanding for stall_after_seconds
    frozen: bool  # no progress with work outstanding, not (yet) that long
    aftermath: bool  # a stall ended inside the window
    kind: str  # hung, asleep or stale_gauges
    #: A stall ended inside the window that was already under way when watching began,
    #: seen for less than ``stall_after_seconds``: how long it really lasted is unknown.
    recovered: bool = False
    #: The engines stuck (data parallelism; empty for one engine), and of how many.
    engines: tuple[str, ...] = ()
    engines_total: int = 0


def _stall(s: Signals, rules: Rulebook) -> _Stall | None:
    p = s.progress
    if p is None:
        return None
    # The diagnosis is ``sustained``: the tracker opens on it at once, so the alert fires
    # at the first evaluation this long after the last progress, whatever the scrape pace.
    breach_at = rules.thresholds.stall_after_seconds
    without = p.seconds_without_progress
    stuck = tuple(e for e, sec in p.engines_without.items() if sec > 0)
    kind = "hung"
    if stuck and all(e in p.asleep for e in stuck):
        kind = "asleep"
    elif not stuck and without > 0 and p.asleep and not p.engines_without:
        kind = "asleep"  # one engine, asleep with work outstanding
    stale = p.gauges_still_seconds
    if without <= 0 and stale > 0:
        # Frozen gauges while the counters move: a stall of the gauges, not the engine.
        return _Stall(
            progress=p,
            stalled=stale >= breach_at,
            frozen=stale >= STILL_SCRAPES * (p.interval_seconds or 0.0),
            aftermath=False,
            kind="stale_gauges",
        )
    previous = p.previous_stall_seconds
    # A stall that just ended may show in no two snapshots (watching began in its last
    # seconds) but in the gap it left between two tokens of a running request: that long
    # without a step. Only when watching began inside this window (a stall watched from
    # its start was judged as one), and without preemptions in it (a preempted request
    # also waits between its tokens).
    gap = s.itl_longest_at_least
    young = p.watched_seconds is not None and p.watched_seconds <= s.span_seconds
    gap_stall = (
        young
        and gap is not None
        and gap >= rules.thresholds.stall_after_seconds
        and s.preemptions_per_second == 0
    )
    return _Stall(
        progress=p,
        stalled=without > 0 and without >= breach_at,
        frozen=without > 0,
        aftermath=previous is not None and previous >= breach_at,
        recovered=(previous is not None and previous < breach_at and p.previous_stall_censored)
        or gap_stall,
        kind=kind,
        engines=stuck,
        engines_total=len(p.engines_without),
    )


def _stall_evidence(s: Signals, st: _Stall, rules: Rulebook) -> dict[str, EvidenceValue]:
    p = st.progress
    ev: dict[str, EvidenceValue] = {
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
        "stall_kind": st.kind if st.stalled or st.frozen else None,
    }
    if st.engines_total:
        ev["stalled_engines"] = st.engines
        ev["engines_stalled"] = f"{len(st.engines)} of {counted(st.engines_total, 'engine')}"
    if p.asleep:
        ev["engines_asleep"] = tuple(f"{e}:{state}" for e, state in sorted(p.asleep.items()))
    if p.owed_asleep:
        ev["requests_owed_while_asleep"] = sum(p.owed_asleep.values())
    if st.kind == "stale_gauges":
        ev["gauges_still_seconds"] = p.gauges_still_seconds
    return rounded(ev)


def _stalled(s: Signals, st: _Stall, rules: Rulebook) -> Diagnosis:
    p = st.progress
    outstanding = p.outstanding
    gauges = None if outstanding is None else outstanding > 0
    probe = p.probe_unanswered_seconds
    probe_check = None if probe is None and p.probe_last_reason is None else probe is not None
    checks: list[bool | None] = [True, gauges, probe_check, "iterations" in p.checked]
    without = p.seconds_without_progress
    if st.engines and all(e in p.owed_asleep for e in st.engines) and not gauges:
        taken = round(sum(p.owed_asleep[e] for e in st.engines))
        owed = (
            f"{counted(taken, 'request')} taken by the API "
            "server and not finished since it fell asleep (its gauges, frozen, cannot show "
            "them)"
        )
    elif gauges:
        owed = (
            f"{counted(p.running or 0, 'request')} running and {p.waiting or 0:g} waiting "
            "(gauges frozen at the last engine update)"
        )
    else:
        owed = f"a one-token probe unanswered for {probe or 0:.0f} s while the gauges say idle"
    which = (
        f"engine {', '.join(st.engines)} "
        f"({len(st.engines)} of {counted(st.engines_total, 'engine')})"
        if st.engines_total
        else "engine"
    )
    own = s.runtime.fixes("stalled")
    remediation = own or rules.remediation.get("stalled", ())
    if st.kind == "stale_gauges":
        known = (
            " (vLLM's stale-gauge bug after mass aborts, issues #22545 and #29928)"
            if not own
            else ""
        )
        summary = (
            f"gauges stale for {p.gauges_still_seconds:.0f} s: {p.running or 0:g} running, "
            f"{p.waiting or 0:g} waiting and KV {p.last_values.get('kv_usage', 0):.0%} have not "
            f"moved while tokens and engine steps went on{known}; neither KV pressure nor "
            "queueing is judged from them"
        )
        checks = [True, gauges, probe_check is not True, None]
        if not own:
            remediation = rules.kind_remediation.get("stale_gauges", remediation)
    elif st.kind == "asleep":
        states = ", ".join(f"{e}: {state}" for e, state in sorted(p.asleep.items()))
        summary = (
            f"{which} asleep ({states}) for {without:.0f} s with {owed}: vLLM's sleep mode "
            "takes no steps until woken; not a hang"
        )
        remediation = rules.kind_remediation.get("asleep", remediation)
    else:
        summary = (
            f"{which} made no progress for {without:.0f} s with {owed}: no tokens, no "
            "engine steps; /metrics still answers, so the API server lives and the engine "
            "does not"
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
        remediation=remediation,
        present=("stalled",),
        sustained=True,
        # A hung engine serves nothing: no change of bytes or capacity has an effect
        # to predict until it steps again.
        remediation_effects=predict.unsized(
            remediation,
            "no_progress",
            "the engine is not stepping: there is no step or queue to predict from until it moves",
        ),
    )


def _held(s: Signals, st: _Stall, rules: Rulebook) -> Diagnosis:
    """Nothing judged: the engine is not moving, yet not for long enough to call it
    stalled (held: no verdict at all), or the window still holds a stall's delayed
    observations (clear: the stall is over, and they are its)."""
    p = st.progress
    if st.frozen and st.kind == "stale_gauges":
        summary = (
            f"the running, waiting and KV gauges have not moved for "
            f"{p.gauges_still_seconds:.0f} s while tokens flow: they may be stale, so no "
            f"cause is judged on them; stale from {rules.thresholds.stall_after_seconds:.0f} s"
        )
    elif st.frozen:
        summary = (
            f"no engine progress for {p.seconds_without_progress:.0f} s with work "
            f"outstanding: the gauges are frozen, so no other cause is judged on them; "
            f"stalled from {rules.thresholds.stall_after_seconds:.0f} s"
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


def stall_diagnosis(s: Signals, rules: Rulebook) -> Diagnosis | None:
    """``stalled``, or a diagnosis that judges nothing (the engine frozen but not yet for
    long enough, or a stall just over); None when the engine steps or its progress is
    not known, and the symptoms are judged as usual."""
    stall = _stall(s, rules)
    if stall is None:
        return None
    if stall.stalled:
        return _stalled(s, stall, rules)
    if stall.frozen or stall.aftermath:
        return _held(s, stall, rules)
    if stall.recovered:
        return _recovered(s, stall, rules)
    return None


def _recovered(s: Signals, st: _Stall, rules: Rulebook) -> Diagnosis | None:
    """A stall that has just ended, seen only in its last seconds (``check`` started as
    a hang ended; the daemon started, or came back, during one): the engine had made no
    progress with work outstanding since watching began, then moved. The requests that
    waited through it finish now with TTFTs (and inter-token gaps) as long as the stall,
    and the queue they sat in is already gone: that is the stall's doing, not a queue's
    or prefill's, so ``stalled`` is said, with the evidence that it is over. Without a
    latency breach there is nothing to explain: judged as usual (None)."""
    f = facts_of(s, rules)
    breaches = breaches_of(f)
    if not (f.ttft_breach or f.itl_breach):
        return None
    p = st.progress
    censored = p.previous_stall_censored and p.previous_stall_seconds is not None
    gap = s.itl_longest_at_least or 0.0
    seen = max(p.previous_stall_seconds or 0.0 if censored else 0.0, gap)
    ago = p.previous_stall_ended_seconds_ago
    ttft = s.ttft_p99.value if s.ttft_p99 is not None else None
    # Latencies longer than the stall was seen: the waits began before watching did.
    longer = None if ttft is None else ttft > seen
    nobody_waits = None if s.waiting_mean is None else s.waiting_mean < 1.0
    checks: list[bool | None] = [True, longer, nobody_waits]
    how = (
        "it was already still when watching began"
        if censored
        else f"an inter-token gap of at least {gap:.0f} s ended in the window"
    )
    if ago is None:
        when = "resumed inside the window"
    else:
        when = f"resumed {ago:.0f} s ago" if ago > 0 else "resumed by the last scrape"
    said = f"TTFT p99 {ttft:.0f} s" if f.ttft_breach and ttft is not None else "ITL p99"
    waiting = f"{s.waiting_mean:.1f}" if s.waiting_mean is not None else "unknown"
    summary = (
        f"stalled, recovered: no engine step for at least {seen:.0f} s with work "
        f"outstanding ({how}), then it {when}; the {said} is the requests that waited "
        f"through the stall, not a queue ({waiting} waiting in the window)"
    )
    evidence = _stall_evidence(s, st, rules)
    evidence.update(
        rounded(
            {
                "stall_recovered": True,
                "stall_seconds_at_least": seen,
                "stall_ended_seconds_ago": ago,
                "itl_longest_seconds_at_least": s.itl_longest_at_least,
                "ttft_p99_seconds": ttft,
                "requests_waiting_mean": s.waiting_mean,
                "stall_kind": st.kind,
            }
        )
    )
    evidence["breaches"] = ",".join(breaches)
    return Diagnosis(
        model_name=s.model_name,
        at=s.at,
        breaches=breaches,
        cause="stalled",
        confidence=confidence_of(checks),
        summary=summary,
        evidence=evidence,
        secondary=(),
        remediation=rules.remediation.get("stalled", ()),
        present=("stalled",),
    )
