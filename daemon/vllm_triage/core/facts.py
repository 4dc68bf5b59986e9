"""The numbers a window is judged on (``Facts``), and the evidence that names them.

Every cause's checks read the same few derived numbers: the KV headroom counted in
requests, the queue's share of TTFT, the ITL spread, the decode ceiling ratio and the
step roofline. They are derived here once per evaluation, so no two checks can disagree
on one of them. The evidence is those numbers and the signals behind them, under the
names the report, the API, /metrics and the status page use; ``measurements`` is its
numbers for any window, healthy ones too (``Evaluator`` computes them once per
evaluation, into ``Evaluation.measurements``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_triage.core import predict
from vllm_triage.core.model import Diagnosis, EvidenceValue, Quantile, Signals
from vllm_triage.core.roofline import step as roofline
from vllm_triage.core.roofline.step import StepRoofline
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.core.signals import INCONSISTENT_RESETS


def quantile_value(q: Quantile | None) -> float | None:
    """A percentile's value; None where the window had too few observations for one."""
    return q.value if q is not None else None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


@dataclass(frozen=True, slots=True)
class Facts:
    """The derived numbers every cause is judged on; computed once per evaluation."""

    ttft_breach: bool
    itl_breach: bool
    waiting: float
    waiting_sustained: bool
    preempting: bool
    kv_headroom_requests: float | None
    kv_tight: bool | None
    queue_share: float | None
    render_share: float | None
    prefill_share: float | None
    itl_spread: float | None
    itl_p50: float | None
    prompts: bool
    ceiling_ratio: float | None
    roofline: StepRoofline | None
    #: The pool is full while a latency SLO breaches, on an engine that exports no
    #: preemption count (LMDeploy, TensorRT-LLM): the preemptions it cannot show are
    #: judged from the usage alone (``docs/engines.md``).
    full_unseen_preemptions: bool = False


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


def _render_share(s: Signals) -> float | None:
    """Mean rendering in the API server over mean TTFT (TTFT = render + queue + prefill),
    when the two describe comparable requests: rendering is observed when a request
    reaches the engine, TTFT at its first token, so early in a burst the counts differ."""
    if s.render_time_mean is None or s.render_count < max(1.0, 0.5 * s.ttft_count):
        return None
    return _ratio(s.render_time_mean, s.ttft_mean)


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


def facts_of(s: Signals, rules: Rulebook) -> Facts:
    """One window's facts: every check reads these, never the signals again."""
    slo, th = rules.slo, rules.thresholds
    ttft, itl = quantile_value(s.ttft_p99), quantile_value(s.itl_p99)
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
    ttft_breach = ttft is not None and ttft > slo.ttft_p99_seconds
    itl_breach = itl is not None and itl > slo.itl_p99_seconds
    unseen = s.runtime.limited("preemptions") is not None and s.preemptions_per_second is None
    return Facts(
        ttft_breach=ttft_breach,
        itl_breach=itl_breach,
        full_unseen_preemptions=unseen and kv_tight is True and (ttft_breach or itl_breach),
        waiting=waiting,
        waiting_sustained=waiting >= slo.waiting_requests,
        preempting=(s.preemptions_per_second or 0.0) > 0.0,
        kv_headroom_requests=headroom,
        kv_tight=kv_tight,
        queue_share=_queue_share(s),
        render_share=_render_share(s),
        prefill_share=s.prefill_time_share,
        # A histogram of requests' mean gaps has no spikes to spread: they are averaged
        # away inside each request (TensorRT-LLM's time per output token).
        itl_spread=(
            None
            if s.runtime.itl_measures == "request_mean"
            else _ratio(itl, quantile_value(s.itl_p50))
        ),
        itl_p50=quantile_value(s.itl_p50),
        prompts=(s.prompt_tokens_per_second or 0.0) > 0.0,
        ceiling_ratio=ratio,
        roofline=roofline.step_roofline(s, hw) if hw is not None else None,
    )


