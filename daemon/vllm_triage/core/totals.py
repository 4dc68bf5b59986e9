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

import math
from collections import deque
from dataclasses import dataclass, field

from vllm_triage.core.engines import balance_means
from vllm_triage.core.histogram import counter_delta, histogram_add, histogram_delta
from vllm_triage.core.model import (
    REFERENCE,
    GaugeStats,
    Histogram,
    ModelSeries,
    Progress,
    Runtime,
    Signals,
    Snapshot,
    WindowTotals,
)
from vllm_triage.core.runtime import COUNTER_FIELDS, HISTOGRAM_FIELDS
from vllm_triage.core.signals import INCONSISTENT_RESETS, signals_from_totals

#: The series an engine writes only as it completes steps (docs/physics.md, "stalled"):
#: token and step counters, the TTFT and ITL observation counts, and the scheduler's
#: gauges. Which of the counters and counts move with the steps is the runtime's to say
#: (``Runtime.moves_with_steps``): vLLM writes all of them per step, TensorRT-LLM counts
#: tokens only when a request finishes (a long decode would look stalled on them).
#: Request-level series (finished requests, e2e time) are left out unless the runtime
#: says they move with its steps: a client that gives up can end a request in vLLM's API
#: server without the engine.
PROGRESS_COUNTERS = (
    "generation_tokens",
    "prompt_tokens",
    "iterations",
    "preemptions",
    "requests_finished",
)
PROGRESS_COUNTS = ("ttft", "itl")
PROGRESS_GAUGES = ("running", "waiting", "kv_usage")
#: A gauge that changes with every step where the engine has one (TensorRT-LLM's last
#: iteration latency): progress, as a counter is.
PROGRESS_HEARTBEATS = ("step_seconds",)


def progress_names(runtime: Runtime) -> frozenset[str]:
    """The names progress is watched by (as ``progress_values`` keys them) for a runtime."""
    moves = runtime.moves_with_steps
    return frozenset(
        (
            *(n for n in PROGRESS_COUNTERS if n in moves),
            *PROGRESS_GAUGES,
            *(n for n in PROGRESS_HEARTBEATS if n in moves),
            *(f"{n}_count" for n in PROGRESS_COUNTS if n in moves),
        )
    )


def progress_values(series: ModelSeries, runtime: Runtime = REFERENCE) -> dict[str, float]:
    """The step-driven values one model exposed (``_count`` for histograms)."""
    moves = runtime.moves_with_steps
    out: dict[str, float] = {}
    for name in PROGRESS_COUNTERS:
        value = getattr(series, name)
        if value is not None and name in moves:
            out[name] = value
    for name in PROGRESS_GAUGES:
        value = getattr(series, name)
        if value is not None:
            out[name] = value
    for name in PROGRESS_HEARTBEATS:
        value = getattr(series, name)
        if value is not None and name in moves:
            out[name] = value
    for name in PROGRESS_COUNTS:
        h = getattr(series, name)
        if h is not None and name in moves:
            out[f"{name}_count"] = h.count
    return out


@dataclass(slots=True)
class _Watch:
    """One model's (or one data-parallel engine's) progress across snapshots (kept while
    it is exposed)."""

    values: dict[str, float]
    seen_at: float  # the last snapshot's time
    progress_at: float  # the last snapshot at which a value moved (or watching began)
    without: float = 0.0  # seconds without progress, with work outstanding, at seen_at
    #: The last stretch without progress that ended: (seconds it lasted, when it ended).
    stall: tuple[float, float] | None = None
    #: That stretch began before watching did (nothing had moved since the first
    #: snapshot): it lasted at least ``stall[0]``, how much longer is unknown.
    stall_censored: bool = False
    #: A value has moved since watching began.
    moved: bool = False
    #: When watching began (the first snapshot, or the one after a gap restarted it).
    began_at: float | None = None
    #: Since when the scheduler's gauges have sat still at non-zero values while the
    #: counters moved (vLLM's stale-gauge bug); None while they move or are zero. And the
    #: generation tokens counted then: still gauges are stale only once more tokens were
    #: generated than the running requests could without a new KV block.
    gauges_still_since: float | None = None
    still_from_tokens: float = 0.0
    #: Each data-parallel engine's own watch, by its ``engine`` label (two or more).
    engines: dict[str, _Watch] = field(default_factory=dict)
    #: Requests the API server took and the engines finished, counted when an engine
    #: fell asleep (by ``engine``): what it owes since, when its gauges cannot say.
    asleep_from: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: What each such engine owes now (requests taken beyond those finished).
    owed_asleep: dict[str, float] = field(default_factory=dict)


