"""A query API on 127.0.0.1 for fleet mode's fast tests (tests/runtime/fleet/):
it answers each of the fleet's own instant queries with the rows Prometheus would give,
from simulator recordings windowed as the sidecar's own window does, so the plumbing
(rows -> totals -> signals -> diagnosis) is held to the sidecar exactly; the PromQL
itself runs against a real Prometheus and VictoriaMetrics in
tests/system/test_integration.py.

It answers as the backends fleet mode reads do, in their documented shapes (neither
Thanos nor Mimir is packaged here):

- ``kind``: what ``/api/v1/status/buildinfo`` says (Prometheus' version, VictoriaMetrics'
  empty ``data``, Mimir's ``application``, Thanos' version);
- Mimir: every request without ``X-Scope-OrgID`` is answered 401 ``no org id``;
- Thanos: an HA pair (``ha_pair``) comes back twice (its sums doubled, two series per
  engine) unless the request says ``dedup=true`` with the pair's ``replicaLabels[]``;
  a failed store (``store_down``) makes answers partial (``warnings``, half the servers'
  rows missing), or an error when the request says ``partial_response=false``;
- VictoriaMetrics' cluster: a storage node down (``node_down``) makes answers partial
  (``"isPartial": true``), or an error with ``deny_partial_response=1``;
- server-side sharding: servers may carry a shard bucket (``buckets``); the label values
  API lists them, and a query's shard matcher selects the servers it answers for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from vllm_triage.assemble import build_fleet, build_notifier
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.core.model import KVPool, Signals, Snapshot, WindowTotals
from vllm_triage.core.totals import Window
from vllm_triage.fleet.queries import NAMES
from vllm_triage.fleet.source import PrometheusSource
from vllm_triage.simulator import get_scenario, record
from vllm_triage.store import StateStore

from support.localserver import Exchange, serving
from support.parsing import SAMPLES, parse_snapshot

STEP = 5.0
WINDOW = 60.0
NOW = 1_767_226_200.0  # a multiple of STEP: the fleet's evaluation grid lands here
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SHARD_LABEL = "vllm_triage_shard"
#: A Thanos store API failing, as its querier words the warning.
STORE_WARNING = (
    'receive series from Addr: 10.0.0.7:10901 LabelSets: {cluster="b"}: context deadline exceeded'
)
#: Keys whose rows Thanos sums over both copies of an HA pair's series.
DOUBLED = re.compile(
    r"_bucket$|_sum$|_count$|^(prompt_tokens|generation_tokens|preemptions|spec_.*)$"
    r"|^(running|waiting)_(mean|max|min|first|last)$|^engines$|^engine_waiting_mean$"
)
_PIECE = re.compile(rf'(?:, )?{SHARD_LABEL}=(~?)"([^"]*)"')


@functools.cache
def scrapes(scenario: str) -> tuple[tuple[float, str], ...]:
    """The scenario scraped every STEP seconds up to NOW."""
    return tuple(
        record(get_scenario(scenario), start_at=NOW - 400, interval_s=STEP, duration_s=400)
    )


@functools.cache
def recorded(scenario: str) -> tuple[Snapshot, ...]:
    return tuple(parse_snapshot(body, at) for at, body in scrapes(scenario))


@functools.cache
def exposed(scenario: str) -> frozenset[str]:
    """The names the parser reads that the scenario's scrapes show."""
    _, body = scrapes(scenario)[-1]
    return frozenset(line.split("{")[0].split(" ")[0] for line in body.splitlines()) & set(SAMPLES)


def window_at(scenario: str, at: float) -> Window:
    """The sidecar's window over the recording at ``at``."""
    w = Window(WINDOW, min_observations=load_settings().thresholds.min_observations)
    for snap in recorded(scenario):
        if at - WINDOW - STEP < snap.at <= at:
            w.push(snap)
    return w


def without_progress(s: Signals) -> Signals:
    """The sidecar's signals as fleet mode has them when the query API answers no progress
    rows (this fake answers none; they are tested apart)."""
    missing = dict(s.missing)
    missing["progress"] = "not exposed: no token, step or scheduler series per engine"
    return dataclasses.replace(s, progress=None, missing=missing)


@functools.cache
def totals_at(scenario: str, at: float) -> tuple[tuple[WindowTotals, ...], KVPool | None]:
    """Each model's totals of the sidecar's window at ``at``, and its KV pool."""
    w = window_at(scenario, at)
    if not len(w) or w.newest is None:
        return (), None
    return tuple(w.totals(m) for m in w.models()), w.newest.kv_pool


def _row(labels: dict[str, str], key: str, at: float, value: float) -> dict[str, Any]:
    """A row of the query for ``key`` (kept beside the row, for the fake to pick by)."""
    return {"metric": dict(labels), "value": [at, repr(value)], "key": key}


