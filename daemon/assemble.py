"""The one assembly point: validated settings in, every part of the daemon out.

Only this module (and the commands, which load the settings and hand them here) reads
the root ``Settings``. It converts them into the core's plain dataclasses (a target's
``Rulebook``: the GPU name resolved, config.json read, remediation loaded) and builds
every part explicitly, handing each only what it needs: a target's evaluator, history,
parse limits, request headers and probe; each receiver's encoding and delivery; the
fleet's query plan, hardware resolver and the function that builds a discovered
server's target; the HTTP listener; the daemon. Nothing else derives its own part of
the settings. Configured targets are built at start-up; fleet mode's servers as they
are discovered, and its (card, model) pairs as they are first seen, through the same
functions.
"""

from __future__ import annotations

import functools
import hashlib
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import structlog

from vllm_triage.ceiling.gpus import find_gpu
from vllm_triage.ceiling.resolve import build_ceiling, build_roofline, model_size
from vllm_triage.ceiling.sizing import ModelSize
from vllm_triage.config.auth import auth_headers
from vllm_triage.config.schema import (
    HardwareSettings,
    ModelSettings,
    PrometheusSourceSettings,
    ReceiverSettings,
    Settings,
    TargetSettings,
)
from vllm_triage.core.evaluate import Evaluator
from vllm_triage.core.model import CAUSES, Cause
from vllm_triage.core.parse import ParseLimits
from vllm_triage.core.rulebook import Ceiling, Roofline, Rulebook, Slo, Thresholds
from vllm_triage.core.timeline import setting_values
from vllm_triage.errors import ConfigError
from vllm_triage.fleet.hardware import HardwareResolver
from vllm_triage.fleet.source import FleetParts, PrometheusSource
from vllm_triage.net.redact import safe_url
from vllm_triage.notify.delivery import Delivery
from vllm_triage.notify.notifier import Notifier
from vllm_triage.notify.receivers import build_receiver
from vllm_triage.page.spec import load_spec
from vllm_triage.recording.report import ReportParts
from vllm_triage.rules import read_bundled
from vllm_triage.scrape.loop import ScrapeParts, Scraper
from vllm_triage.scrape.probe import Prober, completions_url
from vllm_triage.serve.exporter import build_registry
from vllm_triage.serve.listener import HttpServer
from vllm_triage.serve.routes import Endpoints
from vllm_triage.serve.status import live_document
from vllm_triage.service import Daemon, DaemonParts, Readiness
from vllm_triage.state import History, StoreStatus, TargetState
from vllm_triage.store import StateStore
from vllm_triage.target import Health, Target, TargetParts

log = structlog.get_logger("vllm_triage.service")


