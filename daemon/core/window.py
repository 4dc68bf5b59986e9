"""A sliding window over one target's snapshots, and the signals computed from it.

Percentiles come from bucket *deltas* inside the window (what
``histogram_quantile(q, increase(x_bucket[60s]))`` gives), means from delta-sum over
delta-count, rates from counter deltas over the window's span, gauges as the mean and
max of the window's samples. Deltas are taken pairwise between consecutive snapshots
when a snapshot arrives, so a counter reset (a restarted vLLM) inside the window counts
from zero instead of producing a negative rate, and is paid for once, not per evaluation.

Progress (is the engine stepping at all?) is tracked beside the window, per model, and
outlives it: a hung engine can stay frozen for longer than the window is long, and the
time of the last progress must survive the snapshots that showed it (``Progress``).

Nothing here reads a clock: the window is defined by the snapshots' own ``at``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from vllm_triage.core.histogram import (
    bucket_quantile,
    counter_delta,
    histogram_add,
    histogram_delta,
    observations,
)
from vllm_triage.core.model import (
    GaugeStats,
    Histogram,
    ModelSeries,
    Progress,
    Quantile,
    Signals,
    Snapshot,
    WindowTotals,
)
from vllm_triage.core.names import COUNTER_FIELDS, HISTOGRAM_FIELDS

#: The series vLLM writes only when its engine completes a step (docs/physics.md,
#: "stalled"): token and step counters, the TTFT and ITL observation counts, and the
#: scheduler's gauges. Request-level series (finished requests, e2e time) are left out:
#: a client that gives up can end a request in the API server without the engine.
PROGRESS_COUNTERS = ("generation_tokens", "prompt_tokens", "iterations", "preemptions")
PROGRESS_COUNTS = ("ttft", "itl")
PROGRESS_GAUGES = ("running", "waiting", "kv_usage")


def progress_values(series: ModelSeries) -> dict[str, float]:
    """The step-driven values one model exposed (``_count`` for histograms)."""
    out: dict[str, float] = {}
    for name in (*PROGRESS_COUNTERS, *PROGRESS_GAUGES):
        value = getattr(series, name)
        if value is not None:
            out[name] = value
    for name in PROGRESS_COUNTS:
        h = getattr(series, name)
        if h is not None:
            out[f"{name}_count"] = h.count
    return out


@dataclass(slots=True)
class _Watch:
    """One model's progress across snapshots (kept while the model is exposed)."""

    values: dict[str, float]
    seen_at: float  # the last snapshot's time
    progress_at: float  # the last snapshot at which a value moved (or watching began)
    without: float = 0.0  # seconds without progress, with work outstanding, at seen_at
    #: The last stretch without progress that ended: (seconds it lasted, when it ended).
    stall: tuple[float, float] | None = None


def _without_progress(values: dict[str, float], progress_at: float, snapshot: Snapshot) -> float:
    """Seconds the engine has owed work without moving: since the last progress while the
    frozen gauges show requests, or since the probe went unanswered (when later)."""
    starts: list[float] = []
    if values.get("running", 0.0) + values.get("waiting", 0.0) > 0:
        starts.append(progress_at)
    probe = snapshot.probe
    if probe is not None and probe.unanswered_since is not None:
        starts.append(max(progress_at, probe.unanswered_since))
    return max(0.0, snapshot.at - min(starts)) if starts else 0.0


@dataclass(frozen=True, slots=True)
class _Step:
    """What one model did between the previous snapshot and this one.

    ``restarted`` names the fields whose delta is not simply newer minus older (a counter
    reset, a changed bucket layout): only windows without one may take the fast path.
    """

    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    restarted: frozenset[str] = frozenset()


def _step(newer: ModelSeries, older: ModelSeries | None) -> _Step:
    if older is None:
        # A model seen for the first time has no baseline: its totals so far are not
        # known to have happened inside the window.
        return _Step()
    counters: dict[str, float] = {}
    restarted: set[str] = set()
    for name in COUNTER_FIELDS:
        new, old = getattr(newer, name), getattr(older, name)
        if new is not None and old is not None:
            counters[name] = counter_delta(new, old)
            if new < old:
                restarted.add(name)
    histograms: dict[str, Histogram] = {}
    for name in HISTOGRAM_FIELDS:
        new_h, old_h = getattr(newer, name), getattr(older, name)
        if new_h is not None and old_h is not None:
            histograms[name] = delta = histogram_delta(new_h, old_h)
            if delta is new_h:
                restarted.add(name)
    return _Step(counters, histograms, frozenset(restarted))


