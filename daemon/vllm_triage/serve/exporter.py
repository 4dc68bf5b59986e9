"""The derived metrics, as a custom prometheus_client Collector on its own registry.

A Collector (rather than Gauge objects set on every scrape) renders whatever the
watchers published last, at the moment Prometheus asks: nothing to keep in sync, and a
model that disappears from a target disappears from ``/metrics`` with it.

Naming follows Prometheus' rules: base units (seconds), ``_ratio`` for 0..1, ``_total``
for counters only. Signals are labelled ``target``, ``model_name`` and ``runtime`` (the
serving engine: ``vllm``, ``sglang``, ...; not ``engine``, which in vLLM's metrics is a
data-parallel rank); a window without enough data for a value leaves that sample out
(absent, not zero). Signals are only
shown while the target is up; the diagnosis state set stays, because the incident does.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from vllm_triage import __version__
from vllm_triage.core.model import CAUSES, Quantile, Signals
from vllm_triage.core.names import label_value
from vllm_triage.core.rulebook import Slo
from vllm_triage.core.signals import INCONSISTENT_RESETS
from vllm_triage.serve.exposition import Counter, Gauge
from vllm_triage.state import ReceiverView, StoreStatus, TargetState

P = "vllm_triage_"
DIAGNOSES = ("healthy", *CAUSES)
BREACHES = ("ttft_p99", "itl_p99", "waiting", "kv_preemptions", "no_progress")
MODEL = ("target", "model_name", "runtime")
#: ``decode_step_bytes``'s ``part`` label and the evidence each comes from.
ROOFLINE_PARTS = (
    ("weights", "decode_step_weight_bytes"),
    ("kv", "decode_step_kv_bytes"),
    ("draft", "decode_step_draft_bytes"),
)
RESOURCES = ("memory", "compute")


def _recording(targets: list[TargetState]) -> Iterator[Metric]:
    """``run --record`` only: what the daemon's own recording of each target kept."""
    recorded = [t for t in targets if t.recording is not None]
    if not recorded:
        return
    kept = Counter(
        P + "recorded_scrapes", "Scrapes kept in the daemon's recording.", labels=("target",)
    )
    size = Counter(
        P + "recorded_bytes", "Bytes written to the daemon's recording.", labels=("target",)
    )
    held = Gauge(
        P + "recording_folder_bytes",
        "Bytes the recording's folder holds (earlier runs' too); record.max_bytes bounds it.",
        labels=("target",),
    )
    failures = Counter(
        P + "recording_failures",
        "Scrapes the daemon's recording did not keep, by reason (disk, too_large, full).",
        labels=("target", "reason"),
    )
    for t in recorded:
        r = t.recording
        assert r is not None
        kept.add_metric((t.name,), r.written)
        size.add_metric((t.name,), r.bytes_written)
        held.add_metric((t.name,), r.bytes_found + r.bytes_written)
        for reason, n in sorted(r.failures.items()):
            failures.add_metric((t.name, reason), n)
    yield from (kept, size, held, failures)


def _runtime(t: TargetState, model: str) -> str:
    """The serving engine of a target's model: its last evaluation's, else the target's."""
    if t.view is not None:
        s = t.view.evaluation.signals.get(model)
        if s is not None:
            return s.runtime.name
    return t.runtime or "vllm"


def _model(t: TargetState, model: str) -> tuple[str, str, str]:
    """The labels of a model's series: target, model_name (bounded), runtime."""
    return t.name, label_value(model), _runtime(t, model)


def _q(q: Quantile | None) -> float | None:
    return None if q is None else q.value


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


#: (name, help, the quantile it shows): one gauge per quantile and model.
_QUANTILES: tuple[tuple[str, str, Callable[[Signals], Quantile | None]], ...] = (
    ("ttft_p50_seconds", "Time to first token over the window, median.", lambda s: s.ttft_p50),
    (
        "ttft_p90_seconds",
        "Time to first token over the window, 90th percentile.",
        lambda s: s.ttft_p90,
    ),
    (
        "ttft_p99_seconds",
        "Time to first token over the window, 99th percentile.",
        lambda s: s.ttft_p99,
    ),
    ("itl_p50_seconds", "Inter-token latency over the window, median.", lambda s: s.itl_p50),
    (
        "itl_p99_seconds",
        "Inter-token latency over the window, 99th percentile.",
        lambda s: s.itl_p99,
    ),
)

