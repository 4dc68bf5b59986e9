"""The window of one target's snapshots, and what it accumulates: counter increases,
histogram bucket deltas, gauge statistics and the engine's progress (``WindowTotals``).

Deltas are taken pairwise between consecutive snapshots when a snapshot arrives, so a
counter reset (a restarted vLLM) inside the window counts from zero instead of producing
a negative rate, and is paid for once, not per evaluation. Reading the totals as
percentiles, means and rates is ``signals.py``'s job, kept apart because fleet mode gets
its totals from Prometheus instead of from this window.

Progress (is the engine stepping at all?) is tracked beside the window, per model, and
outlives it: a hung engine can stay frozen for longer than the window is long, and the
time of the last progress must survive the snapshots that showed it (``Progress``).

Nothing here reads a clock: the window is defined by the snapshots' own ``at``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from vllm_triage.core.histogram import counter_delta, histogram_add, histogram_delta
from vllm_triage.core.model import (
    GaugeStats,
    Histogram,
    ModelSeries,
    Progress,
    Signals,
    Snapshot,
    WindowTotals,
)
from vllm_triage.core.names import COUNTER_FIELDS, HISTOGRAM_FIELDS
from vllm_triage.core.signals import INCONSISTENT_RESETS, signals_from_totals

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
    handles resets and gaps. ``tests/test_totals.py`` checks that both paths agree.
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


def _gauge(values: list[float | None]) -> GaugeStats:
    """Mean, max and min of one gauge's samples in the window (None when never exposed)."""
    seen = [v for v in values if v is not None]
    if not seen:
        return GaugeStats()
    return GaugeStats(sum(seen) / len(seen), max(seen), min(seen))


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
        model_steps = [steps.get(model) for _, steps in entries[1:]]
        counters, hists, layout_changed = _window_deltas(
            first.models.get(model), newest.models.get(model), model_steps
        )
        resets = sum(
            1 for st in model_steps if st is not None and st.restarted & set(COUNTER_FIELDS)
        )
        if resets >= INCONSISTENT_RESETS:
            counters, hists = {}, {}
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
            kv_cache=newest.kv_pool.config if newest.kv_pool is not None else None,
            layout_changed=frozenset(layout_changed),
            progress=progress,
            counter_resets=resets,
        )