def _window_deltas(
    first: ModelSeries | None, newest: ModelSeries | None, steps: list[_Step | None]
) -> tuple[dict[str, float], dict[str, Histogram], set[str]]:
    """Counter increases and histogram deltas over the window, from its steps.

    When every step has a plain delta for a field (no reset, no layout change, the model
    present throughout), the sum of the steps telescopes to newest minus first: one
    subtraction instead of one per step. Otherwise the steps are summed one by one, which
    handles resets and gaps. ``tests/test_window.py`` checks that both paths agree.
    """
    counters: dict[str, float] = {}
    hists: dict[str, Histogram] = {}
    layout_changed: set[str] = set()
    slow: list[str] = []
    for name in (*COUNTER_FIELDS, *HISTOGRAM_FIELDS):
        plain = (
            first is not None
            and newest is not None
            and all(
                st is not None
                and (name in st.counters or name in st.histograms)
                and name not in st.restarted
                for st in steps
            )
        )
        if not plain or not steps:
            slow.append(name)
            continue
        new, old = getattr(newest, name), getattr(first, name)
        if name in COUNTER_FIELDS:
            counters[name] = new - old
        else:
            hists[name] = histogram_delta(new, old)
    # A field no step has (speculative decoding off, an older vLLM) has nothing to sum:
    # leaving it out keeps such windows off the step-by-step path.
    slow = [
        name
        for name in slow
        if any(st is not None and (name in st.counters or name in st.histograms) for st in steps)
    ]
    if slow:
        _sum_steps(slow, steps, counters, hists, layout_changed)
    return counters, hists, layout_changed


def _sum_steps(
    names: list[str],
    steps: list[_Step | None],
    counters: dict[str, float],
    hists: dict[str, Histogram],
    layout_changed: set[str],
) -> None:
    wanted = set(names)
    for step in steps:
        if step is None:
            continue
        for name, delta in step.counters.items():
            if name in wanted:
                counters[name] = counters.get(name, 0.0) + delta
        for name, h in step.histograms.items():
            if name not in wanted:
                continue
            have = hists.get(name)
            if have is None:
                hists[name] = h
            elif have.bounds == h.bounds:
                hists[name] = histogram_add(have, h)
            else:
                # vLLM changed its buckets mid-window (an upgrade): keep the newer.
                hists[name] = h
                layout_changed.add(name)


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


def _gauge(values: list[float | None]) -> GaugeStats:
    """Mean, max and min of one gauge's samples in the window (None when never exposed)."""
    seen = [v for v in values if v is not None]
    if not seen:
        return GaugeStats()
    return GaugeStats(sum(seen) / len(seen), max(seen), min(seen))


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
    def of(cls, counters: dict[str, float], iteration: Histogram | None) -> _EngineSteps:
        drafts = counters.get("spec_drafts")
        accepted = counters.get("spec_accepted_tokens")
        per_step = 1.0
        if drafts and accepted is not None:
            per_step = 1.0 + accepted / drafts
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