def model_rows(keys: set[str], labels: dict[str, str], t: WindowTotals) -> list[dict[str, Any]]:
    """The rows Prometheus would give for one server's model, from the sidecar's totals."""
    at, out = t.at, []
    lab = {**labels, "model_name": t.model_name}
    for name, h in t.histograms.items():
        if f"{name}_bucket" in keys:
            for le, c in zip(h.bounds, h.cumulative, strict=True):
                le_text = "+Inf" if math.isinf(le) else repr(le)
                out.append(_row({**lab, "le": le_text}, f"{name}_bucket", at, c))
        for part, value in (("sum", h.sum), ("count", h.count)):
            if f"{name}_{part}" in keys:
                out.append(_row(lab, f"{name}_{part}", at, value))
    for name, value in t.counters.items():
        if name in keys:
            out.append(_row(lab, name, at, value))
    gauges = {
        "running_mean": t.running.mean,
        "running_max": t.running.max,
        "waiting_mean": t.waiting.mean,
        "waiting_max": t.waiting.max,
        "waiting_min": t.waiting.min,
        "waiting_first": t.waiting.first,
        "waiting_last": t.waiting.last,
        "kv_usage_mean": t.kv_usage.mean,
        "kv_usage_max": t.kv_usage.max,
        "running_busy_mean": t.running_busy_mean,
        "kv_usage_busy_mean": t.kv_usage_busy_mean,
        "snapshots": float(t.snapshots),
        "engines": float(t.engines),
    }
    for key, value in gauges.items():
        if key in keys and value is not None:
            out.append(_row(lab, key, at, value))
    # Each data-parallel engine's balance, one row per engine label.
    for key, means in (
        ("engine_waiting_mean", t.engine_waiting_mean),
        ("engine_kv_usage_mean", t.engine_kv_usage_mean),
    ):
        if key in keys:
            out += [_row({**lab, "engine": e}, key, at, v) for e, v in means.items()]
    return out


def piece_of(query: str) -> tuple[str, set[str] | None]:
    """A query without its shard matcher, and the bucket values that matcher selects
    (``{""}``: the series without the label; None: no matcher, every series)."""
    found = _PIECE.search(query)
    if found is None:
        return query, None
    regex, values = found.group(1), found.group(2)
    chosen = set(values.split("|")) if regex else {values}
    return _PIECE.sub("", query).replace("{}", ""), chosen


