"""Signals -> Diagnosis: which SLO is breached, and why, following the physics.

First, is the engine stepping at all? ``stalled`` is checked before anything else
(``docs/physics.md``, "stalled"): a hung engine freezes every gauge at its last value and
stops every counter, so the other signals are stale or empty, and it explains every
symptom the users feel. While the engine shows no progress with work outstanding, and for
one window after a stall ends (its delayed observations are still in the histograms),
no other cause is judged.

Symptoms (what the user feels) are checked against the SLO: TTFT p99, ITL p99, sustained
waiting, and preemptions while the KV cache is tight. The *cause* is then chosen in causal
order (``docs/physics.md``, "The four causes"): KV pressure makes requests wait, waiting
inflates TTFT, and a long prefill stalls every decoding stream, so an earlier cause
explains a later symptom and wins:

0. ``stalled``: requests running or waiting (or a probe unanswered) and no progress at
   all for ``stall_after_seconds``.
1. ``kv_pressure``: requests wait or are preempted while the pool has room for less than
   one more request of the current average size (headroom counted in requests, not a
   fixed usage cut-off: in a small pool long requests leave it "full" well below 90 %).
2. ``queue_bound``: requests wait while the pool has room (a sequence or batch cap), or
   queue time is most of TTFT.
3. ``prefill_bound``: TTFT breached with the queue not to blame; or ITL breached while
   most engine time goes to prefill (prefill interference: the prompts, not decode).
4. ``decode_bound``: ITL breached, split by the decode step roofline (the step's floor
   over the measured step, ``vllm_triage.core.roofline``) into "at the hardware limit" and
   "below it: the serving stack".

Pure: the same ``Signals`` and ``Rulebook`` always give the same ``Diagnosis``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_triage.core import roofline
from vllm_triage.core.model import (
    CAUSES,
    Cause,
    Contribution,
    Diagnosis,
    Progress,
    Quantile,
    Signals,
)
from vllm_triage.core.roofline import StepRoofline
from vllm_triage.core.rulebook import Rulebook, Thresholds

#: The causes judged from the symptoms, in causal order (``stalled`` is judged first, alone).
SYMPTOM_CAUSES: tuple[Cause, ...] = tuple(c for c in CAUSES if c != "stalled")


def _value(q: Quantile | None) -> float | None:
    return q.value if q is not None else None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


@dataclass(frozen=True, slots=True)
class _Facts:
    """The derived numbers every cause is judged on; computed once per evaluation."""

    ttft_breach: bool
    itl_breach: bool
    waiting: float
    waiting_sustained: bool
    preempting: bool
    kv_headroom_requests: float | None
    kv_tight: bool | None
    queue_share: float | None
    prefill_share: float | None
    itl_spread: float | None
    itl_p50: float | None
    prompts: bool
    ceiling_ratio: float | None
    roofline: StepRoofline | None


def request_footprint_tokens(s: Signals) -> float | None:
    """KV tokens one more request will need: what finished requests grew to (prompt plus
    generated tokens), else what running requests hold now.

    Requests grow while they decode, and vLLM preempts when a growing request finds no free
    block; so "room for one more" must be judged against a request's final size, not the
    average size of requests that are still growing (seen on a real vLLM: waiting at 50 %
    usage with 1,500-token requests in a 2,048-token pool).
    """
    if s.mean_prompt_tokens is not None and s.mean_generation_tokens is not None:
        return s.mean_prompt_tokens + s.mean_generation_tokens
    if s.kv_pool_tokens and s.kv_usage_mean is not None and s.running_mean:
        return s.kv_usage_mean * s.kv_pool_tokens / s.running_mean
    return None


def _kv_headroom_requests(s: Signals) -> float | None:
    """Free KV tokens at the window's fullest moment, counted in requests
    (``docs/physics.md``, "The four causes").

    The fullest moment, not the mean: a window that starts idle averages a full pool down
    to half, while the requests that waited did so when it was full.
    """
    footprint = request_footprint_tokens(s)
    usage = s.kv_usage_max if s.kv_usage_max is not None else s.kv_usage_mean
    if not s.kv_pool_tokens or usage is None or not footprint or footprint <= 0:
        return None
    return (1.0 - usage) * s.kv_pool_tokens / footprint


def _queue_share(s: Signals) -> float | None:
    """Mean queue time over mean TTFT, when the two describe comparable requests.

    vLLM V1 observes TTFT at a request's first token but queue time when it finishes, so
    early in a burst the window holds many TTFTs and few queue times (seen on a real
    vLLM: "queue time 0 % of TTFT" with twelve requests waiting). The share is only
    taken when the queue times cover at least half as many requests as the TTFTs.
    """
    if s.queue_time_count < max(1.0, 0.5 * s.ttft_count):
        return None
    return _ratio(s.queue_time_mean, s.ttft_mean)


def _facts(s: Signals, rules: Rulebook) -> _Facts:
    slo, th = rules.slo, rules.thresholds
    ttft, itl = _value(s.ttft_p99), _value(s.itl_p99)
    waiting = s.waiting_mean or 0.0
    headroom = _kv_headroom_requests(s)
    kv_tight: bool | None
    if headroom is not None:
        kv_tight = headroom < th.kv_headroom_requests
    elif s.kv_usage_max is not None:
        kv_tight = s.kv_usage_max >= th.kv_usage_full
    else:
        kv_tight = None
    ratio = None
    if rules.ceiling is not None and s.decode_tokens_per_second_per_stream is not None:
        ratio = s.decode_tokens_per_second_per_stream / rules.ceiling.tokens_per_second
    hw = rules.roofline
    if hw is None and rules.ceiling is not None:
        hw = roofline.weights_only(rules.ceiling)
    return _Facts(
        ttft_breach=ttft is not None and ttft > slo.ttft_p99_seconds,
        itl_breach=itl is not None and itl > slo.itl_p99_seconds,
        waiting=waiting,
        waiting_sustained=waiting >= slo.waiting_requests,
        preempting=(s.preemptions_per_second or 0.0) > 0.0,
        kv_headroom_requests=headroom,
        kv_tight=kv_tight,
        queue_share=_queue_share(s),
        prefill_share=s.prefill_time_share,
        itl_spread=_ratio(itl, _value(s.itl_p50)),
        itl_p50=_value(s.itl_p50),
        prompts=(s.prompt_tokens_per_second or 0.0) > 0.0,
        ceiling_ratio=ratio,
        roofline=roofline.step_roofline(s, hw) if hw is not None else None,
    )


def _breaches(f: _Facts) -> tuple[str, ...]:
    out = []
    if f.ttft_breach:
        out.append("ttft_p99")
    if f.itl_breach:
        out.append("itl_p99")
    if f.waiting_sustained:
        out.append("waiting")
    if f.preempting and f.kv_tight is not False:
        out.append("kv_preemptions")
    return tuple(out)


def _checks(cause: Cause, f: _Facts, th: Thresholds) -> list[bool | None]:
    """The independent signals that support a cause; ``None`` where the data is missing.

    A cause is a candidate when its deciding check (the first one) holds; the fraction of
    its checks that hold is its confidence (a missing one counts half).

    Requests also wait when the engine is saturated by prefill work (a flood of long
    prompts uses the whole per-step token budget): that backlog is prefill-bound, not a
    sequence cap, so ``queue_bound`` gives way when prefill dominates engine time.
    """
    queue_dominant = None if f.queue_share is None else f.queue_share >= th.queue_share_of_ttft
    prefill_dominant = (
        None if f.prefill_share is None else f.prefill_share >= th.prefill_dominant_share
    )
    room = None if f.kv_tight is None else not f.kv_tight
    if cause == "kv_pressure":
        return [
            f.preempting or ((f.waiting > 0) and f.kv_tight is True),
            f.kv_tight,
            f.preempting,
            f.waiting > 0,
        ]
    if cause == "queue_bound":
        return [
            (f.waiting_sustained or (f.ttft_breach and queue_dominant is True))
            and room is not False
            and prefill_dominant is not True,
            room,
            f.waiting_sustained,
            queue_dominant,
            None if prefill_dominant is None else not prefill_dominant,
        ]
    spiky = None if f.itl_spread is None else f.itl_spread >= th.itl_spike_ratio
    interference = f.itl_breach and (prefill_dominant is True or (spiky is True and f.prompts))
    if cause == "prefill_bound":
        # TTFT is prefill's when nobody waits steadily (the queue is not to blame), or
        # when prefill is what the engine spends its time on (a prefill backlog).
        ttft_side = f.ttft_breach and (
            prefill_dominant is True or (not f.waiting_sustained and queue_dominant is not True)
        )
        backlog = f.waiting_sustained and prefill_dominant is True and room is not False
        return [
            ttft_side or backlog or interference,
            prefill_dominant,
            None if f.queue_share is None else not queue_dominant or prefill_dominant,
            spiky if f.itl_breach else None,
        ]
    # decode_bound: every token slow (p50 near p99), the engine busy decoding
    return [
        f.itl_breach and not interference,
        None if prefill_dominant is None else not prefill_dominant,
        None if spiky is None else not spiky,
        not f.waiting_sustained,
    ]


def _confidence(checks: list[bool | None]) -> float:
    score = sum(1.0 if c is True else 0.5 if c is None else 0.0 for c in checks)
    return round(score / len(checks), 2)


def _evidence(s: Signals, f: _Facts, rules: Rulebook) -> dict[str, float | int | str | bool | None]:
    ev: dict[str, float | int | str | bool | None] = {
        "window_seconds": s.span_seconds,
        "ttft_p99_seconds": _value(s.ttft_p99),
        "ttft_p99_position": s.ttft_p99.position if s.ttft_p99 else None,
        "ttft_p99_slo_seconds": rules.slo.ttft_p99_seconds,
        "ttft_mean_seconds": s.ttft_mean,
        "itl_p50_seconds": _value(s.itl_p50),
        "itl_p99_seconds": _value(s.itl_p99),
        "itl_p99_position": s.itl_p99.position if s.itl_p99 else None,
        "itl_p99_slo_seconds": rules.slo.itl_p99_seconds,
        "itl_mean_seconds": s.itl_mean,
        "requests_waiting_mean": s.waiting_mean,
        "requests_waiting_max": s.waiting_max,
        "requests_waiting_min": s.waiting_min,
        "requests_running_mean": s.running_mean,
        "kv_usage_mean": s.kv_usage_mean,
        "kv_usage_max": s.kv_usage_max,
        "kv_pool_tokens": s.kv_pool_tokens,
        "kv_headroom_requests": f.kv_headroom_requests,
        "preemptions_per_second": s.preemptions_per_second,
        "queue_time_mean_seconds": s.queue_time_mean,
        "queue_share_of_ttft": f.queue_share,
        "itl_p99_over_p50": f.itl_spread,
        "prefill_time_mean_seconds": s.prefill_time_mean,
        "prefill_time_share": f.prefill_share,
        "mean_prompt_tokens": s.mean_prompt_tokens,
        "mean_generation_tokens": s.mean_generation_tokens,
        "kv_request_footprint_tokens": request_footprint_tokens(s),
        "prompt_tokens_per_second": s.prompt_tokens_per_second,
        "generation_tokens_per_second": s.generation_tokens_per_second,
        "decode_tokens_per_second_per_stream": s.decode_tokens_per_second_per_stream,
    }
    if rules.ceiling is not None:
        ev["gpu"] = rules.ceiling.gpu
        ev["decode_ceiling_tokens_per_second"] = rules.ceiling.tokens_per_second
        ev["decode_ceiling_ratio"] = f.ceiling_ratio
    if f.roofline is not None:
        ev.update(roofline.evidence(f.roofline))
    return _rounded(ev)


def _fmt(x: float | None, unit: str = "", digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}{unit}"


def _summary(cause: Cause, s: Signals, f: _Facts, rules: Rulebook) -> tuple[str, str | None]:
    """One line a person can act on, and (for decode) which limit was hit."""
    slo = rules.slo
    if cause == "kv_pressure":
        room = (
            f", room for {f.kv_headroom_requests:.1f} more requests of the current size"
            if f.kv_headroom_requests is not None
            else ""
        )
        return (
            f"KV cache ran out: {_fmt(s.preemptions_per_second, '/s')} preemptions, "
            f"{f.waiting:.1f} requests waiting; KV "
            f"{_fmt(s.kv_usage_max and s.kv_usage_max * 100, '%', 3)} used at peak{room}",
            None,
        )
    if cause == "queue_bound":
        share = (
            f"queue time {f.queue_share:.0%} of TTFT, "
            if f.queue_share is not None and f.queue_share >= rules.thresholds.queue_share_of_ttft
            else ""
        )
        return (
            f"requests wait to start while KV has room: {f.waiting:.1f} waiting, {share}"
            f"KV {_fmt(s.kv_usage_mean and s.kv_usage_mean * 100, '%', 3)} used",
            None,
        )
    if cause == "prefill_bound":
        parts = []
        if f.ttft_breach:
            why = (
                f"{f.waiting:.1f} requests wait behind prefill work"
                if f.waiting_sustained
                else "with the queue not to blame"
            )
            parts.append(
                f"TTFT p99 {_fmt(_value(s.ttft_p99), ' s')} > SLO {slo.ttft_p99_seconds:g} s, {why}"
            )
        elif f.waiting_sustained:
            parts.append(f"{f.waiting:.1f} requests wait behind prefill work")
        if f.itl_breach:
            parts.append(
                f"ITL p99 {_fmt(_value(s.itl_p99), ' s')} > SLO {slo.itl_p99_seconds:g} s while "
                f"p50 is {_fmt(_value(s.itl_p50), ' s')}: prefill steps stall the streams "
                "(prefill interference)"
            )
        share = (
            f", {f.prefill_share:.0%} of engine time in prefill"
            if f.prefill_share is not None
            else ""
        )
        prompt = (
            f"{s.mean_prompt_tokens:,.0f}-token prompts"
            if s.mean_prompt_tokens is not None
            else "prompts"
        )
        return (
            "; ".join(parts) + f": {prompt}, prefill {_fmt(s.prefill_time_mean, ' s')} mean{share}",
            None,
        )
    head = (
        f"ITL p99 {_fmt(_value(s.itl_p99), ' s')} > SLO {slo.itl_p99_seconds:g} s: "
        f"{_fmt(s.decode_tokens_per_second_per_stream, ' tok/s', 3)} per stream"
    )
    return _decode_split(head, f.roofline, rules, s.dram_active_mean)


#: What each roofline term is, in the summary.
_TERM_WORDS = {
    "weights": "weight reads dominate",
    "kv": "KV cache reads dominate",
    "draft": "the draft model's reads dominate",
    "compute": "compute-bound: too many tokens per step",
}


@dataclass(frozen=True, slots=True)
class _Dram:
    """DCGM's measured memory activity against the roofline (``docs/physics.md``,
    "Measured memory activity"): a card busy reading memory is at its limit whatever the
    arithmetic estimates; ``agrees`` is False when the two tell different stories."""

    active: float
    busy: bool
    agrees: bool | None  # None: no roofline to compare with


def _dram(r: StepRoofline | None, active: float | None, th: Thresholds) -> _Dram | None:
    if active is None:
        return None
    busy = active >= th.dram_active_busy
    if r is None:
        return _Dram(active, busy, None)
    at_limit = th.near_ceiling_ratio <= r.ratio < th.roofline_impossible_ratio
    # A compute-bound step at its floor leaves the memory quiet: no contradiction.
    quiet = not busy and at_limit and r.bound_by == "compute"
    return _Dram(active, busy, busy == at_limit or quiet)


def _decode_split(
    head: str, r: StepRoofline | None, rules: Rulebook, dram_active: float | None = None
) -> tuple[str, str]:
    """Which limit a decode-bound server hit, from its step roofline
    (``docs/physics.md``, "The decode roofline") and, where DCGM measures it, the card's
    memory activity: a busy memory interface is the hardware limit whatever the floor."""
    th = rules.thresholds
    dram = _dram(r, dram_active, th)
    measured = "" if dram is None else f"; DCGM: memory busy {dram.active:.0%} of cycles"
    if r is None:
        if dram is not None and dram.busy:
            return (
                head
                + measured
                + ": at the hardware limit (measured; no floor: no hardware or model set)",
                "hardware",
            )
        return head + " (no hardware set: the decode step floor is unknown)" + measured, "unknown"
    gb = [f"{r.weight_bytes / 1e9:.3g} GB weights"]
    if r.kv_bytes is not None:
        gb.append(f"{r.kv_bytes / 1e9:.3g} GB KV")
    if r.draft_bytes:
        gb.append(f"{r.draft_bytes / 1e9:.3g} GB draft")
    where = (
        f"; a decode step takes {r.step_seconds * 1e3:.3g} ms against a floor of "
        f"{r.floor_seconds * 1e3:.3g} ms on {r.gpu} ({r.ratio:.0%}, {r.bound_by}-bound, "
        f"{' + '.join(gb)} per GPU per step)"
    )
    if r.left_out:
        where += "; left out: " + ", ".join(item.partition(":")[0] for item in r.left_out)
    where += measured
    if dram is not None and dram.busy and r.ratio < th.near_ceiling_ratio:
        return (
            head + where + ": at the hardware limit by measurement, though the floor is only "
            f"{r.ratio:.0%} of the step: the arithmetic misses reads (what it left out, or "
            "settings that undercount the bytes)",
            "hardware",
        )
    if r.ratio >= th.roofline_impossible_ratio:
        check = ", ".join(roofline.suspect_settings(r)[:3])
        if dram is not None and dram.busy:
            return (
                head + where + ": at the hardware limit by measurement; the floor is longer "
                f"than the step, so the hardware or model settings are wrong (check {check})",
                "hardware",
            )
        return (
            head + where + ": faster than the hardware allows, so the hardware or model "
            f"settings are wrong (check {check})",
            "unknown",
        )
    if r.ratio >= th.near_ceiling_ratio:
        verdict = f": at the hardware limit, {_TERM_WORDS[r.dominant]}"
        if dram is not None and dram.agrees is False:
            verdict += (
                f"; but the memory was busy only {dram.active:.0%} of cycles: the measurement "
                "and the arithmetic disagree (check the hardware and model settings)"
            )
        return head + where + verdict, "hardware"
    return (
        head + where + ": below it, the serving stack (per-step overhead, scheduling, "
        "prefill interference)",
        "serving_stack",
    )


def _decode_remediation(
    limit: str, r: StepRoofline | None, rules: Rulebook, generic: tuple[str, ...]
) -> tuple[str, ...]:
    """The decode fixes in the order the roofline says: the binding term's first at the
    limit, the serving stack's below it, the settings when the floor is impossible."""
    texts = rules.decode_remediation
    if r is None or not texts:
        # Below the ceiling the hardware is not the first thing to change.
        return generic[2:] + generic[:2] if limit == "serving_stack" else generic
    if limit == "hardware":
        order: tuple[str, ...] = roofline.terms_by_weight(r)
    elif limit == "serving_stack":
        order = ("serving_stack", r.dominant)
    else:
        order = ("settings",)
    picked = tuple(text for key in order for text in texts.get(key, ()))
    return picked or generic


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


