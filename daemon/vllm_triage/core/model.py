"""The core's data: frozen, typed shapes that pass between the stages.

    parse ─► Snapshot ─► window ─► Signals ─► diagnose ─► Diagnosis ─► incidents ─► Transition

Every shape carries its own time (``at``, unix seconds taken from the scrape), never the
clock's, so the same sequence of snapshots always gives the same transitions: live, in
``replay`` and in the tests.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Cause = Literal["stalled", "prefill_bound", "decode_bound", "queue_bound", "kv_pressure"]
#: Causes in causal order (see ``diagnose``): a hung engine explains every other symptom,
#: KV pressure makes requests wait, waiting inflates TTFT, and a long prefill stalls
#: decode; the earlier cause explains the later.
CAUSES: tuple[Cause, ...] = (
    "stalled",
    "kv_pressure",
    "queue_bound",
    "prefill_bound",
    "decode_bound",
)

Era = Literal["v0", "transitional", "v1", "unknown"]
#: The exposition format a body came in: the classic text (0.0.4) or OpenMetrics 1.0.
Format = Literal["text", "openmetrics"]

#: What one observation of the inter-token histogram is: the gap one request waited for
#: one engine step (``step``), that gap divided by the tokens the step gave it
#: (``token``), or one request's mean gap, observed when it finishes (``request_mean``).
ItlMeasure = Literal["step", "token", "request_mean"]
#: The series that move as the engine steps unless a spec says otherwise: its token and
#: step counters, and the first-token and inter-token observations (vLLM writes all of
#: them per engine step).
STEP_FIELDS: frozenset[str] = frozenset(
    {"generation_tokens", "prompt_tokens", "iterations", "preemptions", "ttft", "itl"}
)


@dataclass(frozen=True, slots=True)
class Limit:
    """One thing an engine's metrics cannot tell, and what the diagnosis does instead:
    ``says`` is the sentence the evidence carries (``"no preemption series on LMDeploy:
    KV pressure judged from usage alone"``), ``affects`` the causes it bears on."""

    what: str
    says: str
    affects: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Runtime:
    """What one engine's metrics mean to the diagnosis. The defaults are vLLM's."""

    name: str = "vllm"
    title: str = "vLLM"
    #: What one inter-token observation is (see ``ItlMeasure``).
    itl_measures: ItlMeasure = "step"
    #: The fields whose movement is the engine's progress (series written as it steps).
    moves_with_steps: frozenset[str] = STEP_FIELDS
    #: The causes its metrics can show; a cause outside these is never named.
    judges: tuple[Cause, ...] = CAUSES
    #: What its metrics cannot tell (said in the evidence of the causes they bear on).
    limits: tuple[Limit, ...] = ()
    #: A variant the scrape showed (vLLM's Rust frontend), empty for the plain one.
    variant: str = ""
    #: Fields this variant does not export: unknown, never zero.
    absent: frozenset[str] = frozenset()
    #: What to change per cause in this engine's own settings (its spec's
    #: ``remediation``); a cause without its own takes rules/remediation.yaml's (vLLM's).
    remediation: tuple[tuple[Cause, tuple[str, ...]], ...] = ()

    @property
    def label(self) -> str:
        """The name as a label value (``runtime="sglang"``)."""
        return self.name

    @property
    def shown(self) -> str:
        """The engine as a person reads it: ``vLLM (Rust frontend)``."""
        return f"{self.title} ({self.variant})" if self.variant else self.title

    def limits_for(self, cause: str | None) -> tuple[str, ...]:
        """What this engine cannot tell about ``cause`` (every limit when None)."""
        return tuple(
            lim.says
            for lim in self.limits
            if cause is None or not lim.affects or cause in lim.affects
        )

    def fixes(self, cause: str) -> tuple[str, ...]:
        """This engine's own fixes for ``cause`` (empty: the rulebook's)."""
        return next((fixes for c, fixes in self.remediation if c == cause), ())

    def limited(self, what: str) -> Limit | None:
        return next((lim for lim in self.limits if lim.what == what), None)


#: The reference semantics (vLLM's): what a snapshot without a runtime means.
REFERENCE = Runtime()


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The labels of ``vllm:cache_config_info`` the KV pool's arithmetic reads
    (``core/roofline/kvpool.py``); None where vLLM said "None" or the label is absent (older
    versions lack kv_cache_size_tokens and kv_cache_memory_bytes) or not a positive number."""

    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_cache_size_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None

    @property
    def pool_tokens(self) -> int | None:
        """Tokens the pool holds: kv_cache_size_tokens, else num_gpu_blocks x block_size."""
        if self.kv_cache_size_tokens is not None:
            return self.kv_cache_size_tokens
        if self.num_gpu_blocks is not None and self.block_size is not None:
            return self.num_gpu_blocks * self.block_size
        return None


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative Prometheus histogram as exposed: ``bounds`` ascend and end with +Inf.

    ``cumulative[i]`` counts observations ``<= bounds[i]``; the last entry equals the
    total count of observations in the buckets.
    """

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float
    sum: float

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.cumulative):
            raise ValueError("bounds and cumulative counts differ in length")
        if not self.bounds or not math.isinf(self.bounds[-1]):
            raise ValueError("a histogram needs a +Inf bucket")