@dataclass
class Fake:
    """What the query API knows: servers ({instance: scenario}), their extra labels and
    DCGM cards ({instance: (card, gpus, dram activity)}), their shard buckets, and how
    it answers (the module says)."""

    servers: dict[str, str] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    dcgm: dict[str, tuple[str, int, float]] = field(default_factory=dict)
    #: {instance: its shard bucket}; a server without one has no shard label.
    buckets: dict[str, int] = field(default_factory=dict)
    seen: list[dict[str, str]] = field(default_factory=list)
    #: Every request's headers, in order; every query answer's (time, bytes).
    headers: list[dict[str, str]] = field(default_factory=list)
    sizes: list[tuple[float, int]] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)
    names_api: bool = True
    #: A names call whose match names more names than this is refused (422), as
    #: VictoriaMetrics refuses one that touches more series than its
    #: ``-search.maxUniqueTimeseries``; one within it answers only the names it matches.
    names_limit: int | None = None
    #: Seconds a names call waits before its answer (a backend that hangs).
    names_delay: float = 0.0
    status: int = 200
    raw: bytes | None = None
    #: Per-engine rows answered for every server's model instead of the window's:
    #: {key: {engine: value}}.
    engine_rows: dict[str, dict[str, float]] = field(default_factory=dict)
    kind: str = "prometheus"
    ha_pair: bool = False
    store_down: bool = False
    node_down: bool = False
    #: With ``store_down`` or ``node_down``: the buckets whose answers are partial (None:
    #: every answer).
    failing_buckets: set[int] | None = None
    source: PrometheusSource | None = None

    def names(self, unlabelled_only: bool = False) -> frozenset[str]:
        chosen = [s for i, s in self.servers.items() if not (unlabelled_only and i in self.buckets)]
        return frozenset().union(*(exposed(s) for s in chosen))

    def learn(self, source: PrometheusSource) -> None:
        self.source = source
        self._relearn()

    def _relearn(self) -> None:
        if self.source is None:
            return
        plan = self.source.plan
        # Every set of names the source may have learnt: none, the fleet's, and every
        # naming of the engines it runs (a names call refused over too many series).
        engines = {e.runtime.name for e in NAMES if e.name in self.names()}
        every = frozenset(e.name for e in NAMES if e.runtime.name in engines)
        for present in (None, self.names(), every):
            self.keys.update({q.promql: q.key for q in plan.queries(present)})

    def key_of(self, query: str) -> tuple[str, set[str] | None]:
        bare, chosen = piece_of(query)
        if bare not in self.keys:
            self._relearn()  # the plan changed (a backend told by its build info)
        return self.keys[bare], chosen

    def in_piece(self, instance: str, chosen: set[str] | None) -> bool:
        if chosen is None:
            return True
        bucket = self.buckets.get(instance)
        return (str(bucket) if bucket is not None else "") in chosen

    def failing(self, chosen: set[str] | None) -> bool:
        if not (self.store_down or self.node_down):
            return False
        if self.failing_buckets is None or chosen is None:
            return True
        return bool({str(b) for b in self.failing_buckets} & chosen)

    def answer(self, query: str, at: float, *, dedup: bool = True) -> list[dict[str, Any]]:
        key, chosen = self.key_of(query)
        copies = 2 if self.ha_pair and not dedup else 1
        failing = self.failing(chosen)
        rows: list[dict[str, Any]] = []
        for n, (instance, scenario) in enumerate(self.servers.items()):
            if not self.in_piece(instance, chosen):
                continue
            if failing and n % 2 == 1:
                continue  # this server's series are in the store that did not answer
            labels = {"job": "vllm", "instance": instance}
            models, pool = totals_at(scenario, at)
            if not models:
                continue
            extra = dict(self.labels.get(instance, {}))
            if instance in self.buckets:
                extra[SHARD_LABEL] = str(self.buckets[instance])
            for t in models:
                if key == "copies":
                    rows.append(_row({**labels, "model_name": t.model_name}, key, at, copies))
                    continue
                if key in self.engine_rows:
                    lab = {**labels, "model_name": t.model_name}
                    rows += [
                        _row({**lab, "engine": e}, key, at, v)
                        for e, v in self.engine_rows[key].items()
                    ]
                    continue
                for row in model_rows({key}, labels, t):
                    if key == "engines":
                        row["metric"].update(extra)
                    if copies > 1 and DOUBLED.search(key):
                        row["value"] = [at, repr(float(row["value"][1]) * copies)]
                    rows.append(row)
            if key == "pool" and pool is not None:
                sizes = {"engine": "0", "block_size": str(pool.block_size)}
                sizes["num_gpu_blocks"] = str(pool.num_gpu_blocks)
                if pool.config is not None:  # the labels that size KV bytes per token
                    cfg = pool.config
                    sizes["kv_cache_size_tokens"] = str(cfg.kv_cache_size_tokens)
                    sizes["kv_cache_memory_bytes"] = str(cfg.kv_cache_memory_bytes)
                    sizes["gpu_memory_utilization"] = str(cfg.gpu_memory_utilization)
                    sizes["cache_dtype"] = cfg.cache_dtype
                rows.append(_row({**labels, **sizes}, "pool", at, 1.0))
            if instance in self.dcgm and extra:
                card, gpus, dram = self.dcgm[instance]
                pod = {"namespace": extra["namespace"], "pod": extra["pod"]}
                if key == "dcgm_gpus":
                    rows.append(_row({**pod, "modelName": card}, key, at, float(gpus)))
                if key == "dcgm_dram":
                    rows.append(_row(pod, key, at, dram))
        return rows

    def build_info(self) -> dict[str, Any]:
        if self.kind == "victoriametrics":
            return {}
        if self.kind == "mimir":
            return {"application": "Grafana Mimir", "version": "2.14.0", "revision": "a1b2"}
        if self.kind == "thanos":
            return {"version": "0.36.1", "revision": "c3d4", "branch": "HEAD"}
        return {"version": "2.42.0", "revision": "e5f6", "branch": "debian/sid"}

    def label_values(self, path: str, query: dict[str, list[str]]) -> bytes | None:
        """The label values API: the names the fleet exposes, or its shard buckets."""
        match = query.get("match[]", [""])[0]
        if path.startswith("/api/v1/label/__name__/values"):
            if not self.names_api:
                return None
            bare = f'{SHARD_LABEL}=""' in match
            found = self.names(bare)
            if self.names_limit is not None:
                found = found & set(matched_names(match))
            return json.dumps({"status": "success", "data": sorted(found)}).encode()
        if path.startswith(f"/api/v1/label/{SHARD_LABEL}/values"):
            values = sorted({str(b) for b in self.buckets.values()})
            return json.dumps({"status": "success", "data": values}).encode()
        return None


def matched_names(match: str) -> list[str]:
    """The names a names call's ``__name__=~"a|b"`` matcher names (regex escapes undone)."""
    found = re.search(r'__name__=~"([^"]*)"', match)
    return [re.sub(r"\\(.)", r"\1", n) for n in found.group(1).split("|")] if found else []