def _rounded(
    ev: dict[str, float | int | str | bool | None],
) -> dict[str, float | int | str | bool | None]:
    # A NaN from a broken target must not reach JSON output or a webhook as "NaN".
    return {
        k: (float(f"{v:.6g}") if isinstance(v, float) else v)
        for k, v in ev.items()
        if v is not None and not (isinstance(v, float) and not math.isfinite(v))
    }


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
    return _rounded(ev)


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
        confidence=_confidence(checks),
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


#: How far below its own cut-off a symptom still counts as *present* (contributing, or
#: keeping an open incident's cause): half the ITL spike ratio, half the ITL SLO at p50
#: (``docs/physics.md``, "Contributing causes"). Looser than the deciding checks on
#: purpose: a cause whose number wanders around its cut-off is still there, and only a
#: cause that has gone by this margin lets an incident change cause at once.
PRESENCE = 0.5


def _present(cause: Cause, f: _Facts, check: list[bool | None], rules: Rulebook) -> bool:
    """Whether ``cause``'s symptoms are present this window (its deciding check, or the
    looser sign of it that the contributing list and the incident's hysteresis use)."""
    if check[0]:
        return True
    th = rules.thresholds
    if cause == "queue_bound":
        # A queue behind a prefill flood is prefill's doing, not a cap's (``_checks``).
        prefill_dominant = (f.prefill_share or 0.0) >= th.prefill_dominant_share
        return f.waiting_sustained and f.kv_tight is not True and not prefill_dominant
    if cause == "prefill_bound":
        return (
            f.itl_breach
            and f.prompts
            and f.itl_spread is not None
            and f.itl_spread >= th.itl_spike_ratio * PRESENCE
        )
    if cause == "decode_bound":
        return (
            f.itl_breach
            and f.itl_p50 is not None
            and f.itl_p50 >= rules.slo.itl_p99_seconds * PRESENCE
        )
    return False


