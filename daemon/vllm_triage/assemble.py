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

import contextlib
import dataclasses
import hashlib
import re
import shutil
import socket
import ssl
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import structlog

from vllm_triage.ceiling.sizing import ModelSize
from vllm_triage.config.auth import auth_headers
from vllm_triage.config.rulebook import Rulebooks, ceiling_of, model_size_of, slo_of
from vllm_triage.config.schema import (
    TENANT_HEADER,
    PrometheusSourceSettings,
    ReceiverSettings,
    Settings,
    TargetSettings,
    TlsSettings,
)
from vllm_triage.core.evaluate import Evaluator
from vllm_triage.core.parse import ParseLimits
from vllm_triage.core.rulebook import Ceiling, Rulebook
from vllm_triage.core.timeline import setting_values
from vllm_triage.errors import ConfigError
from vllm_triage.fleet.hardware import HardwareResolver
from vllm_triage.fleet.source import FleetParts, PrometheusSource
from vllm_triage.net.redact import safe_url
from vllm_triage.net.tls import client_context
from vllm_triage.notify.delivery import Delivery
from vllm_triage.notify.notifier import Notifier
from vllm_triage.notify.receivers import build_receiver
from vllm_triage.page.spec import load_spec
from vllm_triage.recording.report import ReportParts
from vllm_triage.scrape.keep import ScrapeKeeper, folder_bytes
from vllm_triage.scrape.loop import ScrapeParts, Scraper
from vllm_triage.scrape.probe import Prober, completions_url
from vllm_triage.serve.exporter import build_registry
from vllm_triage.serve.listener import HttpServer, bind
from vllm_triage.serve.routes import Endpoints
from vllm_triage.serve.status import live_document
from vllm_triage.service import Daemon, DaemonParts, Readiness
from vllm_triage.state import History, StoreStatus, TargetState
from vllm_triage.store import StateStore
from vllm_triage.target import Health, Target, TargetParts

log = structlog.get_logger("vllm_triage.service")


def _rulebooks(settings: Settings) -> Rulebooks:
    return Rulebooks(settings.slo, settings.thresholds)


def settings_model_size(settings: Settings) -> ModelSize | None:
    return model_size_of(settings.model)


def ceiling(settings: Settings, size: ModelSize | None = None) -> Ceiling | None:
    """The decode ceiling, when both the hardware and the model size are known."""
    return ceiling_of(settings.hardware, size or settings_model_size(settings))


def build_rulebook(settings: Settings) -> Rulebook:
    """The core's rulebook from the settings (``config.rulebook``, each roofline fact
    with its source)."""
    return _rulebooks(settings).rulebook(settings.hardware, settings.model)


def model_rulebooks(settings: Settings, base: Rulebook) -> Callable[[str], Rulebook] | None:
    """Each served model's rulebook, from the bundled model table where the settings
    leave the model's facts to it (``Rulebooks.served_names``); ``None`` otherwise."""
    return _rulebooks(settings).served_names(settings.hardware, settings.model, base)


@dataclasses.dataclass(frozen=True, slots=True)
class SharedParts:
    """What every target built from the same settings and rulebook may share (fleet mode:
    thousands of servers, one set of settings): each served model's rulebook, built once
    per name for all of them, and the settings drawn on their charts, one read-only copy."""

    rulebook_for: Callable[[str], Rulebook] | None
    settings_values: Mapping[str, float]

    @classmethod
    def of(cls, settings: Settings, rulebook: Rulebook) -> SharedParts:
        values = MappingProxyType(_charted_settings(rulebook))
        return cls(model_rulebooks(settings, rulebook), values)


def _charted_settings(rulebook: Rulebook) -> dict[str, float]:
    # Interned: a fleet's servers each show these, one copy of each name between them.
    return {sys.intern(k): v for k, v in setting_values(rulebook).items()}