@dataclass(frozen=True, slots=True)
class KVPool:
    """The KV cache pool of one target, from ``vllm:cache_config_info``: its blocks summed
    over engines, and one engine's labels as read (``config``: pool tokens, bytes,
    utilization and cache dtype per engine; the first engine's, since every engine of a
    server loads the same model the same way)."""

    block_size: int
    num_gpu_blocks: int
    config: CacheConfig | None = None

    @property
    def tokens(self) -> int:
        return self.block_size * self.num_gpu_blocks


@dataclass(frozen=True, slots=True)
class ModelSeries:
    """What one ``model_name`` exposed in one scrape, data-parallel engines merged.

    Counters and histograms are summed over engines (buckets included): percentiles are
    computed later from the summed buckets, never averaged. ``running`` and ``waiting``
    are summed too (they count requests). ``kv_usage`` is the mean of the engines' usage
    fractions (each engine has its own, equally sized, pool) and ``kv_usage_max`` the
    fullest engine's. ``None`` means this vLLM does not expose the series.
    """

    model_name: str
    engines: int = 1
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    kv_usage_max: float | None = None
    preemptions: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    requests_finished: float | None = None
    #: Engine steps that produced stats: ``vllm:iteration_tokens_total_count``.
    iterations: float | None = None
    ttft: Histogram | None = None
    itl: Histogram | None = None
    queue_time: Histogram | None = None
    prefill_time: Histogram | None = None
    decode_time: Histogram | None = None
    prompt_length: Histogram | None = None
    generation_length: Histogram | None = None
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    iteration_tokens: Histogram | None = None
    #: Chat template, tokenization and multimodal preprocessing in the API server
    #: (``vllm:request_render_duration_seconds``, vLLM 0.34 on; not per engine).
    render_time: Histogram | None = None
    #: With two or more data-parallel engines: each engine's step-driven values
    #: (``names.PER_ENGINE``), by its rank label (vLLM's ``engine``). Empty for one.
    per_engine: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: Each engine's sleep state when vLLM's sleep mode is on (``awake``,
    #: ``weights_offloaded``, ``discard_all``), by its ``engine`` label.
    sleep: Mapping[str, str] = field(default_factory=dict)
    #: vLLM's estimate of the bytes its steps read and the FLOPs they computed, per GPU
    #: (``vllm:estimated_*_per_gpu_total``; only with ``--enable-mfu-metrics``).
    estimated_read_bytes: float | None = None
    estimated_flops: float | None = None
    #: The last engine step's seconds, where the engine exports it as a gauge
    #: (TensorRT-LLM's iteration latency), and the tokens one request gets per step where a
    #: gauge says (SGLang's speculative acceptance length, TensorRT-LLM's decoded tokens
    #: per iteration); means over data-parallel ranks.
    step_seconds: float | None = None
    tokens_per_step: float | None = None


@dataclass(frozen=True, slots=True)
class ProbeStatus:
    """The active probe of a target when it was scraped (``daemon/vllm_triage/scrape/probe.py``):
    one-token completions sent to the server's API, one at a time, each with a deadline.

    ``unanswered_since`` is when the oldest probe that has had no answer yet was sent (one
    in flight, or one that ran past its deadline); ``None`` once a probe was answered.
    An unanswered probe is work the engine owes even when its gauges say it is idle.
    """

    unanswered_since: float | None = None
    last_seconds: float | None = None
    last_reason: str | None = None  # None when the last probe was answered in time


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape of one target, reduced to the series the diagnosis needs.

    ``problems`` lists series that were present but unusable (a NaN gauge, a histogram
    without its +Inf bucket): they are left out of ``models`` and said here, so nothing
    is dropped silently. ``probe`` is the active probe's state at the scrape, when the
    target has one; it applies to every model of the target (they share one engine).
    """

    at: float
    era: Era
    prefix: str
    models: Mapping[str, ModelSeries]
    kv_pool: KVPool | None = None
    problems: tuple[str, ...] = ()
    probe: ProbeStatus | None = None
    #: The serving engine the body is from, and what its metrics mean (vLLM's when a
    #: snapshot is built without one), and the exposition format it came in.
    runtime: Runtime = REFERENCE
    format: Format = "text"


Position = Literal["interpolated", "above_last_bound", "below_first_bound"]


@dataclass(frozen=True, slots=True)
class Quantile:
    """A ``histogram_quantile`` estimate and where in the buckets it fell.

    ``above_last_bound``: the rank fell in the +Inf bucket, so ``value`` is the highest
    finite bound and the truth is somewhere above it. ``below_first_bound``: the rank fell
    in the first bucket, so ``value`` was interpolated between 0 and the first bound.
    """

    q: float
    value: float
    position: Position = "interpolated"


@dataclass(frozen=True, slots=True)
class Progress:
    """Whether the engine is stepping: when its step-driven series last moved.

    vLLM writes its gauges and counters only when the engine completes a step, so a hung
    engine leaves every one of them frozen while ``/metrics`` still answers
    (``docs/physics.md``, "stalled"). Any change in ``checked`` (a counter up, a counter
    down after a restart, a gauge moving) is progress. ``seconds_without_progress``
    counts only time with work outstanding: requests running or waiting in the frozen
    gauges, or a probe still unanswered; it is 0 otherwise. ``previous_stall_*`` describe
    the last stretch without progress that ended inside the window, whose delayed
    observations (a minute-long inter-token gap, a TTFT that waited out the stall) are
    still in the window's histograms.
    """

    last_progress_at: float
    seconds_without_progress: float
    running: float | None = None
    waiting: float | None = None
    probe_unanswered_seconds: float | None = None
    probe_last_reason: str | None = None
    checked: tuple[str, ...] = ()
    last_values: Mapping[str, float] = field(default_factory=dict)
    previous_stall_seconds: float | None = None
    previous_stall_ended_seconds_ago: float | None = None
    #: That stretch was already under way when watching began (``check`` started during
    #: a hang): it lasted at least ``previous_stall_seconds``, how much longer is unknown.
    previous_stall_censored: bool = False
    #: How long the engine has been watched (since the first snapshot, or since a gap in
    #: the scrapes started the watch again); None: not known.
    watched_seconds: float | None = None
    #: Mean seconds between the window's snapshots (the scrape interval, as seen).
    interval_seconds: float | None = None
    #: Two or more data-parallel engines: each one's seconds without progress with its own
    #: work outstanding, by ``engine`` label (the fields above show the most stuck one).
    engines_without: Mapping[str, float] = field(default_factory=dict)
    #: Engines not awake (vLLM's sleep mode), by ``engine`` label: their sleep state.
    asleep: Mapping[str, str] = field(default_factory=dict)
    #: Asleep engines owing work their frozen gauges cannot show: requests the API server
    #: took beyond those finished since each fell asleep.
    owed_asleep: Mapping[str, float] = field(default_factory=dict)
    #: Seconds the running, waiting and KV gauges have sat at the same values, KV above
    #: zero, while tokens and steps went on (vLLM issues #22545, #29928: gauges left
    #: stale after mass aborts); 0 while they move.
    gauges_still_seconds: float = 0.0

    @property
    def outstanding(self) -> float | None:
        """Requests running or waiting at the last engine update (``None``: not exposed)."""
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0.0) + (self.waiting or 0.0)


@dataclass(frozen=True, slots=True)
class Signals:
    """Windowed signals for one model on one target.

    A ``None`` field is "not enough data" or "not exposed by this vLLM"; ``missing`` says
    which, per field name, so the evidence can tell the user rather than guess.
    """

    model_name: str
    at: float
    span_seconds: float
    snapshots: int
    ttft_p50: Quantile | None = None
    ttft_p90: Quantile | None = None
    ttft_p99: Quantile | None = None
    ttft_mean: float | None = None
    ttft_count: float = 0.0
    itl_p50: Quantile | None = None
    itl_p99: Quantile | None = None
    itl_mean: float | None = None
    itl_count: float = 0.0
    #: The longest inter-token gap that ended in the window was at least this long (the
    #: lower bound of the highest ITL bucket with an observation); None: none, or no ITL.
    #: A gap of ``stall_after_seconds`` is a stall that just ended, even when no two
    #: snapshots saw the engine still (``core.stall``).
    itl_longest_at_least: float | None = None
    queue_time_mean: float | None = None
    queue_time_count: float = 0.0
    #: Rendering in the API server (chat template, tokenization, multimodal
    #: preprocessing; vLLM 0.34 on): its mean over the window's requests, and how many.
    render_time_mean: float | None = None
    render_count: float = 0.0
    prefill_time_mean: float | None = None
    decode_time_mean: float | None = None
    #: Prefill time over prefill + decode time of the requests that finished in the
    #: window (both are observed at a request's end), and how many there were.
    prefill_time_share: float | None = None
    prefill_time_count: float = 0.0
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    waiting_min: float | None = None
    #: The waiting gauge's oldest and newest samples in the window: how much the queue
    #: grew, which arrivals are counted with (``core.predict``).
    waiting_first: float | None = None
    waiting_last: float | None = None
    kv_usage_mean: float | None = None
    kv_usage_max: float | None = None
    preemptions_per_second: float | None = None
    prompt_tokens_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    mean_prompt_tokens: float | None = None
    mean_generation_tokens: float | None = None
    decode_tokens_per_second_per_stream: float | None = None
    kv_pool_tokens: int | None = None
    progress: Progress | None = None
    missing: Mapping[str, str] = field(default_factory=dict)
    #: Data-parallel engines serving the model (the gauges' series in the newest scrape).
    engines: int = 1
    #: With two engines or more, each one's window mean of its waiting requests and of its
    #: KV usage, by its ``engine`` label (the merged gauges hide an uneven balancer).
    engine_waiting_mean: Mapping[str, float] = field(default_factory=dict)
    engine_kv_usage_mean: Mapping[str, float] = field(default_factory=dict)
    #: Tokens per engine step over the window (``vllm:iteration_tokens_total``'s bucket
    #: deltas), its mean and the steps it covers; ``None`` when not exposed.
    iteration_tokens: Histogram | None = None
    iteration_tokens_mean: float | None = None
    iteration_steps: float = 0.0
    #: Running requests averaged over the scrapes that found requests running, and KV
    #: usage averaged over them weighted by the requests running: what the mean decode
    #: step reads (ITL samples exist only while requests run, one per request per step,
    #: so a step serving more requests weighs more), undiluted by idle moments.
    running_busy_mean: float | None = None
    kv_usage_busy_mean: float | None = None
    #: Speculative decoding's window increases: drafts (one per request per step),
    #: draft tokens proposed, draft tokens accepted; ``None`` when it is off.
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    #: Tokens one request gets per engine step: 1, or 1 + accepted / drafts under
    #: speculative decoding (each draft step emits its accepted tokens plus one).
    decode_tokens_per_step: float = 1.0
    #: Share of cycles the card's memory interface was busy over the window (DCGM's
    #: ``DCGM_FI_PROF_DRAM_ACTIVE``, mean over the server's GPUs); fleet mode only.
    dram_active_mean: float | None = None
    #: Scrapes in the window whose counters went backwards. One is a restart; two or
    #: more (``core.signals.INCONSISTENT_RESETS``) is a target that is not one server
    #: (a load balancer alternating between two), and its rates are left out.
    counter_resets: int = 0
    #: The KV pool's settings as vLLM exported them (newest scrape; one engine's).
    kv_cache: CacheConfig | None = None
    #: vLLM's own estimate over the window, per GPU: bytes its steps read, FLOPs they
    #: computed (window increases; ``None`` when not exposed).
    estimated_read_bytes: float | None = None
    estimated_flops: float | None = None
    #: The serving engine, and what its metrics mean (``Runtime``).
    runtime: Runtime = REFERENCE
    #: The mean decode step, from what the engine measures (``step_source`` says what):
    #: vLLM's and LMDeploy's inter-token gap (one per step), SGLang's (one per token)
    #: times the tokens per step, TensorRT-LLM's last-iteration latency. ``None``: the
    #: engine gives no step.
    step_seconds_mean: float | None = None
    step_source: str = ""

    @property
    def decode_step_seconds(self) -> float | None:
        """The mean decode step: ``step_seconds_mean``, or the mean ITL where one
        inter-token observation is one step (signals built without a step, in tests)."""
        if self.step_seconds_mean is not None:
            return self.step_seconds_mean
        return self.itl_mean if self.runtime.itl_measures == "step" else None


@dataclass(frozen=True, slots=True)
class GaugeStats:
    """Mean, max and min of one gauge over a window; ``None`` when it was never exposed.
    ``first`` and ``last``: its oldest and newest samples in the window (the sidecar's
    window has them; fleet mode leaves them out), for the queue's growth."""

    mean: float | None = None
    max: float | None = None
    min: float | None = None
    first: float | None = None
    last: float | None = None


@dataclass(frozen=True, slots=True)
class WindowTotals:
    """What one model did over a window, before it is read as ``Signals``.

    The sidecar's ``Window`` sums it from its snapshots; fleet mode reads it from
    Prometheus, which did the windowing (``daemon/vllm_triage/fleet/signals.py``). Both become
    ``Signals`` through ``signals.signals_from_totals``, so the two agree by construction.

    ``counters`` holds window increases and ``histograms`` window deltas, keyed by the
    field names of ``ModelSeries``; a field that is absent was not exposed. A histogram
    read for its mean only may carry a single +Inf bucket (its count). ``kv_usage.max``
    is the fullest engine's; ``running`` and ``waiting`` are summed over engines.
    """

    model_name: str
    at: float
    span_seconds: float
    snapshots: int
    counters: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Histogram] = field(default_factory=dict)
    running: GaugeStats = GaugeStats()
    waiting: GaugeStats = GaugeStats()
    kv_usage: GaugeStats = GaugeStats()
    running_busy_mean: float | None = None
    kv_usage_busy_mean: float | None = None
    engines: int = 1
    #: With two engines or more: each one's window means (``Signals.engine_*_mean``).
    engine_waiting_mean: Mapping[str, float] = field(default_factory=dict)
    engine_kv_usage_mean: Mapping[str, float] = field(default_factory=dict)
    kv_pool_tokens: int | None = None
    #: Histogram fields whose bucket bounds changed inside the window.
    layout_changed: frozenset[str] = frozenset()
    #: Scrapes in the window whose counters went backwards (see ``Signals``).
    counter_resets: int = 0
    dram_active_mean: float | None = None
    #: The engine's progress (the sidecar's window watches it across snapshots); when
    #: ``None``, ``progress_missing`` says why.
    progress: Progress | None = None
    progress_missing: str = "not exposed by this vLLM: no token, step or latency counter"
    #: The KV pool's settings as vLLM exported them (``KVPool.config``).
    kv_cache: CacheConfig | None = None
    #: The serving engine, and what its metrics mean (``Runtime``).
    runtime: Runtime = REFERENCE
    #: The engine's own step gauges over the scrapes that found requests running: the
    #: last step's seconds (TensorRT-LLM) and the tokens per step (speculative decoding's
    #: acceptance length, SGLang's and TensorRT-LLM's); empty where not exported.
    step_seconds: GaugeStats = GaugeStats()
    tokens_per_step: GaugeStats = GaugeStats()