#: (name, help, value from the signals and the evaluation's measurements of the model):
#: one gauge per model each. The derived numbers come from ``Evaluation.measurements``, the
#: numbers the status page charts, computed once in the core, healthy or not.
_SIGNALS: tuple[tuple[str, str, Callable[[Signals, Mapping[str, float]], float | None]], ...] = (
    ("ttft_mean_seconds", "Mean time to first token over the window.", lambda s, m: s.ttft_mean),
    ("itl_mean_seconds", "Mean inter-token latency over the window.", lambda s, m: s.itl_mean),
    (
        "queue_time_ttft_ratio",
        "Mean queue time as a share of mean TTFT (absent when not comparable).",
        lambda s, m: m.get("queue_share_of_ttft"),
    ),
    (
        "prefill_time_ratio",
        "Share of engine time spent in prefill (prefill / (prefill + decode)).",
        lambda s, m: s.prefill_time_share,
    ),
    ("requests_waiting", "Mean requests waiting over the window.", lambda s, m: s.waiting_mean),
    ("requests_running", "Mean requests running over the window.", lambda s, m: s.running_mean),
    (
        "kv_cache_usage_ratio",
        "Mean KV-cache usage over the window (0..1).",
        lambda s, m: s.kv_usage_mean,
    ),
    (
        "kv_cache_usage_max_ratio",
        "Highest KV-cache usage seen in the window (0..1).",
        lambda s, m: s.kv_usage_max,
    ),
    (
        "kv_headroom_requests",
        "Requests of the window's mean size that still fit in the free KV cache.",
        lambda s, m: m.get("kv_headroom_requests"),
    ),
    (
        "preemptions_per_second",
        "Preemptions per second over the window.",
        lambda s, m: s.preemptions_per_second,
    ),
    (
        "decode_tokens_per_second",
        "Measured per-stream decode rate: tokens per step / mean inter-token latency.",
        lambda s, m: s.decode_tokens_per_second_per_stream,
    ),
    (
        "decode_ceiling_tokens_per_second",
        "Single-stream decode ceiling: memory bandwidth / weight bytes read per token.",
        lambda s, m: m.get("decode_ceiling_tokens_per_second"),
    ),
    (
        "decode_ceiling_ratio",
        "Single-stream figure: per-stream decode rate / single-stream ceiling (weights only; "
        "a batch is judged by decode_roofline_ratio).",
        lambda s, m: m.get("decode_ceiling_ratio"),
    ),
    (
        "decode_roofline_ratio",
        "Decode step floor / measured step: near 1 at the hardware limit, far below it the "
        "serving stack, above 1 impossible (the hardware or model settings are wrong). A "
        "lower bound when the facts are incomplete: a term that could close the gap is "
        "unknown (decode_roofline_ratio_is_lower_bound in the evidence).",
        lambda s, m: m.get("decode_roofline_ratio"),
    ),
    (
        "load_ratio",
        "Arrivals over the service capacity the window measured (rho): below 1 stable, about "
        "1 (within 1/sqrt(arrivals)) backlogged, above it overloaded (queue_regime in the "
        "evidence).",
        lambda s, m: m.get("load_ratio"),
    ),
    (
        "gpu_dram_active_ratio",
        "Share of cycles the card's memory interface was busy over the window "
        "(DCGM_FI_PROF_DRAM_ACTIVE, mean over the server's GPUs; fleet mode with DCGM).",
        lambda s, m: s.dram_active_mean,
    ),
    (
        "decode_step_seconds",
        "Measured decode step: mean inter-token latency (one sample per request per step).",
        lambda s, m: m.get("decode_step_seconds"),
    ),
    (
        "decode_step_floor_seconds",
        "Shortest the decode step can be, per GPU: max(bytes / bandwidth, FLOPs / compute) "
        "plus draft forwards.",
        lambda s, m: m.get("decode_step_floor_seconds"),
    ),
    (
        "decode_tokens_per_step",
        "Tokens one request gets per engine step: 1 + accepted / drafts under speculative "
        "decoding, else 1.",
        lambda s, m: m.get("decode_tokens_per_step"),
    ),
    (
        "decode_step_tokens",
        "Tokens an engine step computes (prompt, generated and rejected draft tokens).",
        lambda s, m: m.get("decode_batch_tokens_per_step"),
    ),
    (
        "decode_kv_read_ratio",
        "Share of a decode step's bytes that are KV cache reads (0..1).",
        lambda s, m: m.get("decode_kv_read_share"),
    ),
    (
        "prompt_tokens_per_second",
        "Prompt tokens processed per second over the window.",
        lambda s, m: s.prompt_tokens_per_second,
    ),
    (
        "generation_tokens_per_second",
        "Tokens generated per second over the window.",
        lambda s, m: s.generation_tokens_per_second,
    ),
    (
        "no_progress_seconds",
        "Seconds the engine has had requests outstanding (or a probe unanswered) without "
        "any progress: no token, no step, no gauge moving. 0 while it steps or idles.",
        lambda s, m: s.progress.seconds_without_progress if s.progress else None,
    ),
    (
        "last_progress_timestamp_seconds",
        "Unix time of the last scrape at which the engine had made progress.",
        lambda s, m: s.progress.last_progress_at if s.progress else None,
    ),
)