def _texts(section: str | None, keys: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Lists of remediation texts by key, from rules/remediation.yaml (its top level, or
    one of its sections); a missing or misshapen list names its key."""
    data = read_bundled("remediation.yaml")
    where = f"{section}." if section else ""
    found = data.get(section) if isinstance(data, dict) and section else data
    if not isinstance(found, dict):
        raise ConfigError(f"rules/remediation.yaml: {section or 'top level'}: expected a mapping")
    out: dict[str, tuple[str, ...]] = {}
    for key in keys:
        items = found.get(key)
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ConfigError(f"rules/remediation.yaml: {where}{key}: expected a list of strings")
        out[key] = tuple(items)
    return out


@functools.cache
def load_remediation() -> dict[Cause, tuple[str, ...]]:
    """The remediation texts; cached, like the GPU table (``gpus.load_gpu_table``), because
    they are immutable package data and every target's rulebook reads them: a daemon
    with 250 targets spent seconds of start-up re-parsing this YAML."""
    texts = _texts(None, CAUSES)
    return {cause: texts[cause] for cause in CAUSES}


#: The keys of ``decode_roofline`` in rules/remediation.yaml.
DECODE_TERMS = ("weights", "kv", "draft", "compute", "serving_stack", "settings")
#: The keys of ``by_kind`` in rules/remediation.yaml.
KINDS = ("asleep", "stale_gauges", "render")


@functools.cache
def load_decode_remediation() -> dict[str, tuple[str, ...]]:
    """The decode-bound texts by what the roofline says binds (``decode_roofline``)."""
    return _texts("decode_roofline", DECODE_TERMS)


@functools.cache
def load_kind_remediation() -> dict[str, tuple[str, ...]]:
    """A cause's texts by its kind (``by_kind``): a stall that is not a hang, a TTFT
    spent rendering."""
    return _texts("by_kind", KINDS)


def settings_model_size(settings: Settings) -> ModelSize | None:
    m = settings.model
    return model_size(
        parameters_billion=m.parameters_billion,
        config_json=m.config_json,
        # A config.json names its own dtype; ``m.dtype`` (default float16) is for a count.
        dtype=None if m.config_json is not None else m.dtype,
        kv_cache_dtype=m.kv_cache_dtype,
    )


def ceiling(settings: Settings, size: ModelSize | None = None) -> Ceiling | None:
    """The decode ceiling, when both the hardware and the model size are known."""
    hw = settings.hardware
    name: str | None = None
    bandwidth = hw.memory_bandwidth_gb_s
    if hw.gpu is not None:
        gpu = find_gpu(hw.gpu)
        name = gpu.name
        bandwidth = bandwidth or gpu.memory_bandwidth_gb_s
    size = size or settings_model_size(settings)
    if bandwidth is None or size is None:
        return None
    return build_ceiling(
        name,
        bandwidth,
        size.weight_bytes_per_token,
        tensor_parallel_size=hw.tensor_parallel_size,
        achievable_fraction=hw.achievable_fraction,
    )


def roofline(settings: Settings, size: ModelSize | None = None) -> Roofline | None:
    """The decode step roofline's facts, when the hardware and the model size are known
    (``docs/physics.md``, "The decode roofline"); hand-set keys replace the sized ones."""
    hw, m = settings.hardware, settings.model
    name: str | None = None
    bandwidth, compute = hw.memory_bandwidth_gb_s, hw.compute_tflops
    if hw.gpu is not None:
        gpu = find_gpu(hw.gpu)
        name = gpu.name
        bandwidth = bandwidth or gpu.memory_bandwidth_gb_s
        compute = compute or gpu.bf16_dense_tflops
    size = size or settings_model_size(settings)
    if bandwidth is None or size is None:
        return None
    return build_roofline(
        name,
        bandwidth,
        size,
        compute_tflops=compute,
        tensor_parallel_size=hw.tensor_parallel_size,
        achievable_fraction=hw.achievable_fraction,
        kv_bytes_per_token=m.kv_bytes_per_token,
        active_parameters_billion=m.active_parameters_billion,
        draft_parameters_billion=m.draft_parameters_billion,
        draft_dtype=m.draft_dtype,
        draft_kv_bytes_per_token=m.draft_kv_bytes_per_token,
    )


def build_rulebook(settings: Settings) -> Rulebook:
    slo, th = settings.slo, settings.thresholds
    size = settings_model_size(settings)
    return Rulebook(
        slo=Slo(
            ttft_p99_seconds=slo.ttft_p99_seconds,
            itl_p99_seconds=slo.itl_p99_seconds,
            waiting_requests=slo.waiting_requests,
        ),
        thresholds=Thresholds(
            min_observations=th.min_observations,
            kv_headroom_requests=th.kv_headroom_requests,
            kv_usage_full=th.kv_usage_full,
            queue_share_of_ttft=th.queue_share_of_ttft,
            prefill_dominant_share=th.prefill_dominant_share,
            itl_spike_ratio=th.itl_spike_ratio,
            near_ceiling_ratio=th.near_ceiling_ratio,
            roofline_impossible_ratio=th.roofline_impossible_ratio,
            dram_active_busy=th.dram_active_busy,
            stall_after_seconds=th.stall_after_seconds,
        ),
        remediation=load_remediation(),
        ceiling=ceiling(settings, size),
        roofline=roofline(settings, size),
        decode_remediation=load_decode_remediation(),
        kind_remediation=load_kind_remediation(),
    )


def build_evaluator(settings: Settings, rulebook: Rulebook | None = None) -> Evaluator:
    """A fresh core for one target, configured from the settings (and ``rulebook``, when
    the caller already resolved one, as the demo does with each scenario's hardware)."""
    return Evaluator(
        rulebook or build_rulebook(settings),
        window_seconds=settings.window_seconds,
        open_after=settings.incident.open_after,
        resolve_after=settings.incident.resolve_after,
        change_cause_after=settings.incident.change_cause_after,
        reopen_within=settings.incident.reopen_within,
    )


def parse_limits(settings: Settings) -> ParseLimits:
    """What one scrape of a target may cost to read."""
    return ParseLimits(
        max_lines=settings.max_lines_per_scrape,
        max_line_length=settings.max_line_length,
        max_label_value_length=settings.max_label_value_length,
        max_models=settings.max_models_per_target,
    )


def settings_rows(settings: Settings) -> list[list[str]]:
    """The settings the diagnosis used, as ``[key, value]`` rows for the report and the
    status page (not the daemon's targets or receivers)."""
    doc = settings.model_dump(
        mode="json",
        include={"window_seconds", "slo", "incident", "thresholds", "hardware", "model"},
    )
    rows: list[list[str]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif value is not None:
            rows.append([prefix, str(value)])

    walk("", doc)
    return rows


def report_parts(settings: Settings) -> ReportParts:
    """What a post-mortem report of a recording needs."""
    rules = build_rulebook(settings)
    return ReportParts(
        rulebook=rules,
        evaluator=build_evaluator(settings, rules),
        settings_rows=settings_rows(settings),
    )


class _Rulebooks:
    """Fleet mode's (hardware, model) pairs, converted as the top level is."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def rulebook(self, hardware: HardwareSettings, model: ModelSettings) -> Rulebook:
        return build_rulebook(
            self._settings.model_copy(update={"hardware": hardware, "model": model})
        )

    def check_model(self, model: ModelSettings) -> None:
        settings_model_size(self._settings.model_copy(update={"model": model}))


def history(settings: Settings, rulebook: Rulebook) -> History:
    spec = load_spec()
    return History.for_interval(
        spec.measured_keys,
        history_seconds=spec.history_seconds,
        interval_seconds=settings.interval_seconds,
        settings_values=setting_values(rulebook),
    )


def build_target(
    settings: Settings,
    name: str,
    url: str,
    *,
    notifier: Notifier | None,
    store: StateStore | None = None,
    rulebook: Rulebook | None = None,
) -> Target:
    """A target's after-the-core half, configured or discovered. ``url`` is shown to
    people (never with credentials); ``settings`` are the ones in force for it (a
    configured target's own hardware and model included: ``Settings.for_target``)."""
    rules = rulebook or build_rulebook(settings)
    parts = TargetParts(
        name=name,
        url=url,
        evaluator=build_evaluator(settings, rules),
        history=history(settings, rules),
        max_models=settings.max_models_per_target,
    )
    return Target(parts, notifier=notifier, store=store)


def build_scraped(
    settings: Settings,
    target: TargetSettings,
    *,
    client: httpx.AsyncClient,
    notifier: Notifier | None,
    store: StateStore | None = None,
    clock: Callable[[], float] = time.time,
) -> Scraper:
    """A configured target: its ``Target`` and the scrape loop (and probe) that feeds it."""
    built = build_target(
        settings.for_target(target),
        target.name,
        safe_url(target.url),
        notifier=notifier,
        store=store,
    )
    headers = auth_headers(target)
    prober: Prober | None = None
    if target.probe.enabled:
        prober = Prober(
            target.name,
            target.probe,
            url=completions_url(target.url, target.probe.url),
            headers=headers,
            client=client,
            model=lambda: _first_model(built),
            clock=clock,
        )
    parts = ScrapeParts(
        url=target.url,
        headers=headers,
        timeout=settings.scrape_timeout,
        max_body_bytes=settings.max_body_bytes,
        limits=parse_limits(settings),
    )
    return Scraper(built, parts, client=client, prober=prober, clock=clock)


def _first_model(target: Target) -> str | None:
    """The model the probe asks for: the first ``model_name`` the target exposes."""
    view = target.state.view
    if view is None or not view.evaluation.diagnoses:
        return None
    return min(view.evaluation.diagnoses)


def receiver_name(settings: Settings, index: int) -> str:
    """A receiver's identity, under which the store keeps its log and its pending
    notifications: its ``name``, else its type and a short hash of its type and URL, so
    that inserting, removing or reordering receivers never hands one's queue to another.
    (The hash reveals nothing of a URL that holds a token.)"""
    r: ReceiverSettings = settings.receivers[index]
    return r.name or unnamed_receiver(r.type, r.url.get_secret_value())


def unnamed_receiver(kind: str, url: str) -> str:
    digest = hashlib.sha256(f"{kind}\n{url.rstrip('/')}".encode()).hexdigest()[:8]
    return f"{kind}-{digest}"


def _adopt_positional_names(settings: Settings, store: StateStore) -> None:
    """Stores written before receivers had stable names keyed an unnamed receiver by its
    position (``slack-0``): hand each such key to the unnamed receiver of that type still
    at that position, once, and say so. Any other unknown key is the notifier's to
    report (``receiver_gone``)."""
    names = {receiver_name(settings, i) for i in range(len(settings.receivers))}
    kept = store.restored.receivers()
    for i, r in enumerate(settings.receivers):
        old = f"{r.type}-{i}"
        if r.name is None and old in kept and old not in names:
            new = receiver_name(settings, i)
            store.rename_receiver(old, new)
            log.info("receiver_key_renamed", old=old, new=new, why="stable receiver names")


def build_notifier(
    settings: Settings,
    client: httpx.AsyncClient,
    external_url: str,
    store: StateStore | None = None,
) -> Notifier:
    """Each receiver's encoding and delivery queue, and the notifier over them."""
    deliveries = [
        Delivery(build_receiver(receiver_name(settings, i), r, external_url), client, store)
        for i, r in enumerate(settings.receivers)
    ]
    return Notifier(
        deliveries,
        severity=settings.alerting.severity,
        external_url=external_url,
        store=store,
    )


def _prometheus(settings: Settings) -> PrometheusSourceSettings:
    if settings.prometheus is None:
        raise ConfigError("source: prometheus needs a `prometheus:` section with its url")
    return settings.prometheus


def build_hardware_resolver(settings: Settings) -> HardwareResolver:
    """Fleet mode's card and model for each server, from its labels, DCGM and the rules."""
    source = _prometheus(settings)
    return HardwareResolver(
        source.servers,
        source.models,
        hardware=settings.hardware,
        model=settings.model,
        factory=_Rulebooks(settings),
    )


def build_fleet(
    settings: Settings,
    *,
    client: httpx.AsyncClient,
    notifier: Notifier | None,
    store: StateStore | None = None,
    clock: Callable[[], float] = time.time,
) -> PrometheusSource:
    """Fleet mode: the query plan's parts, the hardware resolver, and the function that
    builds each discovered server's bare target (one rulebook for all of them: the
    top-level settings; each model's own comes from the resolver at judging)."""
    source = _prometheus(settings)
    top = build_rulebook(settings)
    shown = safe_url(source.url.rstrip("/") + "/api/v1/query")

    def new_target(name: str) -> Target:
        target = build_target(settings, name, shown, notifier=notifier, store=store, rulebook=top)
        if store is not None:
            store.participants.append(target)
        return target

    hardware = build_hardware_resolver(settings)
    api = Health(TargetState("prometheus", safe_url(source.url), None))
    parts = FleetParts(
        source=source,
        window_seconds=settings.window_seconds,
        step_seconds=settings.interval_seconds,
        min_observations=settings.thresholds.min_observations,
        max_body_bytes=settings.max_body_bytes,
        hardware=hardware,
        new_target=new_target,
        api=api,
        headers={"Accept": "application/json", "Accept-Encoding": "gzip", **auth_headers(source)},
        # Prometheus' range must hold several of its own scrapes: a minute at least.
        stall_seconds=max(settings.thresholds.stall_after_seconds, 60.0),
    )
    return PrometheusSource(parts, client=client, notifier=notifier, clock=clock, store=store)


def external_url(settings: Settings, address: tuple[str, int]) -> str:
    """Where alerts' links point: ``alerting.external_url``, else this listener."""
    if settings.alerting.external_url:
        return settings.alerting.external_url.rstrip("/")
    host, port = address
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"http://{host}:{port}"


def build_daemon(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    default_state_dir: Path | None = None,
) -> Daemon:
    """The whole daemon, its port bound and its state restored, ready to ``run``.

    ``default_state_dir``: what ``state_dir: auto`` means here (``run`` passes the XDG
    state directory; an in-process daemon, as the demo's, keeps nothing)."""
    # The receivers and the fleet's query API share one client. Each scraped target gets
    # a client of its own, with one kept-alive connection: in one shared pool every
    # request scans every idle connection, which made 500 targets cost a core
    # (bench/bench_daemon.py). The TLS context is built once and shared.
    tls = ssl.create_default_context()
    client = httpx.AsyncClient(follow_redirects=False, verify=tls)
    ready = Readiness()
    scrapers: list[Scraper] = []
    fleet: PrometheusSource | None = None
    notifier: Notifier | None = None

    def states() -> list[TargetState]:
        if fleet is not None:
            return fleet.states()
        return [s.target.state for s in scrapers]

    def deliveries() -> list[Delivery]:
        return notifier.deliveries if notifier is not None else []

    state_dir = settings.state_path(default_state_dir)
    store: StateStore | None = None

    def store_status() -> StoreStatus | None:
        return store.status() if store is not None else None

    rows, interval = settings_rows(settings), settings.interval_seconds
    endpoints = Endpoints(
        build_registry(states, deliveries, store=store_status),
        states,
        ready,
        clock,
        series=lambda now: live_document(
            states(),
            now=now,
            interval_seconds=interval,
            settings_rows=rows,
            receivers=deliveries(),
        ),
        store=store_status,
    )
    http = HttpServer(settings.listen, endpoints)
    store = StateStore.open(state_dir) if state_dir is not None else None
    if store is not None:
        _adopt_positional_names(settings, store)
    notifier = build_notifier(settings, client, external_url(settings, http.address), store)
    for t in settings.targets:
        scraper_client = httpx.AsyncClient(
            follow_redirects=False,
            verify=tls,
            limits=httpx.Limits(max_connections=2, max_keepalive_connections=1),
        )
        scrapers.append(
            build_scraped(
                settings, t, client=scraper_client, notifier=notifier, store=store, clock=clock
            )
        )
    if settings.source == "prometheus":
        fleet = build_fleet(settings, client=client, notifier=notifier, store=store, clock=clock)
    elif store is not None:
        # Targets no longer configured: nothing will evaluate them again. (In fleet
        # mode servers are discovered as they appear, so theirs wait in the store.)
        with store.batch():
            for name in sorted(store.restored.incidents):
                log.warning("incidents_target_gone", target=name)
                store.save_incidents(name, ())
            store.restored.incidents.clear()
            notifier.resolve_gone({t.name for t in settings.targets}, clock())
    if store is not None:
        # What writes itself afresh when a failing disk takes writes again.
        store.participants.extend(s.target for s in scrapers)
        store.participants.append(notifier)
        store.participants.extend(notifier.deliveries)
    parts = DaemonParts(
        http=http,
        store=store,
        notifier=notifier,
        scrapers=scrapers,
        fleet=fleet,
        client=client,
        interval_seconds=settings.interval_seconds,
        shutdown_grace_seconds=settings.shutdown_grace_seconds,
        source=settings.source,
        ready=ready,
    )
    return Daemon(parts, clock=clock)