#: Requests taken beyond those finished, since an engine fell asleep, that say it owes
#: work: at least this many, and more than this many standard deviations of the count
#: taken (arrivals are bursty; a few in flight at any time are no backlog).
OWED_MIN = 5.0
OWED_SIGMAS = 3.0
#: The block size assumed when ``cache_config_info`` does not say: vLLM's largest default
#: (its CPU backend's), so that the stale-gauge test errs towards trusting the gauges.
DEFAULT_BLOCK_TOKENS = 128
#: Still gauges are stale once the running requests generated this many blocks' worth of
#: tokens each without one new block showing in the KV usage.
STALE_BLOCKS = 2


def _stale_for(w: _Watch, newest: Snapshot) -> float:
    """Seconds the gauges have been stale: still since ``gauges_still_since``, and more
    tokens generated since then than the frozen running requests could have generated
    without a new KV block (every ``block_size`` tokens a sequence takes one more block,
    which moves the usage; requests finishing move it too). 0 when not (yet) so."""
    since = w.gauges_still_since
    if since is None:
        return 0.0
    block = newest.kv_pool.block_size if newest.kv_pool is not None else DEFAULT_BLOCK_TOKENS
    generated = w.values.get("generation_tokens", 0.0) - w.still_from_tokens
    running = max(1.0, w.values.get("running", 0.0))
    return newest.at - since if generated > STALE_BLOCKS * block * running else 0.0


def _gauges(values: dict[str, float]) -> tuple[float | None, ...]:
    return tuple(values.get(name) for name in PROGRESS_GAUGES)