def evidence_of(s: Signals, f: Facts, rules: Rulebook) -> dict[str, EvidenceValue]:
    """The numbers behind a diagnosis, under the names every output uses; rounded, and
    without the unknown ones (``rounded``)."""
    ev: dict[str, EvidenceValue] = {
        "window_seconds": s.span_seconds,
        "ttft_p99_seconds": quantile_value(s.ttft_p99),
        "ttft_p99_position": s.ttft_p99.position if s.ttft_p99 else None,
        "ttft_p99_slo_seconds": rules.slo.ttft_p99_seconds,
        "ttft_mean_seconds": s.ttft_mean,
        "itl_p50_seconds": quantile_value(s.itl_p50),
        "itl_p99_seconds": quantile_value(s.itl_p99),
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
        "render_time_mean_seconds": s.render_time_mean,
        "render_share_of_ttft": f.render_share,
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
    if s.runtime.itl_measures != "step" and s.step_source:
        # Not the mean inter-token gap itself: say what the step was read from.
        ev["decode_step_source"] = s.step_source
    if rules.ceiling is not None:
        ev["gpu"] = rules.ceiling.gpu
        ev["decode_ceiling_tokens_per_second"] = rules.ceiling.tokens_per_second
        ev["decode_ceiling_ratio"] = f.ceiling_ratio
    if f.roofline is not None:
        ev.update(roofline.evidence(f.roofline))
    if s.counter_resets >= INCONSISTENT_RESETS:
        ev["counter_resets_in_window"] = s.counter_resets
    return rounded(ev)


def rounded(
    ev: dict[str, EvidenceValue],
) -> dict[str, EvidenceValue]:
    # A NaN from a broken target must not reach JSON output or a webhook as "NaN".
    return {
        k: (float(f"{v:.6g}") if isinstance(v, float) else v)
        for k, v in ev.items()
        if v is not None and not (isinstance(v, float) and not math.isfinite(v))
    }


def finite_number(value: object) -> float | None:
    """``value`` as a float when it is a finite number; None for text, flags, NaN and
    infinities, which no chart can draw and JSON cannot carry."""
    if type(value) is float:  # most evidence: a fleet's judging reads fifty a server
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def measurements(
    s: Signals, d: Diagnosis, rules: Rulebook, *, facts: Facts | None = None
) -> dict[str, float]:
    """Every finite number one evaluation gives, named as the evidence names them: what
    the report and the status page chart (``Evaluation.measurements``).

    A breached diagnosis's evidence holds them all already; a healthy one's holds almost
    none (the roofline at most), so while healthy the evidence is computed here as if it
    had breached. TTFT p50 and p90 and the most requests running are charted though no
    diagnosis names them. Absent where unknown, never a made-up 0. ``facts``: the
    window's, when the diagnosis read them already (``diagnose.judged``).
    """
    values: dict[str, object] = {
        "ttft_p50_seconds": quantile_value(s.ttft_p50),
        "ttft_p90_seconds": quantile_value(s.ttft_p90),
        "requests_running_max": s.running_max,
    }
    if d.breached:
        values.update(d.evidence)
    else:
        values.update(evidence_of(s, facts if facts is not None else facts_of(s, rules), rules))
    if "load_ratio" not in values:
        # The load ratio is charted (and exported) while healthy too: a server creeping
        # towards rho = 1 shows before its queue does.
        values.update(predict.queue_evidence(predict.queue_state(s)))
    out: dict[str, float] = {}
    for key, value in values.items():
        number = finite_number(value)
        if number is not None:
            out[key] = number
    return out


#: Rendering at least this share of TTFT makes a TTFT breach the frontend's: the API
#: server, not the GPU, is where the time goes.
RENDER_DOMINANT = 0.5


def frontend_bound(f: Facts) -> bool:
    return f.ttft_breach and f.render_share is not None and f.render_share >= RENDER_DOMINANT