class Window:
    """The snapshots of the last ``seconds`` of one target, newest last.

    ``push`` ignores a snapshot that is not newer than the last one (a clock step or a
    replayed file out of order) and says so by returning ``False``.
    """

    def __init__(self, seconds: float = 60.0, *, min_observations: int = 20) -> None:
        if seconds <= 0:
            raise ValueError("window seconds must be positive")
        self.seconds = seconds
        self.min_observations = min_observations
        self._entries: deque[tuple[Snapshot, dict[str, _Step]]] = deque()
        self._watch: dict[str, _Watch] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def newest(self) -> Snapshot | None:
        return self._entries[-1][0] if self._entries else None

    def push(self, snapshot: Snapshot) -> bool:
        previous = self.newest
        if previous is not None and snapshot.at <= previous.at:
            return False
        steps = {
            name: _step(series, previous.models.get(name) if previous else None)
            for name, series in snapshot.models.items()
        }
        self._entries.append((snapshot, steps))
        horizon = snapshot.at - self.seconds
        while self._entries[0][0].at < horizon:
            self._entries.popleft()
        self._watch_progress(snapshot)
        return True

    def _watch_progress(self, snapshot: Snapshot) -> None:
        """Update each model's progress; forget models the snapshot no longer has."""
        at = snapshot.at
        for name in [m for m in self._watch if m not in snapshot.models]:
            del self._watch[name]
        for name, series in snapshot.models.items():
            values = progress_values(series)
            w = self._watch.get(name)
            if w is None or at - w.seen_at > self.seconds:
                # First sight, or a gap longer than the window (the daemon paused, the
                # target was down or restarting): what happened in between is unknown,
                # so the watch starts again here rather than count the gap as a stall.
                w = self._watch[name] = _Watch(values, at, at)
            elif values != w.values:
                # A step happened (a counter up, a gauge moved) or the counters went down:
                # a restarted server. Either way the engine is not stuck.
                if w.without > 0 and (
                    w.stall is None or w.without >= w.stall[0] or at - w.stall[1] > self.seconds
                ):
                    w.stall = (w.without, at)
                w.values, w.progress_at = values, at
            w.seen_at = at
            w.without = _without_progress(values, w.progress_at, snapshot)

    def _progress(self, model: str, newest: Snapshot, interval: float | None) -> Progress | None:
        w = self._watch.get(model)
        if w is None or not any(k not in PROGRESS_GAUGES for k in w.values):
            # Gauges alone can sit still on a busy server: without a counter that must
            # move when the engine steps, "no progress" cannot be told from "steady".
            return None
        stall = w.stall
        recent = stall is not None and newest.at - stall[1] <= self.seconds
        probe = newest.probe
        return Progress(
            last_progress_at=w.progress_at,
            seconds_without_progress=w.without,
            running=w.values.get("running"),
            waiting=w.values.get("waiting"),
            probe_unanswered_seconds=(
                newest.at - probe.unanswered_since
                if probe is not None and probe.unanswered_since is not None
                else None
            ),
            probe_last_reason=probe.last_reason if probe is not None else None,
            checked=tuple(w.values),
            last_values=dict(w.values),
            previous_stall_seconds=stall[0] if stall is not None and recent else None,
            previous_stall_ended_seconds_ago=(
                newest.at - stall[1] if stall is not None and recent else None
            ),
            interval_seconds=interval,
        )

    def models(self) -> list[str]:
        """Models in the newest snapshot, the ones there is something to say about."""
        newest = self.newest
        return sorted(newest.models) if newest else []

    def signals(self, model: str) -> Signals:
        """Signals for one model over the window; ``None`` fields say why in ``missing``."""
        return signals_from_totals(self.totals(model), self.min_observations)

    def totals(self, model: str) -> WindowTotals:
        """What one model did over the window: counter increases, histogram deltas and
        gauge statistics, not yet read as signals."""
        entries = list(self._entries)
        if not entries:
            raise ValueError("no snapshots in the window")
        newest = entries[-1][0]
        first = entries[0][0]

        # Gauges: every snapshot in the window is a sample.
        series = [s.models[model] for s, _ in entries if model in s.models]
        kv = _gauge([m.kv_usage for m in series])
        kv_max = max((m.kv_usage_max for m in series if m.kv_usage_max is not None), default=None)
        busy = [m for m in series if m.running]
        # KV usage weighted by the requests running: the mean ITL weighs each step by the
        # requests it served, so the KV a mean step reads is weighted the same way (on a
        # batch that grows through the window, a plain mean lags the step it explains).
        weighted = [(m.kv_usage, m.running or 0.0) for m in busy if m.kv_usage is not None]
        weight = sum(w for _, w in weighted)

        # Counters and histograms: the steps after the window's first snapshot.
        counters, hists, layout_changed = _window_deltas(
            first.models.get(model),
            newest.models.get(model),
            [steps.get(model) for _, steps in entries[1:]],
        )
        newest_series = newest.models.get(model)
        span = newest.at - first.at
        progress = self._progress(
            model, newest, span / (len(entries) - 1) if len(entries) > 1 else None
        )
        return WindowTotals(
            model_name=model,
            at=newest.at,
            span_seconds=span,
            snapshots=len(entries),
            counters=counters,
            histograms=hists,
            running=_gauge([m.running for m in series]),
            waiting=_gauge([m.waiting for m in series]),
            kv_usage=GaugeStats(kv.mean, kv_max if kv_max is not None else kv.max, kv.min),
            running_busy_mean=(sum(m.running or 0.0 for m in busy) / len(busy) if busy else None),
            kv_usage_busy_mean=sum(u * w for u, w in weighted) / weight if weight > 0 else None,
            engines=newest_series.engines if newest_series is not None else 1,
            kv_pool_tokens=newest.kv_pool.tokens if newest.kv_pool is not None else None,
            layout_changed=frozenset(layout_changed),
            progress=progress,
        )