def _contribution_evidence(cause: Cause, s: Signals, f: _Facts, rules: Rulebook) -> str:
    """One line of what shows a contributing cause, in the units a person reads."""
    if cause == "kv_pressure":
        room = (
            f", room for {f.kv_headroom_requests:.1f} more requests"
            if f.kv_headroom_requests is not None
            else ""
        )
        return (
            f"KV {_fmt(s.kv_usage_max and s.kv_usage_max * 100, '%', 3)} used at peak, "
            f"{_fmt(s.preemptions_per_second, '/s')} preemptions{room}"
        )
    if cause == "queue_bound":
        return f"{f.waiting:.1f} requests waiting while the KV cache has room"
    if cause == "prefill_bound":
        if f.itl_breach and f.itl_spread is not None:
            return (
                f"ITL p99 {_fmt(_value(s.itl_p99), ' s')} is {f.itl_spread:.1f}x p50: "
                "prefill chunks stall the decode steps they join"
            )
        ttft, prefill = _fmt(_value(s.ttft_p99), " s"), _fmt(s.prefill_time_mean, " s")
        return f"TTFT p99 {ttft}, prefill {prefill} mean"
    line = (
        f"ITL p50 {_fmt(f.itl_p50, ' s')} is {f.itl_p50 / rules.slo.itl_p99_seconds:.0%} of the "
        "ITL SLO: every token is slow, not only the spikes"
        if f.itl_p50 is not None
        else f"ITL p99 {_fmt(_value(s.itl_p99), ' s')} over the SLO"
    )
    r = f.roofline
    if r is not None:
        line += (
            f"; a decode step takes {r.step_seconds * 1e3:.3g} ms, its hardware floor "
            f"{r.ratio:.0%} of that ({_TERM_WORDS[r.dominant]})"
        )
    return line