class TriageCollector(Collector):
    """Renders the watchers' and deliveries' latest state on every collection."""

    def __init__(
        self,
        targets: Callable[[], Sequence[TargetState]],
        deliveries: Callable[[], Sequence[ReceiverView]],
        store: Callable[[], StoreStatus | None] = lambda: None,
        slo: Slo | None = None,
    ) -> None:
        self._targets = targets
        self._deliveries = deliveries
        self._store = store
        self._slo = slo

    def collect(self) -> Iterable[Metric]:
        targets = list(self._targets())
        yield from self._target_health(targets)
        yield from self._signals(targets)
        yield from self._decode_roofline(targets)
        yield from self._inconsistent(targets)
        yield from self._diagnoses(targets)
        yield from self._probes(targets)
        yield from self._notifications()
        yield from self._state_store()
        yield from self._objectives()
        info = Gauge(
            P + "build_info", "vllm-triage's version.", labels=("version", "python_version")
        )
        info.add_metric((__version__, platform.python_version()), 1)
        yield info

    def _target_health(self, targets: list[TargetState]) -> Iterator[Metric]:
        up = Gauge(P + "target_up", "1 if the last scrape worked.", labels=("target",))
        duration = Gauge(
            P + "scrape_duration_seconds", "How long the last scrape took.", labels=("target",)
        )
        last = Gauge(
            P + "last_scrape_timestamp_seconds",
            "Unix time of the last successful scrape.",
            labels=("target",),
        )
        scrapes = Counter(P + "scrapes", "Scrapes attempted.", labels=("target",))
        failures = Counter(
            P + "scrape_failures",
            "Failed scrapes, by reason (timeout, connect, http_status, too_large, parse, ...).",
            labels=("target", "reason"),
        )
        skipped = Counter(
            P + "scrape_skipped",
            "Scheduled scrapes skipped because the previous one had not finished.",
            labels=("target",),
        )
        problems = Counter(
            P + "series_unusable",
            "Series present in a scrape but unusable (NaN, broken histogram), left out.",
            labels=("target",),
        )
        dropped = Counter(
            P + "models_dropped",
            "model_name values left out because the target exposed more than "
            "max_models_per_target.",
            labels=("target",),
        )
        clock_back = Counter(
            P + "clock_steps_back",
            "Scrapes timed before the last evaluation (the wall clock went back): each "
            "started the window again.",
            labels=("target",),
        )
        for t in targets:
            up.add_metric((t.name,), 1.0 if t.up else 0.0)
            dropped.add_metric((t.name,), t.models_dropped)
            clock_back.add_metric((t.name,), t.clock_steps_back)
            scrapes.add_metric((t.name,), t.scrapes)
            skipped.add_metric((t.name,), t.skipped_ticks)
            problems.add_metric((t.name,), t.series_problems)
            if t.last_duration_s is not None:
                duration.add_metric((t.name,), t.last_duration_s)
            if t.last_success_at is not None:
                last.add_metric((t.name,), t.last_success_at)
            for reason, n in sorted(t.failures.items()):
                failures.add_metric((t.name, reason), n)
        yield from (up, duration, last, scrapes, failures, skipped, problems, dropped, clock_back)
        fleet = [t for t in targets if t.servers_left_out is not None]
        if fleet:  # fleet mode only
            left_out = Gauge(
                P + "fleet_servers_left_out",
                "Servers the query API shows beyond prometheus.max_servers, not judged now.",
                labels=("target",),
            )
            cannot_tell = Gauge(
                P + "fleet_servers_cannot_tell",
                "Servers not judged at the last tick because their answers may miss data "
                "(partial, series_drop, duplicated, split); their last verdicts stand.",
                labels=("target", "reason"),
            )
            partial = Counter(
                P + "fleet_partial_answers",
                "Query API answers that said they were partial (isPartial, a store's warning).",
                labels=("target",),
            )
            for t in fleet:
                left_out.add_metric((t.name,), t.servers_left_out or 0)
                partial.add_metric((t.name,), t.partial_answers)
                for reason, n in sorted((t.cannot_tell or {}).items()):
                    cannot_tell.add_metric((t.name, reason), n)
            yield from (left_out, cannot_tell, partial)
        yield from _recording(targets)

    def _signals(self, targets: list[TargetState]) -> Iterator[Metric]:
        # One gauge per quantile, not a ``quantile`` label: Prometheus keeps that label
        # for summaries (promtool flags it on a gauge).
        quantiles = [
            (Gauge(P + name, help_text, labels=MODEL), get) for name, help_text, get in _QUANTILES
        ]
        families = [Gauge(P + n, h, labels=MODEL) for n, h, _ in _SIGNALS]
        for t in targets:
            if not t.up or t.view is None:
                continue
            ev = t.view.evaluation
            for model, s in sorted(ev.signals.items()):
                measured = ev.measurements.get(model, {})
                labels = _model(t, model)
                for qfam, qget in quantiles:
                    value = _q(qget(s))
                    if value is not None:
                        qfam.add_metric(labels, value)
                for fam, (_, _, get) in zip(families, _SIGNALS, strict=True):
                    value = get(s, measured)
                    if value is not None:
                        fam.add_metric(labels, value)
        yield from (fam for fam, _ in quantiles)
        yield from families

    def _inconsistent(self, targets: list[TargetState]) -> Iterator[Metric]:
        """Only while some model's counters go back and forth (absent otherwise)."""
        found = [
            (_model(t, model), s.counter_resets)
            for t in targets
            if t.up and t.view is not None
            for model, s in sorted(t.view.evaluation.signals.items())
            if s.counter_resets >= INCONSISTENT_RESETS
        ]
        if not found:
            return
        family = Gauge(
            P + "counter_resets",
            "Scrapes in the window whose counters went backwards, while two or more (more "
            "than one server behind the target's address?): its rates are left out.",
            labels=MODEL,
        )
        for labels, resets in found:
            family.add_metric(labels, resets)
        yield family

    def _decode_roofline(self, targets: list[TargetState]) -> Iterator[Metric]:
        """The decode step's bytes by part and which resource binds it
        (``docs/physics.md``, "The decode roofline"); a part whose size is unknown is absent."""
        parts = Gauge(
            P + "decode_step_bytes",
            "Bytes a decode step reads per GPU, by part: weights, kv (the KV cache of the "
            "running sequences), draft (a draft model's forwards).",
            labels=(*MODEL, "part"),
        )
        binding = Gauge(
            P + "decode_binding_resource",
            "1 for the resource that sets the decode step's floor (memory or compute), "
            "0 for the other.",
            labels=(*MODEL, "resource"),
        )
        for t in targets:
            if not t.up or t.view is None:
                continue
            evaluation = t.view.evaluation
            for model, d in sorted(evaluation.diagnoses.items()):
                measured = evaluation.measurements.get(model, {})
                labels = _model(t, model)
                for part, key in ROOFLINE_PARTS:
                    value = measured.get(key)
                    if value is not None:
                        parts.add_metric((*labels, part), value)
                bound = d.evidence.get("decode_bound_by")
                if isinstance(bound, str):
                    for resource in RESOURCES:
                        binding.add_metric((*labels, resource), float(resource == bound))
        yield from (parts, binding)

    def _diagnoses(self, targets: list[TargetState]) -> Iterator[Metric]:
        state = Gauge(
            P + "diagnosis",
            "The open incident's cause per model: 1 for it, 0 for the others; healthy when none.",
            labels=(*MODEL, "diagnosis"),
        )
        breach = Gauge(
            P + "slo_breach",
            "1 if the last evaluation breached this SLO.",
            labels=(*MODEL, "slo"),
        )
        opened = Counter(
            P + "incidents_opened",
            "Incidents that started firing, by cause.",
            labels=(*MODEL, "diagnosis"),
        )
        changes = Counter(
            P + "incident_cause_changes",
            "Changes of cause inside an open incident, by the cause it changed to.",
            labels=(*MODEL, "diagnosis"),
        )
        contributing = Gauge(
            P + "contributing",
            "Each other cause whose symptoms are present beside the primary one: its share "
            "of the evidence (0 when not contributing).",
            labels=(*MODEL, "diagnosis"),
        )
        for t in targets:
            if t.view is not None:
                active = {a.model_name: a.cause for a in t.view.active}
                for model, d in sorted(t.view.evaluation.diagnoses.items()):
                    current = active.get(model, "healthy")
                    labels = _model(t, model)
                    for name in DIAGNOSES:
                        state.add_metric((*labels, name), 1.0 if name == current else 0.0)
                    for name in BREACHES:
                        breach.add_metric((*labels, name), 1.0 if name in d.breaches else 0.0)
                    shares = {c.cause: c.share for c in d.contributing}
                    for name in CAUSES:
                        contributing.add_metric((*labels, name), shares.get(name, 0.0))
            for (model, cause), n in sorted(t.incidents_opened.items()):
                opened.add_metric((*_model(t, model), cause), n)
            for (model, cause), n in sorted(t.cause_changes.items()):
                changes.add_metric((*_model(t, model), cause), n)
        yield from (state, breach, opened, changes, contributing)

    def _probes(self, targets: list[TargetState]) -> Iterator[Metric]:
        """Only targets with a probe enabled appear here."""
        label = ("target",)
        seconds = Gauge(
            P + "probe_seconds",
            "How long the last finished probe took (to its answer, or to its deadline).",
            labels=label,
        )
        probes = Counter(P + "probes", "Probes sent.", labels=label)
        failures = Counter(
            P + "probe_failures",
            "Probes that failed, by reason (timeout, connect, http_status, http_error, "
            "bad_response).",
            labels=("target", "reason"),
        )
        for t in targets:
            p = t.probe
            if p is None:
                continue
            probes.add_metric((t.name,), p.probes)
            for reason, n in sorted(p.failures.items()):
                failures.add_metric((t.name, reason), n)
            if p.last_seconds is not None:
                seconds.add_metric((t.name,), p.last_seconds)
        yield from (seconds, probes, failures)

    def _notifications(self) -> Iterator[Metric]:
        label = ("receiver",)
        sent = Counter(P + "notifications_sent", "Delivered.", labels=label)
        retried = Counter(
            P + "notification_retries",
            "Delivery attempts that failed and were retried.",
            labels=label,
        )
        failed = Counter(
            P + "notifications_failed",
            "Notifications given up on after retrying (or refused with a 4xx).",
            labels=label,
        )
        dropped = Counter(
            P + "notifications_dropped", "Dropped because the queue was full.", labels=label
        )
        pending = Gauge(
            P + "notifications_pending", "Waiting for delivery, or being tried.", labels=label
        )
        for d in self._deliveries():
            sent.add_metric((d.name,), d.stats.sent)
            retried.add_metric((d.name,), d.stats.retried)
            failed.add_metric((d.name,), d.stats.failed)
            dropped.add_metric((d.name,), d.stats.dropped)
            pending.add_metric((d.name,), d.pending)
        yield from (sent, retried, failed, dropped, pending)

    def _objectives(self) -> Iterator[Metric]:
        """The SLOs this daemon judges by, so that a dashboard draws the very lines the
        incidents were opened against (not a number typed into the panel)."""
        if self._slo is None:
            return
        seconds = Gauge(
            P + "slo_seconds",
            "The latency SLO each evaluation is judged by (slo.*_seconds): p99 above it "
            "is a breach.",
            labels=("slo",),
        )
        seconds.add_metric(("ttft_p99",), self._slo.ttft_p99_seconds)
        seconds.add_metric(("itl_p99",), self._slo.itl_p99_seconds)
        waiting = Gauge(
            P + "slo_waiting_requests",
            "Mean requests waiting over the window that counts as sustained queueing "
            "(slo.waiting_requests).",
        )
        waiting.add_metric((), self._slo.waiting_requests)
        yield from (seconds, waiting)

    def _state_store(self) -> Iterator[Metric]:
        """Only when the daemon keeps state (``state_dir``)."""
        status = self._store()
        if status is None:
            return
        durable = Gauge(
            P + "state_durable",
            "1 while the state store writes (open incidents and undelivered notifications "
            "survive a restart); 0 while the disk fails and the state is in memory only.",
        )
        durable.add_metric((), float(status.durable))
        failures = Counter(
            P + "state_write_failures",
            "Writes to the state store that failed (a full, read-only or failing disk).",
        )
        failures.add_metric((), status.write_failures)
        yield from (durable, failures)


def build_registry(
    targets: Callable[[], Sequence[TargetState]],
    deliveries: Callable[[], Sequence[ReceiverView]],
    *,
    store: Callable[[], StoreStatus | None] = lambda: None,
    slo: Slo | None = None,
    process_metrics: bool = True,
) -> CollectorRegistry:
    """A registry of our own: no platform collectors from the global one. The daemon's own
    CPU and memory (process_*), for its resource limits, unless ``process_metrics`` is off
    (the golden file leaves them out: they differ on every run). ``slo``: the SLOs the
    daemon judges by, exported as gauges."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TriageCollector(targets, deliveries, store, slo))
    if process_metrics:
        ProcessCollector(registry=registry)
    return registry
