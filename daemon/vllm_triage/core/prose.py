"""The words: the one-line summary of a diagnosis, and the line that shows each
contributing cause, in the units a person reads (percent, seconds, tokens per second).

Kept apart from the judgement so that what decides a cause and how it is said can change
independently; nothing here decides anything. The decode summary's verdict is
``decode.decode_split``'s, since the words follow from which limit was hit.
"""

from __future__ import annotations

from vllm_triage.core.decode import TERM_WORDS, decode_split
from vllm_triage.core.facts import Facts, frontend_bound, quantile_value
from vllm_triage.core.model import Cause, Signals
from vllm_triage.core.rulebook import Rulebook


def _fmt(x: float | None, unit: str = "", digits: int = 2) -> str:
    """Two significant digits unless asked: a summary is read, not parsed. An unknown
    number is said to be unknown, never shown as 0."""
    return "n/a" if x is None else f"{x:.{digits}g}{unit}"


def _preemptions(s: Signals) -> str:
    """``0.1/s preemptions, ``; nothing where the engine exports no preemption count
    (its limit says so in the evidence), never "n/a preemptions"."""
    if s.preemptions_per_second is None and s.runtime.limited("preemptions") is not None:
        return ""
    return f"{_fmt(s.preemptions_per_second, '/s')} preemptions, "


def finished_share(share: float, finished: float) -> str:
    """The prefill share as what it is: the time of the requests that finished in the
    window (prefill and decode times are both observed at a request's end), not the
    engine's time: a request still decoding when the window ends is not in it."""
    return f"{share:.0%} of the finished requests' time in prefill ({finished:.0f} finished)"


def summary(cause: Cause, s: Signals, f: Facts, rules: Rulebook) -> tuple[str, str | None]:
    """One line a person can act on, and (for decode) which limit was hit."""
    slo = rules.slo
    if cause == "kv_pressure":
        room = (
            f", room for {f.kv_headroom_requests:.1f} more requests of the current size"
            if f.kv_headroom_requests is not None
            else ""
        )
        return (
            f"KV cache ran out: {_preemptions(s)}"
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
            if frontend_bound(f):
                why = (
                    f"{f.render_share or 0:.0%} of it rendering in the API server (chat "
                    f"template, tokenization, multimodal preprocessing: "
                    f"{_fmt(s.render_time_mean, ' s')} mean) before the engine sees a request: "
                    "the frontend, not the GPU"
                )
            parts.append(
                f"TTFT p99 {_fmt(quantile_value(s.ttft_p99), ' s')} > "
                f"SLO {slo.ttft_p99_seconds:g} s, {why}"
            )
        elif f.waiting_sustained:
            parts.append(f"{f.waiting:.1f} requests wait behind prefill work")
        if f.itl_breach:
            parts.append(
                f"ITL p99 {_fmt(quantile_value(s.itl_p99), ' s')} > "
                f"SLO {slo.itl_p99_seconds:g} s while "
                f"p50 is {_fmt(quantile_value(s.itl_p50), ' s')}: prefill steps stall the streams "
                "(prefill interference)"
            )
        # What is unknown (the prompts' length, the prefill time) is left unsaid, never
        # printed as "n/a".
        known = (
            [f"{s.mean_prompt_tokens:,.0f}-token prompts"]
            if s.mean_prompt_tokens is not None
            else []
        )
        if s.prefill_time_mean is not None:
            known.append(f"prefill {_fmt(s.prefill_time_mean, ' s')} mean")
        if f.prefill_share is not None:
            known.append(finished_share(f.prefill_share, s.prefill_time_count))
        head = "; ".join(parts)
        return (f"{head}: {', '.join(known)}" if known else head), None
    head = f"ITL p99 {_fmt(quantile_value(s.itl_p99), ' s')} > SLO {slo.itl_p99_seconds:g} s"
    if s.decode_tokens_per_second_per_stream is not None:
        head += f": {_fmt(s.decode_tokens_per_second_per_stream, ' tok/s', 3)} per stream"
    elif "decode_tokens_per_second_per_stream" in s.missing:
        head += " (no decode speed: the window's steps carry prefill)"
    return decode_split(head, f.roofline, rules, s.dram_active_mean)


def contribution_evidence(cause: Cause, s: Signals, f: Facts, rules: Rulebook) -> str:
    """One line of what shows a contributing cause, in the units a person reads."""
    if cause == "kv_pressure":
        room = (
            f", room for {f.kv_headroom_requests:.1f} more requests"
            if f.kv_headroom_requests is not None
            else ""
        )
        return (
            f"KV {_fmt(s.kv_usage_max and s.kv_usage_max * 100, '%', 3)} used at peak, "
            f"{_preemptions(s).removesuffix(', ') or 'no preemption count'}{room}"
        )
    if cause == "queue_bound":
        return f"{f.waiting:.1f} requests waiting while the KV cache has room"
    if cause == "prefill_bound":
        if f.itl_breach and f.itl_spread is not None:
            return (
                f"ITL p99 {_fmt(quantile_value(s.itl_p99), ' s')} is {f.itl_spread:.1f}x p50: "
                "prefill chunks stall the decode steps they join"
            )
        ttft = f"TTFT p99 {_fmt(quantile_value(s.ttft_p99), ' s')}"
        if s.prefill_time_mean is None:
            return ttft
        return f"{ttft}, prefill {_fmt(s.prefill_time_mean, ' s')} mean"
    line = (
        f"ITL p50 {_fmt(f.itl_p50, ' s')} is {f.itl_p50 / rules.slo.itl_p99_seconds:.0%} of the "
        "ITL SLO: every token is slow, not only the spikes"
        if f.itl_p50 is not None
        else f"ITL p99 {_fmt(quantile_value(s.itl_p99), ' s')} over the SLO"
    )
    r = f.roofline
    if r is not None:
        line += (
            f"; a decode step takes {r.step_seconds * 1e3:.3g} ms, its hardware floor "
            f"{r.ratio:.0%} of that ({TERM_WORDS[r.dominant]})"
        )
    return line
