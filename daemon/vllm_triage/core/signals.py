"""A window's totals read as signals: percentiles from bucket deltas, means from
delta-sum over delta-count, rates from counter increases over the window's span.

Percentiles are what ``histogram_quantile(q, increase(x_bucket[60s]))`` gives. This is the
one place the sidecar's window (``totals.Window``) and fleet mode's Prometheus totals
become ``Signals``, so both are judged on the same arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_triage.core.histogram import bucket_quantile, observations
from vllm_triage.core.model import Histogram, Quantile, Signals, WindowTotals

#: counter field -> the rate it gives, per second of the window's span.
_RATES = {
    "preemptions": "preemptions_per_second",
    "prompt_tokens": "prompt_tokens_per_second",
    "generation_tokens": "generation_tokens_per_second",
}
#: histogram field -> the mean (delta sum / delta count) it gives.
_MEANS = {
    "queue_time": "queue_time_mean",
    "prefill_time": "prefill_time_mean",
    "decode_time": "decode_time_mean",
    "prompt_length": "mean_prompt_tokens",
    "generation_length": "mean_generation_tokens",
}

#: Counter resets within one window that make its counters meaningless: one is a
#: restarted vLLM (counted from zero, as always); a second within the same window means
#: the counters go back and forth, as when a target's address reaches two servers in
#: turn, and every increase summed over them would be invented (44 times too high on one
#: such target). Its rates and latency histograms are then left out, and the signals say
#: why.
INCONSISTENT_RESETS = 2

#: Steps that compute at least this many times the tokens their running sequences
#: decode carry prefill work (as many prompt tokens as decoded ones, or more): their
#: inter-token gaps hold prefill time, so a decode speed read from them would be the mixed
#: steps' speed, not decode's (a ROCm report read a decode speed 2.7 times off that way).
#: Below it a prompt now and then joins a decode batch: a step of a few dozen more tokens
#: costs about what a decode step does (both read the same weights), so the gaps are
#: still decode's.
PREFILL_STEP_RATIO = 2.0


@dataclass(frozen=True, slots=True)
class _Latency:
    """A latency histogram's share of the signals: observations, mean and quantiles."""

    count: float = 0.0
    mean: float | None = None
    quantiles: dict[float, Quantile | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _EngineSteps:
    """What the window says about engine steps: tokens per step (``iteration_tokens``)
    and speculative decoding's drafts, from their window increases."""

    histogram: Histogram | None = None
    tokens_mean: float | None = None
    count: float = 0.0
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    tokens_per_step: float = 1.0

    @classmethod
    def of(
        cls, counters: dict[str, float], iteration: Histogram | None, gauge: float | None = None
    ) -> _EngineSteps:
        """``gauge``: the tokens per step the engine reports itself (SGLang's acceptance
        length, TensorRT-LLM's decoded tokens per iteration), used where it does not count
        its drafts; below one (SGLang reads 0 with speculative decoding off) it is one."""
        drafts = counters.get("spec_drafts")
        accepted = counters.get("spec_accepted_tokens")
        per_step = 1.0
        if drafts and accepted is not None:
            per_step = 1.0 + accepted / drafts
        elif gauge is not None and gauge > 1.0:
            per_step = gauge
        return cls(
            histogram=iteration,
            tokens_mean=(
                iteration.sum / iteration.count
                if iteration is not None and iteration.count > 0
                else None
            ),
            count=iteration.count if iteration is not None else 0.0,
            drafts=drafts,
            draft_tokens=counters.get("spec_draft_tokens"),
            accepted=accepted,
            tokens_per_step=per_step,
        )


def signals_from_totals(t: WindowTotals, min_observations: int) -> Signals:
    """A window's totals read as signals: rates over the span, means of deltas,
    quantiles of bucket deltas (``None`` fields say why in ``missing``).

    The one place both the sidecar's window and fleet mode's Prometheus totals become
    ``Signals``.
    """
    span = t.span_seconds
    missing: dict[str, str] = {}
    unexposed = f"not exposed by this {t.runtime.title}"
    for key, gauge in (
        ("running_mean", t.running),
        ("waiting_mean", t.waiting),
        ("kv_usage_mean", t.kv_usage),
    ):
        if gauge.mean is None:
            missing[key] = unexposed
    counters, hists = t.counters, t.histograms
    rates: dict[str, float | None] = dict.fromkeys(_RATES.values())
    ttft = itl = _Latency()
    means: dict[str, float | None] = dict.fromkeys(_MEANS.values())
    prefill_share: float | None = None
    prefill_count = 0.0
    if span <= 0:
        reason = "not enough data: one snapshot in the window, rates need two"
        for name in (*_RATES.values(), "ttft_p99", "itl_p99"):
            missing[name] = reason
    else:
        for name, key in _RATES.items():
            if name in counters:
                rates[key] = counters[name] / span
            else:
                missing[key] = unexposed
        ttft, why = _latency(hists.get("ttft"), (0.5, 0.9, 0.99), span, min_observations)
        why = unexposed if why == _UNEXPOSED else why
        if why is not None:
            missing["ttft_p99"] = why
        itl, why = _latency(hists.get("itl"), (0.5, 0.99), span, min_observations)
        why = unexposed if why == _UNEXPOSED else why
        if why is not None:
            missing["itl_p99"] = why
        for name, key in _MEANS.items():
            found = hists.get(name)
            if found is None:
                missing[key] = unexposed
            elif found.count > 0:
                means[key] = found.sum / found.count
            else:
                missing[key] = "not enough data: no requests finished in the window"
        pre, dec = hists.get("prefill_time"), hists.get("decode_time")
        if pre is not None and dec is not None and pre.sum + dec.sum > 0:
            # Both are observed when a request finishes: the share is that of the
            # requests finished in the window, not of the engine's time (a decode that
            # finishes after the window is not in it).
            prefill_share = pre.sum / (pre.sum + dec.sum)
            prefill_count = pre.count
    for name in t.layout_changed:
        missing[f"{name}_layout"] = "bucket bounds changed inside the window"
    if t.counter_resets >= INCONSISTENT_RESETS:
        why = (
            f"left out: the counters went backwards {t.counter_resets} times in the window "
            "(more than one server behind this target's address?)"
        )
        for name in (*_RATES.values(), "ttft_p99", "itl_p99", *_MEANS.values()):
            missing[name] = why
    queued = hists.get("queue_time") if span > 0 else None
    steps = _EngineSteps.of(
        dict(counters),
        hists.get("iteration_tokens") if span > 0 else None,
        t.tokens_per_step.mean,
    )
    if t.progress is None:
        missing["progress"] = t.progress_missing
    for name in t.runtime.absent:
        for key in _ABSENT_SIGNALS.get(name, ()):
            missing[key] = f"not exported by {t.runtime.shown}: unknown, not zero"
    step, source = _decode_step(t, itl.mean, steps.tokens_per_step)
    if step is None and source:
        missing["decode_step_seconds"] = source
    decode_rate: float | None = None
    if step is not None and step > 0:
        mixed = _steps_carry_prefill(t, steps, rates)
        if mixed is None:
            # A step may emit several tokens per request under speculative decoding: the
            # rate is tokens per step / step.
            decode_rate = steps.tokens_per_step / step
        else:
            missing["decode_tokens_per_second_per_stream"] = mixed

    return Signals(
        model_name=t.model_name,
        at=t.at,
        span_seconds=span,
        snapshots=t.snapshots,
        ttft_p50=ttft.quantiles.get(0.5),
        ttft_p90=ttft.quantiles.get(0.9),
        ttft_p99=ttft.quantiles.get(0.99),
        ttft_mean=ttft.mean,
        ttft_count=ttft.count,
        itl_p50=itl.quantiles.get(0.5),
        itl_p99=itl.quantiles.get(0.99),
        itl_mean=itl.mean,
        itl_count=itl.count,
        itl_longest_at_least=longest_at_least(hists.get("itl")) if span > 0 else None,
        queue_time_mean=means["queue_time_mean"],
        queue_time_count=queued.count if queued is not None else 0.0,
        render_time_mean=_mean(hists.get("render_time")) if span > 0 else None,
        render_count=hists["render_time"].count if span > 0 and "render_time" in hists else 0.0,
        prefill_time_mean=means["prefill_time_mean"],
        decode_time_mean=means["decode_time_mean"],
        prefill_time_share=prefill_share,
        prefill_time_count=prefill_count,
        running_mean=t.running.mean,
        running_max=t.running.max,
        waiting_mean=t.waiting.mean,
        waiting_max=t.waiting.max,
        waiting_min=t.waiting.min,
        waiting_first=t.waiting.first,
        waiting_last=t.waiting.last,
        kv_usage_mean=t.kv_usage.mean,
        kv_usage_max=t.kv_usage.max,
        preemptions_per_second=rates["preemptions_per_second"],
        prompt_tokens_per_second=rates["prompt_tokens_per_second"],
        generation_tokens_per_second=rates["generation_tokens_per_second"],
        mean_prompt_tokens=means["mean_prompt_tokens"],
        mean_generation_tokens=means["mean_generation_tokens"],
        decode_tokens_per_second_per_stream=decode_rate,
        kv_pool_tokens=t.kv_pool_tokens,
        progress=t.progress,
        missing=missing,
        engines=t.engines,
        engine_waiting_mean=t.engine_waiting_mean,
        engine_kv_usage_mean=t.engine_kv_usage_mean,
        iteration_tokens=steps.histogram,
        iteration_tokens_mean=steps.tokens_mean,
        running_busy_mean=t.running_busy_mean,
        kv_usage_busy_mean=t.kv_usage_busy_mean,
        iteration_steps=steps.count,
        spec_drafts=steps.drafts,
        spec_draft_tokens=steps.draft_tokens,
        spec_accepted_tokens=steps.accepted,
        decode_tokens_per_step=steps.tokens_per_step,
        dram_active_mean=t.dram_active_mean,
        counter_resets=t.counter_resets,
        kv_cache=t.kv_cache,
        estimated_read_bytes=counters.get("estimated_read_bytes") if span > 0 else None,
        estimated_flops=counters.get("estimated_flops") if span > 0 else None,
        runtime=t.runtime,
        step_seconds_mean=step,
        step_source=source if step is not None else "",
    )


#: A field a runtime's variant does not export -> the signals it would have given.
_ABSENT_SIGNALS: dict[str, tuple[str, ...]] = {
    "render_time": ("render_time_mean",),
    "prefill_time": ("prefill_time_mean",),
    "decode_time": ("decode_time_mean",),
    "queue_time": ("queue_time_mean",),
}


def _decode_step(
    t: WindowTotals, itl_mean: float | None, tokens: float
) -> tuple[float | None, str]:
    """The window's mean decode step, from what the engine measures, and what that is
    (or, with no step, why not). One inter-token observation is a step's gap (vLLM,
    LMDeploy), a token's (SGLang: times the tokens per step), or a request's mean at its
    end (TensorRT-LLM: its last-iteration latency gauge is the step instead)."""
    measures = t.runtime.itl_measures
    if measures == "step":
        return itl_mean, "the mean inter-token latency (one per request per engine step)"
    if measures == "token":
        if itl_mean is None:
            return None, ""
        return itl_mean * tokens, (
            f"the mean inter-token latency x {tokens:.3g} tokens per step "
            f"({t.runtime.title} observes its inter-token latency per token)"
        )
    gauge = t.step_seconds.mean
    if gauge is None:
        return None, (
            f"{t.runtime.title} observes each request's mean time per token at its end, and "
            "exported no step latency in the window's busy scrapes: the decode step is unknown"
        )
    return gauge, (
        f"{t.runtime.title}'s last-iteration latency, averaged over the scrapes with requests "
        "running"
    )


def _steps_carry_prefill(
    t: WindowTotals, steps: _EngineSteps, rates: dict[str, float | None]
) -> str | None:
    """Why the window's inter-token gaps are not decode's (its steps carry prefill), or
    None. From the tokens per step when the engine counts them, else from the prompt
    tokens computed against the tokens generated (the same ratio, read from rates)."""
    running = t.running_busy_mean if t.running_busy_mean is not None else t.running.mean
    if steps.tokens_mean is not None and running:
        decoded = running / max(1, t.engines) * steps.tokens_per_step
        ratio = steps.tokens_mean / decoded
        what = f"{steps.tokens_mean:.3g} tokens per step for {decoded:.3g} decoding"
    else:
        prompt, generated = rates["prompt_tokens_per_second"], rates["generation_tokens_per_second"]
        if prompt is None or not generated:
            return None
        ratio = 1.0 + prompt / generated
        what = f"{prompt:.3g} prompt tokens/s computed beside {generated:.3g} generated"
    if ratio < PREFILL_STEP_RATIO:
        return None
    return (
        f"left out: the window's steps carry prefill ({what}), so its inter-token gaps "
        "are mixed steps', not decode's"
    )


def longest_at_least(h: Histogram | None) -> float | None:
    """The lower bound of the highest bucket holding an observation of (delta) ``h``:
    its longest observation was at least that long. None when it holds none."""
    if h is None:
        return None
    below = 0.0
    found: float | None = None
    for i, c in enumerate(h.cumulative):
        if c > below:
            found = h.bounds[i - 1] if i > 0 else 0.0
        below = max(below, c)
    return found


def _mean(h: Histogram | None) -> float | None:
    return h.sum / h.count if h is not None and h.count > 0 else None


_UNEXPOSED = "not exposed"


def _latency(
    h: Histogram | None, qs: tuple[float, ...], span: float, min_observations: int
) -> tuple[_Latency, str | None]:
    """A latency histogram's observations, mean and quantiles, and why the quantiles are
    missing (``None`` when they are not)."""
    if h is None:
        return _Latency(), _UNEXPOSED
    n = observations(h)
    mean = h.sum / h.count if h.count > 0 else None
    if n < min_observations:
        why = f"not enough data: {n:g} observations in {span:g} s (need {min_observations})"
        return _Latency(count=n, mean=mean), why
    return _Latency(count=n, mean=mean, quantiles={q: bucket_quantile(q, h) for q in qs}), None