def build_evaluator(
    settings: Settings, rulebook: Rulebook | None = None, *, shared: SharedParts | None = None
) -> Evaluator:
    """A fresh core for one target, configured from the settings (and ``rulebook``, when
    the caller already resolved one, as the demo does with each scenario's hardware),
    each served model's facts from the bundled table where the settings leave them
    (``shared``: the rulebooks of those facts, when built for ``rulebook`` already)."""
    rules = rulebook or build_rulebook(settings)
    return Evaluator(
        rules,
        rulebook_for=(
            shared.rulebook_for if shared is not None else model_rulebooks(settings, rules)
        ),
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


def history(
    settings: Settings, rulebook: Rulebook, *, shared: SharedParts | None = None
) -> History:
    """A target's status-page hour: a point per evaluation; in fleet mode, a point per
    ``prometheus.history_step_seconds`` (thousands of servers, looked at one at a time)."""
    spec = load_spec()
    fleet = settings.prometheus if settings.source == "prometheus" else None
    return History.for_interval(
        spec.measured_keys,
        history_seconds=spec.history_seconds,
        interval_seconds=settings.interval_seconds,
        settings_values=(
            shared.settings_values if shared is not None else _charted_settings(rulebook)
        ),
        step_seconds=fleet.history_step_seconds if fleet is not None else 0.0,
    )


def build_target(
    settings: Settings,
    name: str,
    url: str,
    *,
    notifier: Notifier | None,
    store: StateStore | None = None,
    rulebook: Rulebook | None = None,
    server_labels: Mapping[str, str] | None = None,
    say: Any = None,
    shared: SharedParts | None = None,
) -> Target:
    """A target's after-the-core half, configured or discovered. ``url`` is shown to
    people (never with credentials); ``settings`` are the ones in force for it (a
    configured target's own hardware and model included: ``Settings.for_target``);
    ``server_labels``: its identity labels on its alerts (default: the settings');
    ``say``: where its condition lines go (``Target``); ``shared``: what the targets of
    the same settings and ``rulebook`` share (``SharedParts``)."""
    rules = rulebook or build_rulebook(settings)
    parts = TargetParts(
        name=name,
        url=url,
        evaluator=build_evaluator(settings, rules, shared=shared),
        history=history(settings, rules, shared=shared),
        max_models=settings.max_models_per_target,
        server_labels=(
            dict(settings.alerting.server_labels) if server_labels is None else server_labels
        ),
    )
    return Target(parts, notifier=notifier, store=store, say=say)


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
        server_labels=settings.server_labels_of(target),
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
        runtime=target.runtime,
    )
    return Scraper(
        built,
        parts,
        client=client,
        prober=prober,
        keeper=build_keeper(settings, target),
        clock=clock,
    )


def build_keeper(settings: Settings, target: TargetSettings) -> ScrapeKeeper | None:
    """The daemon's own recording of ``target`` (``record.dir``, ``run --record``): one
    folder per target, named after it, in the format ``record`` writes."""
    if settings.record.dir is None:
        return None
    folder = Path(settings.record.dir).expanduser() / record_folder_name(target.name)
    return ScrapeKeeper(target.name, folder, max_bytes=settings.record.max_bytes)


#: What a recording must leave free on its disk: the state store's file and journal, which
#: usually share the volume (the sidecar's one writable volume holds both).
RECORD_DISK_RESERVE = 16 * 2**20


def check_record_room(settings: Settings) -> None:
    """Refuse a recording whose bound the disk cannot hold: every target's
    ``record.max_bytes``, less what its folder holds already, must fit in the free space
    of ``record.dir``'s disk less ``RECORD_DISK_RESERVE``. A recording that fills the disk
    fails the state store's writes, and in a pod gets the pod evicted (an ``emptyDir`` past
    its ``sizeLimit``), vLLM with it. (An ``emptyDir`` on the node's disk shows the node's
    free space, not its ``sizeLimit``: the sidecar's manifest sets ``record.max_bytes``
    below it; docs/deploy.md.)"""
    if settings.record.dir is None:
        return
    root = Path(settings.record.dir).expanduser()
    need = sum(
        max(0, settings.record.max_bytes - folder_bytes(root / record_folder_name(t.name)))
        for t in settings.targets
    )
    existing = next((p for p in (root, *root.parents) if p.exists()), Path("/"))
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return  # the folder's own error is said, and counted, at the first write
    if need > free - RECORD_DISK_RESERVE:
        mib = 2**20
        raise ConfigError(
            f"record.max_bytes: {len(settings.targets)} target(s) x "
            f"{settings.record.max_bytes / mib:,.0f} MiB would need {need / mib:,.0f} MiB more "
            f"in {root}, whose disk has {free / mib:,.0f} MiB free ({RECORD_DISK_RESERVE // mib} "
            "MiB kept for the state store): a full disk stops the state store, and in a pod "
            "evicts it; lower record.max_bytes or record elsewhere"
        )