def _contributing(
    *,
    primary: Cause,
    present: list[Cause],
    confidence: dict[Cause, float],
    s: Signals,
    f: _Facts,
    rules: Rulebook,
) -> tuple[Contribution, ...]:
    others = [c for c in present if c != primary]
    total = confidence[primary] + sum(confidence[c] for c in others)
    return tuple(
        Contribution(
            cause=c,
            share=round(confidence[c] / total, 2) if total > 0 else 0.0,
            evidence=_contribution_evidence(c, s, f, rules),
        )
        for c in others
    )


def _inconclusive(s: Signals) -> tuple[str, ...]:
    """The latency SLOs a window could not judge although work was in flight: a sparse
    load of long requests finishes too few of them in one window. Nothing in flight is an
    idle server, and an idle server is clear."""
    busy = (s.running_max or 0.0) > 0 or (s.waiting_max or 0.0) > 0
    if not busy:
        return ()
    return tuple(
        k for k in ("ttft_p99", "itl_p99") if s.missing.get(k, "").startswith("not enough data")
    )


def diagnose(
    s: Signals, rules: Rulebook, *, open_after: int = 1, keep: Cause | None = None
) -> Diagnosis:
    """Judge one model's signals against the SLO and name the cause.

    ``open_after`` is how many breached evaluations the caller's incident tracker waits
    for before it fires (1 for a one-off verdict): it sets when a stall starts to breach
    (``stall_breach_seconds``). ``keep`` is an open incident's cause: while its symptoms
    are still present it stays the primary cause, and the cause that led this window
    becomes a contributing one (``core.incidents`` decides when it has led long enough).
    """
    stall = _stall(s, rules, open_after)
    if stall is not None and stall.stalled:
        return _stalled(s, stall, rules)
    if stall is not None and (stall.frozen or stall.aftermath):
        return _held(s, stall, rules)
    f = _facts(s, rules)
    breaches = _breaches(f)
    if not breaches:
        # The roofline is worth watching while healthy too (how close to the hardware).
        steady = _rounded(roofline.evidence(f.roofline)) if f.roofline is not None else {}
        thin = _inconclusive(s)
        summary = (
            f"too few observations to judge {', '.join(thin)} while requests are in flight "
            f"({'; '.join(s.missing[k] for k in thin)})"
            if thin
            else ""
        )
        return Diagnosis(
            model_name=s.model_name,
            at=s.at,
            breaches=(),
            cause=None,
            summary=summary,
            evidence=steady,
            inconclusive=thin,
        )
    th = rules.thresholds
    checks = {cause: _checks(cause, f, th) for cause in SYMPTOM_CAUSES}
    candidates = [cause for cause in SYMPTOM_CAUSES if checks[cause][0]]
    if not candidates:
        # Every breach maps to a cause above; this only guards against a future symptom
        # without one. Fall back on the symptom itself rather than staying silent.
        candidates = ["decode_bound" if f.itl_breach else "queue_bound"]
    present = [c for c in SYMPTOM_CAUSES if c in candidates or _present(c, f, checks[c], rules)]
    cause = keep if keep in present and keep in SYMPTOM_CAUSES else candidates[0]
    confidence = {c: _confidence(checks[c]) for c in present}
    summary, limit = _summary(cause, s, f, rules)
    evidence = _evidence(s, f, rules)
    evidence["breaches"] = ",".join(breaches)
    if cause != candidates[0]:
        evidence["leading_cause"] = candidates[0]
    remediation = rules.remediation.get(cause, ())
    if limit is not None:
        evidence["decode_limit"] = limit
        dram = _dram(f.roofline, s.dram_active_mean, th)
        if dram is not None:
            evidence["decode_dram_active_ratio"] = round(dram.active, 4)
            if dram.agrees is not None:
                evidence["decode_dram_agrees_with_roofline"] = dram.agrees
        if f.roofline is not None and limit == "unknown":
            evidence["decode_settings_suspect"] = ", ".join(roofline.suspect_settings(f.roofline))
        remediation = _decode_remediation(limit, f.roofline, rules, remediation)
    contributing = _contributing(
        primary=cause, present=present, confidence=confidence, s=s, f=f, rules=rules
    )
    return Diagnosis(
        model_name=s.model_name,
        at=s.at,
        breaches=breaches,
        cause=cause,
        confidence=confidence[cause],
        summary=summary,
        evidence=evidence,
        secondary=tuple(c.cause for c in contributing),
        remediation=remediation,
        contributing=contributing,
        present=tuple(present),
    )


def measurements(s: Signals, rules: Rulebook) -> dict[str, float | int | str | bool | None]:
    """The numbers a diagnosis's evidence holds, for every evaluation, healthy ones too:
    what the report and the status page chart (``daemon/core/timeline.py``)."""
    return _evidence(s, _facts(s, rules), rules)