def _update(w: _Watch, values: dict[str, float], at: float, window: float) -> None:
    """One snapshot's values into a watch: progress when any of them moved."""
    if values != w.values:
        # A step happened (a counter up, a gauge moved) or the counters went down: a
        # restarted server. Either way the engine is not stuck.
        if w.without > 0 and (
            w.stall is None or w.without >= w.stall[0] or at - w.stall[1] > window
        ):
            w.stall = (w.without, at)
            w.stall_censored = not w.moved
        w.moved = True
        counters_moved = any(
            values.get(k) != w.values.get(k) for k in values if k not in PROGRESS_GAUGES
        )
        still = _gauges(values) == _gauges(w.values) and (values.get("kv_usage") or 0.0) > 0
        if not (still and counters_moved):
            w.gauges_still_since = None
        elif w.gauges_still_since is None:
            w.gauges_still_since = w.seen_at
            w.still_from_tokens = w.values.get("generation_tokens", 0.0)
        w.values, w.progress_at = values, at
    w.seen_at = at


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
    handles resets and gaps. ``tests/core/test_totals.py`` checks that both paths agree.
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
    return GaugeStats(sum(seen) / len(seen), max(seen), min(seen), seen[0], seen[-1])


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
        runtime = snapshot.runtime
        watched = progress_names(runtime)
        for name, series in snapshot.models.items():
            values = progress_values(series, runtime)
            w = self._watch.get(name)
            if w is None or at - w.seen_at > self.seconds:
                # First sight, or a gap longer than the window (the daemon paused, the
                # target was down or restarting): what happened in between is unknown,
                # so the watch starts again here rather than count the gap as a stall.
                w = self._watch[name] = _Watch(values, at, at, began_at=at)
            else:
                _update(w, values, at, self.seconds)
            w.without = _without_progress(values, w.progress_at, snapshot)
            owed_asleep = self._owed_while_asleep(w, series)
            if not series.per_engine and owed_asleep:
                w.without = max(w.without, at - w.progress_at)
            self._watch_engines(w, series, snapshot, owed_asleep, watched)

    def _owed_while_asleep(self, w: _Watch, series: ModelSeries) -> dict[str, float]:
        """Engines asleep with requests waiting on them that their frozen gauges cannot
        show: since one fell asleep, the API server took more requests (its render
        histogram's count, vLLM 0.34 on) than the engines finished, by more than chance."""
        asleep = {e for e, state in series.sleep.items() if state != "awake"}
        for engine in [e for e in w.asleep_from if e not in asleep]:
            del w.asleep_from[engine]
        taken = series.render_time.count if series.render_time is not None else None
        done = series.requests_finished
        if taken is None or done is None:
            return {}
        owed: dict[str, float] = {}
        for engine in asleep:
            start = w.asleep_from.setdefault(engine, (taken, done))
            arrived, finished = taken - start[0], done - start[1]
            if arrived - finished > max(OWED_MIN, OWED_SIGMAS * math.sqrt(max(arrived, 1.0))):
                owed[engine] = arrived - finished
        w.owed_asleep = owed
        return owed

    def _watch_engines(
        self,
        w: _Watch,
        series: ModelSeries,
        snapshot: Snapshot,
        owed_asleep: dict[str, float],
        watched: frozenset[str],
    ) -> None:
        """Each data-parallel engine on its own: the merged series move while any one
        engine steps, so a hung engine among several shows only here. Its work
        outstanding is its own gauges' (the probe is the server's, not an engine's), or,
        asleep, what the API server took beyond what was finished (``owed_asleep``)."""
        at = snapshot.at
        for engine in [e for e in w.engines if e not in series.per_engine]:
            del w.engines[engine]
        for engine, all_values in series.per_engine.items():
            values = {k: v for k, v in all_values.items() if k in watched}
            ew = w.engines.get(engine)
            if ew is None or at - ew.seen_at > self.seconds:
                ew = w.engines[engine] = _Watch(values, at, at)
            else:
                _update(ew, values, at, self.seconds)
            owed = values.get("running", 0.0) + values.get("waiting", 0.0)
            ew.without = at - ew.progress_at if owed > 0 or engine in owed_asleep else 0.0

    def _progress(self, model: str, newest: Snapshot, interval: float | None) -> Progress | None:
        w = self._watch.get(model)
        if w is None or not any(k not in PROGRESS_GAUGES for k in w.values):
            # Gauges alone can sit still on a busy server: without a counter that must
            # move when the engine steps, "no progress" cannot be told from "steady".
            return None
        series = newest.models.get(model)
        engines = {e: ew.without for e, ew in sorted(w.engines.items())}
        # The server is as stuck as its most stuck engine: the merged series move while
        # any one engine steps. Its frozen values are the ones the evidence shows.
        worst = max(w.engines.items(), key=lambda kv: kv[1].without, default=None)
        shown = worst[1] if worst is not None and worst[1].without > w.without else w
        # The stall that just ended may be one engine's: the merged series moved while
        # the others stepped, yet the requests that waited on it are in this window's
        # latencies all the same. The longest stretch that ended within the window counts.
        recent_stalls = [
            (x.stall, x.stall_censored)
            for x in (w, *w.engines.values())
            if x.stall is not None and newest.at - x.stall[1] <= self.seconds
        ]
        stall, censored = max(
            recent_stalls, key=lambda sc: sc[0][0], default=(w.stall, w.stall_censored)
        )
        recent = stall is not None and newest.at - stall[1] <= self.seconds
        probe = newest.probe
        return Progress(
            last_progress_at=shown.progress_at,
            seconds_without_progress=shown.without,
            engines_without=engines,
            asleep={e: st for e, st in (series.sleep if series else {}).items() if st != "awake"},
            owed_asleep=dict(w.owed_asleep),
            gauges_still_seconds=_stale_for(w, newest),
            running=shown.values.get("running"),
            waiting=shown.values.get("waiting"),
            probe_unanswered_seconds=(
                newest.at - probe.unanswered_since
                if probe is not None and probe.unanswered_since is not None
                else None
            ),
            probe_last_reason=probe.last_reason if probe is not None else None,
            checked=tuple(w.values),
            last_values=dict(shown.values),
            previous_stall_seconds=stall[0] if stall is not None and recent else None,
            previous_stall_ended_seconds_ago=(
                newest.at - stall[1] if stall is not None and recent else None
            ),
            previous_stall_censored=stall is not None and recent and censored,
            watched_seconds=newest.at - w.began_at if w.began_at is not None else None,
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
        step_gauges = {
            name: _gauge([getattr(m, name) for m in busy])
            for name in ("step_seconds", "tokens_per_step")
        }
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
            engine_waiting_mean=_engine_means(series, "waiting"),
            engine_kv_usage_mean=_engine_means(series, "kv_usage"),
            kv_pool_tokens=newest.kv_pool.tokens if newest.kv_pool is not None else None,
            kv_cache=newest.kv_pool.config if newest.kv_pool is not None else None,
            layout_changed=frozenset(layout_changed),
            progress=progress,
            counter_resets=resets,
            runtime=newest.runtime,
            progress_missing=(
                f"not exposed by this {newest.runtime.title}: no token, step or latency counter"
            ),
            step_seconds=step_gauges["step_seconds"],
            tokens_per_step=step_gauges["tokens_per_step"],
        )


def _engine_means(series: list[ModelSeries], gauge: str) -> dict[str, float]:
    """Each data-parallel engine's mean of ``gauge`` over the window's scrapes, when two
    engines or more show it (one engine's is the merged value)."""
    sums: dict[str, list[float]] = {}
    for m in series:
        for engine, values in m.per_engine.items():
            value = values.get(gauge)
            if value is not None:
                sums.setdefault(engine, []).append(value)
    return balance_means({engine: sum(v) / len(v) for engine, v in sums.items()})