def _refusal(fake: Fake, x: Exchange, form: dict[str, list[str]]) -> tuple[int, bytes] | None:
    """What a backend says before answering: Mimir's missing tenant, a refused partial,
    a names call over too many series."""
    names_call = x.request.path.startswith("/api/v1/label/__name__/")
    asked = len(matched_names(form.get("match[]", [""])[0])) if names_call else 0
    if fake.names_limit is not None and asked > fake.names_limit:
        error = {
            "status": "error",
            "errorType": "422",
            "error": "the number of matching timeseries exceeds 300000; "
            "either narrow down the search or increase -search.maxUniqueTimeseries",
        }
        return 422, json.dumps(error).encode()
    if fake.kind == "mimir" and not x.request.header("X-Scope-OrgID"):
        return 401, b"no org id\n"
    if fake.store_down and form.get("partial_response") == ["false"]:
        error = {"status": "error", "errorType": "execution", "error": STORE_WARNING}
        return 422, json.dumps(error).encode()
    if fake.node_down and form.get("deny_partial_response") == ["1"]:
        error = {
            "status": "error",
            "errorType": "503",
            "error": "cannot fetch query results from vmstorage nodes: partial response denied",
        }
        return 503, json.dumps(error).encode()
    return None


@contextmanager
def query_api(fake: Fake, **serving_options: Any) -> Iterator[str]:
    def handle(x: Exchange) -> None:
        fake.headers.append(dict(x.request.headers))
        url = urlsplit(x.request.path)
        if x.request.method == "GET":
            query = parse_qs(url.query)
            fake.seen.append({"names": x.request.path})
            refused = _refusal(fake, x, query)
            if refused is not None:
                x.reply(refused[0], refused[1], content_type="application/json")
                return
            if url.path == "/api/v1/status/buildinfo":
                doc = {"status": "success", "data": fake.build_info()}
                x.reply(200, json.dumps(doc).encode(), content_type="application/json")
                return
            if fake.names_delay and url.path.startswith("/api/v1/label/__name__/"):
                time.sleep(fake.names_delay)
            body = fake.label_values(url.path, query)
            x.reply(200 if body else 404, body or b"404 page not found")
            return
        form = parse_qs(x.request.body.decode())
        fake.seen.append({k: v[0] for k, v in form.items()})
        refused = _refusal(fake, x, form)
        if refused is not None:
            x.reply(refused[0], refused[1], content_type="application/json")
            return
        if fake.raw is not None or fake.status != 200:
            body = fake.raw or b'{"status":"error","error":"boom"}'
            x.reply(fake.status, body, content_type="application/json")
            return
        dedup = form.get("dedup") == ["true"] and "replica" in form.get("replicaLabels[]", [])
        query = form["query"][0]
        result = fake.answer(query, float(form["time"][0]), dedup=dedup)
        data = {"resultType": "vector", "result": result}
        doc: dict[str, Any] = {"status": "success", "data": data}
        if fake.failing(piece_of(query)[1]):
            if fake.store_down:
                doc["warnings"] = [STORE_WARNING]
            else:
                doc["isPartial"] = True
        body = json.dumps(doc).encode()
        fake.sizes.append((float(form["time"][0]), len(body)))
        x.reply(200, body, content_type="application/json")

    with serving(handle, **serving_options) as server:
        yield server.url()


def fleet_settings(url: str, **extra: Any) -> Settings:
    top = extra.pop("top", {})
    prom = {"url": url, "selector": '{job="vllm"}', "timeout_seconds": 30, **extra}
    return load_settings(
        flags={
            "source": "prometheus",
            "interval_seconds": STEP,
            "window_seconds": WINDOW,
            "prometheus": prom,
            **top,
        }
    )


def warm(fake: Fake, times: list[float]) -> list[float]:
    """Simulate the fake's windows before the ticks ask (a busy machine takes seconds)."""
    for scenario in set(fake.servers.values()):
        for at in times:
            totals_at(scenario, at - at % STEP)
    return times


def run_ticks(
    settings: Settings,
    times: list[float],
    *,
    fake: Fake | None = None,
    store: StateStore | None = None,
    between: Any = None,
) -> PrometheusSource:
    """Fleet mode over ``times``, a tick each; ``between(source, i)`` after tick ``i``."""
    now = [times[0]]

    async def go() -> PrometheusSource:
        async with httpx.AsyncClient() as client:
            notifier = build_notifier(settings, client, "http://x", store) if store else None
            source = build_fleet(
                settings, client=client, notifier=notifier, clock=lambda: now[0], store=store
            )
            if fake is not None:
                fake.learn(source)
            for i, at in enumerate(times):
                now[0] = at
                await source.tick()
                if between is not None:
                    between(source, i)
            await source.close()
        return source

    return asyncio.run(go())