def record_folder_name(target: str) -> str:
    """A target's recording folder: its name, one path component (a name may hold ``/``:
    replaced, with a short hash of the name so that ``a/b`` and ``a_b`` stay apart)."""
    safe = target.replace("/", "_")
    if safe == target:
        return target
    return f"{safe}-{hashlib.sha256(target.encode()).hexdigest()[:8]}"


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


#: A key of a store written before receivers had stable names: the receiver's type and
#: its position among all receivers (a stable key's suffix is 8 hex digits).
_POSITIONAL = re.compile(r"(?P<kind>[a-z_]+)-(?P<index>\d{1,7})")


def _adopt_positional_names(settings: Settings, store: StateStore) -> None:
    """Stores written before receivers had stable names keyed an unnamed receiver by its
    position (``slack-0``). The position says nothing once receivers were reordered in
    the same restart, so a key is handed over only where that cannot go wrong: the store
    holds one positional key of a type and the settings one unnamed receiver of that type
    (wherever it now stands); it is renamed to that receiver's key, once, and said. Where
    two or more could be meant, nothing is handed over and that is said (``receiver_gone``
    then reports what was kept for them): a queue given to the wrong receiver sends one
    team's alerts to another."""
    names = {receiver_name(settings, i) for i in range(len(settings.receivers))}
    legacy: dict[str, list[str]] = {}
    for key in sorted(store.restored.receivers() - names):
        found = _POSITIONAL.fullmatch(key)
        if found is not None:
            legacy.setdefault(found["kind"], []).append(key)
    for kind, keys in sorted(legacy.items()):
        unnamed = [i for i, r in enumerate(settings.receivers) if r.type == kind and r.name is None]
        if len(keys) == 1 and len(unnamed) == 1:
            new = receiver_name(settings, unnamed[0])
            store.rename_receiver(keys[0], new)
            log.info("receiver_key_renamed", old=keys[0], new=new, why="stable receiver names")
        elif unnamed:
            log.warning(
                "receiver_keys_not_adopted",
                kind=kind,
                old=keys,
                unnamed_receivers=len(unnamed),
                why="kept by position by an older version, and which receiver each was "
                "cannot be told now; name your receivers (`name:`) to keep their queues",
            )


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
        factory=_rulebooks(settings),
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
    # One set of settings for every server: their model rulebooks and charted settings
    # built once, not once a server (at 10,000 servers, some 20 MB).
    shared = SharedParts.of(settings, top)
    shown = safe_url(source.url.rstrip("/") + "/api/v1/query")

    def new_target(name: str, identity: Mapping[str, str], say: Any = None) -> Target:
        # A server's alerts carry its identity labels, as the rules' alerts do.
        labels = {**settings.alerting.server_labels, **identity}
        target = build_target(
            settings,
            name,
            shown,
            notifier=notifier,
            store=store,
            rulebook=top,
            server_labels=labels,
            say=say,
            shared=shared,
        )
        if store is not None:
            store.participants.append(target)
        return target

    hardware = build_hardware_resolver(settings)
    api = Health(TargetState("prometheus", safe_url(source.url), None))
    headers = {"Accept": "application/json", "Accept-Encoding": "gzip", **auth_headers(source)}
    if source.tenant is not None:
        headers[TENANT_HEADER] = source.tenant
    # The query API's own trust and identity (a private CA, a client certificate): a
    # client of its own, so the receivers never present that certificate or trust that CA.
    tls = source.tls
    own = tls != TlsSettings()
    if own:
        context = client_context(
            ca_file=tls.ca_file,
            cert_file=tls.cert_file,
            key_file=tls.key_file,
            insecure_skip_verify=tls.insecure_skip_verify,
            key="prometheus.tls",
        )
        client = httpx.AsyncClient(follow_redirects=False, verify=context)
    parts = FleetParts(
        source=source,
        window_seconds=settings.window_seconds,
        step_seconds=settings.interval_seconds,
        min_observations=settings.thresholds.min_observations,
        max_body_bytes=settings.max_body_bytes,
        hardware=hardware,
        new_target=new_target,
        api=api,
        headers=headers,
        # Prometheus' range must hold several of its own scrapes: a minute at least.
        stall_seconds=max(settings.thresholds.stall_after_seconds, 60.0),
    )
    return PrometheusSource(
        parts, client=client, notifier=notifier, clock=clock, store=store, own_client=own
    )


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

    Built in dependency order, as Alertmanager's ``New`` builds its parts: the state store,
    the listening socket (the notifier's links need its address), the notifier, the
    scrapers or the fleet, then the read side over what was built. Everything opened goes
    on one ``ExitStack``: a build that fails closes it (a bad ``config_json`` leaves no
    port taken and no file open), and the daemon closes it at shutdown.

    ``default_state_dir``: what ``state_dir: auto`` means here (``run`` passes the XDG
    state directory; an in-process daemon, as the demo's, keeps nothing)."""
    with contextlib.ExitStack() as opened:
        parts = _build_parts(settings, opened, clock=clock, default_state_dir=default_state_dir)
        # Built whole: from here the daemon owns what was opened.
        return Daemon(dataclasses.replace(parts, opened=opened.pop_all()), clock=clock)


def _build_parts(
    settings: Settings,
    opened: contextlib.ExitStack,
    *,
    clock: Callable[[], float],
    default_state_dir: Path | None,
) -> DaemonParts:
    check_record_room(settings)
    state_dir = settings.state_path(default_state_dir)
    store = StateStore.open(state_dir) if state_dir is not None else None
    if store is not None:
        opened.callback(store.close)
        _adopt_positional_names(settings, store)
    listener = bind(settings.listen)
    opened.callback(listener.close)
    address = listener.getsockname()[:2]
    # The receivers and the fleet's query API share one client. Each scraped target gets
    # a client of its own, with one kept-alive connection: in one shared pool every
    # request scans every idle connection, which made 500 targets cost a core
    # (bench/bench_daemon.py). The TLS context is built once and shared. A client opens
    # no connection before its first request, so a build that fails has none of theirs
    # to close; the daemon closes them at shutdown.
    tls = ssl.create_default_context()
    client = httpx.AsyncClient(follow_redirects=False, verify=tls)
    notifier = build_notifier(settings, client, external_url(settings, address), store)
    scrapers = [
        build_scraped(
            settings,
            t,
            client=httpx.AsyncClient(
                follow_redirects=False,
                verify=tls,
                limits=httpx.Limits(max_connections=2, max_keepalive_connections=1),
            ),
            notifier=notifier,
            store=store,
            clock=clock,
        )
        for t in settings.targets
    ]
    fleet: PrometheusSource | None = None
    if settings.source == "prometheus":
        fleet = build_fleet(settings, client=client, notifier=notifier, store=store, clock=clock)
    elif store is not None:
        _forget_gone_targets(settings, store, notifier, clock())
    if store is not None:
        # What writes itself afresh when a failing disk takes writes again.
        store.participants.extend(s.target for s in scrapers)
        store.participants.append(notifier)
        store.participants.extend(notifier.deliveries)
    ready = Readiness()
    read_side = _endpoints(
        settings,
        scrapers=scrapers,
        fleet=fleet,
        notifier=notifier,
        store=store,
        ready=ready,
        clock=clock,
    )
    http = HttpServer(listener, read_side)
    opened.callback(http.stop)
    return DaemonParts(
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


def _forget_gone_targets(
    settings: Settings, store: StateStore, notifier: Notifier, now: float
) -> None:
    """Targets no longer configured: nothing will evaluate them again. (In fleet mode
    servers are discovered as they appear, so theirs wait in the store.)"""
    with store.batch():
        for name in sorted(store.restored.incidents):
            log.warning("incidents_target_gone", target=name)
            store.save_incidents(name, ())
        store.restored.incidents.clear()
        notifier.resolve_gone({t.name for t in settings.targets}, now)


def _endpoints(
    settings: Settings,
    *,
    scrapers: list[Scraper],
    fleet: PrometheusSource | None,
    notifier: Notifier,
    store: StateStore | None,
    ready: Readiness,
    clock: Callable[[], float],
) -> Endpoints:
    """The read side, over the parts already built: it reads their published states."""

    def states() -> list[TargetState]:
        if fleet is not None:
            return fleet.states()
        return [s.target.state for s in scrapers]

    def deliveries() -> list[Delivery]:
        return notifier.deliveries

    def store_status() -> StoreStatus | None:
        return store.status() if store is not None else None

    rows, interval = settings_rows(settings), settings.interval_seconds
    return Endpoints(
        build_registry(states, deliveries, store=store_status, slo=slo_of(settings.slo)),
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