def signals_from_totals(t: WindowTotals, min_observations: int) -> Signals:
    """A window's totals read as signals: rates over the span, means of deltas,
    quantiles of bucket deltas (``None`` fields say why in ``missing``).

    The one place both the sidecar's window and fleet mode's Prometheus totals become
    ``Signals``.
    """
    span = t.span_seconds
    missing: dict[str, str] = {}
    for key, gauge in (
        ("running_mean", t.running),
        ("waiting_mean", t.waiting),
        ("kv_usage_mean", t.kv_usage),
    ):
        if gauge.mean is None:
            missing[key] = "not exposed by this vLLM"
    counters, hists = t.counters, t.histograms
    rates: dict[str, float | None] = dict.fromkeys(_RATES.values())
    ttft = itl = _Latency()
    means: dict[str, float | None] = dict.fromkeys(_MEANS.values())
    prefill_share: float | None = None
    if span <= 0:
        reason = "not enough data: one snapshot in the window, rates need two"
        for name in (*_RATES.values(), "ttft_p99", "itl_p99"):
            missing[name] = reason
    else:
        for name, key in _RATES.items():
            if name in counters:
                rates[key] = counters[name] / span
            else:
                missing[key] = "not exposed by this vLLM"
        ttft, why = _latency(hists.get("ttft"), (0.5, 0.9, 0.99), span, min_observations)
        if why is not None:
            missing["ttft_p99"] = why
        itl, why = _latency(hists.get("itl"), (0.5, 0.99), span, min_observations)
        if why is not None:
            missing["itl_p99"] = why
        for name, key in _MEANS.items():
            found = hists.get(name)
            if found is None:
                missing[key] = "not exposed by this vLLM"
            elif found.count > 0:
                means[key] = found.sum / found.count
            else:
                missing[key] = "not enough data: no requests finished in the window"
        pre, dec = hists.get("prefill_time"), hists.get("decode_time")
        if pre is not None and dec is not None and pre.sum + dec.sum > 0:
            prefill_share = pre.sum / (pre.sum + dec.sum)
    for name in t.layout_changed:
        missing[f"{name}_layout"] = "bucket bounds changed inside the window"
    queued = hists.get("queue_time") if span > 0 else None
    steps = _EngineSteps.of(dict(counters), hists.get("iteration_tokens") if span > 0 else None)
    if t.progress is None:
        missing["progress"] = t.progress_missing

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
        queue_time_mean=means["queue_time_mean"],
        queue_time_count=queued.count if queued is not None else 0.0,
        prefill_time_mean=means["prefill_time_mean"],
        decode_time_mean=means["decode_time_mean"],
        prefill_time_share=prefill_share,
        running_mean=t.running.mean,
        running_max=t.running.max,
        waiting_mean=t.waiting.mean,
        waiting_max=t.waiting.max,
        waiting_min=t.waiting.min,
        kv_usage_mean=t.kv_usage.mean,
        kv_usage_max=t.kv_usage.max,
        preemptions_per_second=rates["preemptions_per_second"],
        prompt_tokens_per_second=rates["prompt_tokens_per_second"],
        generation_tokens_per_second=rates["generation_tokens_per_second"],
        mean_prompt_tokens=means["mean_prompt_tokens"],
        mean_generation_tokens=means["mean_generation_tokens"],
        # One ITL sample per request per engine step, and a step may emit several
        # tokens under speculative decoding: the rate is tokens per step / step.
        decode_tokens_per_second_per_stream=(
            steps.tokens_per_step / itl.mean if itl.mean is not None and itl.mean > 0 else None
        ),
        kv_pool_tokens=t.kv_pool_tokens,
        progress=t.progress,
        missing=missing,
        engines=t.engines,
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
    )


def _latency(
    h: Histogram | None, qs: tuple[float, ...], span: float, min_observations: int
) -> tuple[_Latency, str | None]:
    """A latency histogram's observations, mean and quantiles, and why the quantiles are
    missing (``None`` when they are not)."""
    if h is None:
        return _Latency(), "not exposed by this vLLM"
    n = observations(h)
    mean = h.sum / h.count if h.count > 0 else None
    if n < min_observations:
        why = f"not enough data: {n:g} observations in {span:g} s (need {min_observations})"
        return _Latency(count=n, mean=mean), why
    return _Latency(count=n, mean=mean, quantiles={q: bucket_quantile(q, h) for q in qs}), None