#: One number (or fact) of a diagnosis's evidence; a tuple of strings names several
#: things at once (``stalled_engines``) and is a list in JSON.
EvidenceValue = float | int | str | bool | tuple[str, ...] | None
Evidence = Mapping[str, EvidenceValue]


@dataclass(frozen=True, slots=True)
class Contribution:
    """A cause whose symptoms are present beside the primary one (``docs/physics.md``,
    "Contributing causes"): ``share`` is its part of the evidence (its confidence over the
    sum of the primary's and every contributor's), ``evidence`` one line of what shows it."""

    cause: Cause
    share: float
    evidence: str


#: A change to a server, keyed as ``vllm-triage whatif --change`` takes it.
ChangeValue = str | int | float


@dataclass(frozen=True, slots=True)
class RemediationEffect:
    """One fix and what it is predicted to do to the breached metric, from the window it
    was diagnosed in (``core.predict``; ``docs/physics.md``, "Predicted effects").

    ``change`` is the fix as ``whatif`` keys take it (empty when the fix is a check or a
    procedure, not a setting); ``predicted`` with ``low`` and ``high`` its range; ``None``
    with ``why`` saying what keeps it from being computed. ``label`` is a short name of
    the fix; ``step_now`` and ``step_predicted`` the mean decode step, when it changes.
    """

    fix: str
    label: str
    change: Mapping[str, ChangeValue]
    metric: str
    now: float | None = None
    predicted: float | None = None
    low: float | None = None
    high: float | None = None
    why: str = ""
    step_now: float | None = None
    step_predicted: float | None = None


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """One evaluation's verdict for one model.

    ``breaches`` names the SLO symptoms that were breached; ``cause`` is ``None`` when
    nothing was. ``evidence`` holds the numbers that decided it. ``held`` is an evaluation
    without a verdict: the engine showed no progress with work outstanding, but not yet
    for long enough to call it stalled, and its frozen gauges are not evidence of anything
    else; the incident tracker skips it, so an open incident neither resolves nor advances.
    ``sustained`` is a breach that has already lasted its own test of time (a stall: no
    progress for ``stall_after_seconds``): the tracker opens on it at once rather than
    count ``open_after`` evaluations, which would tie the alert to the scrape pace.
    """

    model_name: str
    at: float
    breaches: tuple[str, ...]
    cause: Cause | None
    confidence: float = 0.0
    summary: str = ""
    evidence: Evidence = field(default_factory=dict)
    secondary: tuple[Cause, ...] = ()
    remediation: tuple[str, ...] = ()
    held: bool = False
    #: ``secondary`` with each cause's share and evidence, in causal order.
    contributing: tuple[Contribution, ...] = ()
    #: Every cause whose symptoms are present, the primary included: an open incident
    #: keeps its cause while that cause is still among them (``core.incidents``).
    present: tuple[Cause, ...] = ()
    #: The latency SLOs this clear evaluation could not judge: too few observations in
    #: the window while requests were in flight (absence of data, not health).
    inconclusive: tuple[str, ...] = ()
    #: Each fix of ``remediation`` with its predicted effect (``core.predict``), in order.
    remediation_effects: tuple[RemediationEffect, ...] = ()
    sustained: bool = False
    #: The serving engine judged (``Runtime.name``): the ``runtime`` label of alerts and
    #: gauges.
    runtime: str = "vllm"

    @property
    def breached(self) -> bool:
        return bool(self.breaches)


class Reason(enum.StrEnum):
    """Why a transition happened; mirrors Alertmanager's notify reasons."""

    OPENED = "opened"
    CAUSE_CHANGED = "cause_changed"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class Transition:
    """An incident changing state: what a notifier sends and ``replay`` prints.

    One alert identity per episode, from open to resolve: it is named for the cause the
    episode opened with (``opened_as``), keeps ``started_at`` across cause changes, and a
    change of cause is a ``firing`` transition with reason ``cause_changed`` that names
    the cause it replaces (``previous_cause``) and why (``change``).
    """

    event: Literal["firing", "resolved"]
    reason: Reason
    model_name: str
    cause: Cause
    at: float
    started_at: float
    diagnosis: Diagnosis
    #: The cause the episode opened with (its alert identity); ``cause`` is the current one.
    opened_as: Cause | None = None
    previous_cause: Cause | None = None
    change: str = ""
    #: A change of cause inside the episode (the same alert, told again), as opposed to a
    #: firing that opens one (``opened``, or a stall's own episode after a slow one).
    continues: bool = False

    @property
    def identity_cause(self) -> Cause:
        return self.opened_as or self.cause
