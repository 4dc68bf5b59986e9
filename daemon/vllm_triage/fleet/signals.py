"""Fleet mode's answers (``daemon/vllm_triage/fleet/queries.py``) read back per server and model, as
the core's ``WindowTotals``: window increases, bucket deltas and gauge statistics, the
same totals a sidecar's window sums from its scrapes. ``core.signals.signals_from_totals``
then reads them as signals, so both paths compute quantiles, means, rates and the
"not enough data" cases in one place.

Prometheus' ``increase`` extrapolates to the window's edges, so counts and rates can be
up to one scrape interval's share of the window above a sidecar's (which divides by the
span its scrapes cover); quantiles and means are ratios of increases of series scraped
together, and agree.

A row that cannot be used (a value that is not a number, a histogram without its +Inf
bucket or its sum) is left out and said in the server's ``problems``, as the parser
does with a scrape.
"""

from __future__ import annotations

import math
import reprlib
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from vllm_triage.core.engines import balance_means
from vllm_triage.core.model import (
    REFERENCE,
    CacheConfig,
    GaugeStats,
    Histogram,
    Progress,
    Runtime,
    WindowTotals,
)
from vllm_triage.core.names import MAX_ENGINES, label_value
from vllm_triage.core.roofline.kvpool import (
    MAX_POOL_TOKENS,
    beyond_bounds,
    parse_cache_config,
    read_pool,
)
from vllm_triage.core.runtime import HISTOGRAM_FIELDS
from vllm_triage.fleet.queries import BUCKET_FIELDS, COUNTERS, DCGM_MODEL, POOL_LABELS
from vllm_triage.rules import runtime_table

RUNTIMES = runtime_table()

Row = Mapping[str, Any]

#: A value shown in a problem is this short (a peer may send a huge or deeply nested one).
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxstring, _SHOWN.maxother = 2, 3, 40, 40


#: The ``le`` values a tick remembers as numbers (``Fleet.bounds``): vLLM's histograms
#: use a few dozen between them.
MAX_BOUNDS = 256


def _shown(value: object) -> str:
    return _SHOWN.repr(value)


@dataclass(slots=True)
class _Model:
    """What the answers said about one model of one server."""

    values: dict[str, float] = field(default_factory=dict)
    #: Per histogram: its bucket rows' bounds and counts, in the order read: the bounds
    #: a list of the floats every server shares (``Fleet.bounds``), the counts an array
    #: of doubles, not a float object each (a tick holds every server's buckets at once:
    #: some 600,000 counts at 10,000 servers).
    buckets: dict[str, tuple[list[float], array[float]]] = field(default_factory=dict)
    engines: int = 0
    #: Per ``engine`` label: its progress rows (``engine_changes``, ``engine_outstanding``,
    #: ``engine_awake``) and its balance (``engine_waiting_mean``,
    #: ``engine_kv_usage_mean``), at most ``MAX_ENGINES`` engines.
    by_engine: dict[str, dict[str, float]] = field(default_factory=dict)
    #: The serving engine its series are (the ``runtime`` query's row); "" for vLLM's,
    #: which that query does not ask after in a fleet of vLLM alone.
    runtime: str = ""


@dataclass(slots=True)
class Server:
    """One server's rows: its labels (identity, join and rule labels), its models, its
    KV pool (per engine: block size, blocks) and what could not be used."""

    name: str
    labels: dict[str, str]
    #: The piece of the tick its rows came in (``fleet.pieces``); ``split`` when they came
    #: in two (a server whose series changed bucket inside the window).
    piece: int = -1
    split: bool = False
    #: The most series one of its engines has: above 1, its answers hold it twice.
    copies: int = 1
    models: dict[str, _Model] = field(default_factory=dict)
    pool: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Each engine's ``cache_config_info`` labels, as the parser reads them.
    cache: dict[str, CacheConfig] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def cache_config(self) -> CacheConfig | None:
        """One engine's KV pool settings (the first's, as the parser takes them)."""
        return self.cache[min(self.cache)] if self.cache else None

    def pool_tokens(self) -> int | None:
        """The KV pool in tokens, all engines together (``None``: not known); call once."""
        if not self.pool:
            return None
        sizes = {block for block, _ in self.pool.values()}
        blocks = sum(n for _, n in self.pool.values())
        if len(sizes) != 1 or blocks <= 0:
            self.problems.append("cache_config_info: engines disagree on block_size")
            return None
        return sizes.pop() * blocks


@dataclass(slots=True)
class Fleet:
    """Every server the answers name, keyed by target name (``name_of`` its labels)."""

    identity: tuple[str, ...]
    name_of: Callable[[Mapping[str, str]], str]
    servers: dict[str, Server] = field(default_factory=dict)
    dcgm_gpus: dict[tuple[str, ...], dict[str, int]] = field(default_factory=dict)
    dcgm_dram: dict[tuple[str, ...], float] = field(default_factory=dict)
    #: Rows read, and rows without a label set (not an instant query's shape).
    rows: int = 0
    unusable: int = 0
    #: Servers by the values of their identity labels (each name is built once).
    by_ident: dict[tuple[str | None, ...], Server] = field(default_factory=dict, repr=False)
    #: Each ``le`` label value read, as its number: every server's buckets share the few
    #: bounds a fleet uses (one float each, kept by every server's histogram), at most
    #: ``MAX_BOUNDS`` of them (past that, a peer's odd bounds are read each time).
    bounds: dict[str, float] = field(default_factory=dict, repr=False)

    def _identity_of(self, labels: Any) -> tuple[str | None, ...]:
        """A row's identity label values, None for a missing one."""
        return tuple(map(labels.get, self.identity))

    def _new_server(self, labels: Any, ident: tuple[str | None, ...], piece: int) -> Server | None:
        """The server a row's labels name, when its identity has not been met yet this
        tick; None when they are not a label set of strings (checked once per server and
        tick: its later rows are found by their identity in ``read``)."""
        if not _strings(labels):
            return None
        name = self.name_of(labels)
        server = self.servers.get(name)
        if server is None:
            own = {k: labels.get(k, "") for k in self.identity}
            server = self.servers[name] = Server(name, own, piece)
        self.by_ident[ident] = server
        if server.piece != piece:
            server.split = True
        return server

    def read(
        self, key: str, rows: Iterable[Row], dcgm_join: tuple[str, ...] = (), piece: int = -1
    ) -> None:
        """Take in the rows (``data.result``) of the instant query for ``key``, asked in
        ``piece`` (``fleet.pieces``).

        The hot loop of a tick (rows = servers x signals, a million at 10,000 servers):
        the kind of row is decided once per query, not per row, and a row's labels are
        checked where they are read (a proxy or middleware can send anything: a row whose
        labels are not strings is unusable, counted, never an error that stops the tick).
        ``_parts`` and ``_finite`` are written out inline for the common row
        (a known server, a finite value): a third of the loop's time was their calls."""
        if key.startswith("dcgm_"):
            self._read_dcgm(key, rows, dcgm_join)
            return
        bucket = key.removesuffix("_bucket") if key.endswith("_bucket") else None
        engine_key = key.startswith("engine_")
        # Rows whose every label is kept (the pool's settings, the rules' labels).
        kept = key in ("pool", "engines")
        bounds, by_ident = self.bounds, self.by_ident
        # The identity's values as one C call while every row has all of them (the
        # common fleet), ``_identity_of`` from the first row that misses one.
        pick = itemgetter(*self.identity) if len(self.identity) > 1 else self._identity_of
        isfinite = math.isfinite
        count = 0
        metric: Any  # a peer's labels and value: anything at all until checked
        raw: Any
        for row in rows:
            count += 1
            try:
                metric, raw = row["metric"], row["value"]
            except (TypeError, KeyError, IndexError):
                metric = raw = None
            try:
                try:
                    ident = pick(metric)
                except KeyError:  # an identity label missing: None in its place
                    pick = self._identity_of
                    ident = pick(metric)
                server = by_ident.get(ident)
            except (AttributeError, TypeError):  # not a dict, or a label value unhashable
                self.unusable += 1
                continue
            if server is None:
                server = self._new_server(metric, ident, piece)
                if server is None:
                    self.unusable += 1
                    continue
            elif server.piece != piece:
                server.split = True
            try:
                value = float(raw[1])
            except (IndexError, TypeError, ValueError, KeyError):
                value = math.nan
            if not isfinite(value):
                server.problems.append(f"{key}: not a finite number ({_shown(raw)})")
                continue
            if kept:
                if not _strings(metric):
                    self.unusable += 1
                    continue
                if key == "pool":
                    self._pool(server, metric)
                    continue
            if key == "copies":
                server.copies = max(server.copies, int(value))
                continue
            name = metric.get("model_name", "")
            model = server.models.get(name)
            if model is None:
                if type(name) is not str:
                    self.unusable += 1
                    continue
                model = server.models[name] = _Model()
            if bucket is not None:
                try:
                    raw_le = metric["le"]
                    le = bounds.get(raw_le) if type(raw_le) is str else None
                    if le is None:
                        le = self._bound(raw_le)
                except (KeyError, ValueError, TypeError):
                    server.problems.append(f"{key}: a bucket without a numeric le; left out")
                    continue
                found = model.buckets.get(bucket)
                if found is None:
                    found = model.buckets[bucket] = ([], array("d"))
                found[0].append(le)
                found[1].append(value)
            elif engine_key:
                engine = metric.get("engine", "")
                if type(engine) is not str:
                    self.unusable += 1
                    continue
                found_engine = model.by_engine.get(engine)
                if found_engine is None and len(model.by_engine) < MAX_ENGINES:
                    found_engine = model.by_engine[engine] = {}
                if found_engine is not None:
                    found_engine[key] = value
            elif key == "runtime":
                model.runtime = metric.get("runtime", "")
            elif key == "engines":
                model.engines += int(value)
                for k, v in metric.items():
                    if k != "model_name":
                        server.labels.setdefault(k, v)
            else:
                model.values[key] = value
        self.rows += count

    def _bound(self, raw: Any) -> float:
        """An ``le`` label value not read yet this tick as a number (``float``'s errors
        for what is not one), remembered while there is room."""
        le = float(raw)
        if type(raw) is str and len(self.bounds) < MAX_BOUNDS:
            self.bounds[raw] = le
        return le

    def _read_dcgm(self, key: str, rows: Iterable[Row], join: tuple[str, ...]) -> None:
        for row in rows:
            self.rows += 1
            metric, raw = _parts(row)
            if not _strings(metric):
                self.unusable += 1
                continue
            self._dcgm(key, metric, _finite(raw), join)

    def _pool(self, server: Server, metric: Mapping[str, str]) -> None:
        engine = metric.get(POOL_LABELS[0], "")
        # A number no card could hold is a peer's, not a pool: unknown, and said.
        beyond = beyond_bounds(metric)
        if beyond is not None:
            server.problems.append(beyond)
        # vLLM says "None" before it has profiled the pool: not known yet, not a fault.
        size = read_pool(metric)
        if size is not None:
            server.pool[engine] = size
            server.cache[engine] = parse_cache_config(metric)

    def _dcgm(
        self, key: str, metric: Mapping[str, str], value: float | None, join: tuple[str, ...]
    ) -> None:
        pod = tuple(metric.get(k, "") for k in join)
        if value is None or not any(pod):
            return  # a GPU no pod uses, or a broken value: nothing to join
        if key == "dcgm_gpus":
            cards = self.dcgm_gpus.setdefault(pod, {})
            # A card's name is a peer's string: cut to the exported label bound, so a
            # 1 MB name costs 128 characters in the evidence, the API and the caches.
            card = label_value(metric.get(DCGM_MODEL, ""))
            cards[card] = cards.get(card, 0) + int(value)
        elif key == "dcgm_dram":
            self.dcgm_dram[pod] = value


def _parts(row: Any) -> tuple[Any, Any]:
    """A row's labels and value as a peer sent them: anything at all until checked
    (None, None for what is not a row)."""
    try:
        return row["metric"], row["value"]
    except (TypeError, KeyError, IndexError):
        return None, None


def _strings(labels: Any) -> bool:
    """Whether ``labels`` is a label set: a dict of strings to strings."""
    return isinstance(labels, dict) and all(
        type(k) is str and type(v) is str for k, v in labels.items()
    )


def _finite(raw: Any) -> float | None:
    """An instant vector's ``[time, "value"]`` as a finite number, or None."""
    try:
        value = float(raw[1])
    except (IndexError, TypeError, ValueError, KeyError):
        return None
    return value if math.isfinite(value) else None


class _Field(NamedTuple):
    """A histogram the queries read: its name, its sum's and count's keys, and whether
    its buckets are asked (made once, not a string a server and tick)."""

    name: str
    sum_key: str
    count_key: str
    buckets: bool


_HISTOGRAMS = tuple(
    _Field(name, f"{name}_sum", f"{name}_count", name in BUCKET_FIELDS) for name in HISTOGRAM_FIELDS
)


def _histogram(h: _Field, m: _Model, problems: list[str]) -> Histogram | None:
    name, buckets = h.name, h.buckets
    total, count = m.values.get(h.sum_key), m.values.get(h.count_key)
    if (total is not None and total < 0) or (count is not None and count < 0):
        # Durations and token counts only grow: a negative increase is a peer's series
        # gone wrong (the parser refuses the same), never a mean below zero.
        problems.append(f"{name}: a negative _sum or _count; left out")
        return None
    if not buckets:
        if total is None or count is None:
            return None
        return Histogram(bounds=(math.inf,), cumulative=(count,), count=count, sum=total)
    found = m.buckets.get(name)
    if found is None:
        return None
    rows = sorted(zip(*found, strict=True))
    if not math.isinf(rows[-1][0]):
        problems.append(f"{name}: no +Inf bucket; left out")
        return None
    if total is None or count is None:
        problems.append(f"{name}: no _sum or _count; left out")
        return None
    return Histogram(
        bounds=tuple(b for b, _ in rows),
        cumulative=tuple(c for _, c in rows),
        count=count,
        sum=total,
    )


def totals(
    server: Server,
    model_name: str,
    at: float,
    window_seconds: float,
    *,
    pool_tokens: int | None = None,
    kv_cache: CacheConfig | None = None,
    dram_active: float | None = None,
    stall_seconds: float = 60.0,
) -> WindowTotals:
    """One model's window as the core's ``WindowTotals``."""
    m = server.models[model_name]
    v = m.values
    spec = RUNTIMES.get(m.runtime) if m.runtime else None
    runtime = spec.runtime if spec is not None else REFERENCE
    snapshots = int(v.get("snapshots", 0))
    hists: dict[str, Histogram] = {}
    for field_ in _HISTOGRAMS:
        h = _histogram(field_, m, server.problems)
        if h is not None:
            hists[field_.name] = h
    return WindowTotals(
        model_name=model_name,
        at=at,
        # Prometheus' increase covers the whole window once there are two samples in it.
        span_seconds=window_seconds if snapshots >= 2 else 0.0,
        snapshots=snapshots,
        counters={c: v[c] for c in COUNTERS if c in v},
        histograms=hists,
        running=GaugeStats(v.get("running_mean"), v.get("running_max"), None),
        waiting=GaugeStats(
            v.get("waiting_mean"),
            v.get("waiting_max"),
            v.get("waiting_min"),
            v.get("waiting_first"),
            v.get("waiting_last"),
        ),
        kv_usage=GaugeStats(v.get("kv_usage_mean"), v.get("kv_usage_max"), None),
        running_busy_mean=v.get("running_busy_mean"),
        kv_usage_busy_mean=v.get("kv_usage_busy_mean"),
        engines=max(1, m.engines),
        engine_waiting_mean=_engine_means(m, "engine_waiting_mean"),
        engine_kv_usage_mean=_engine_means(m, "engine_kv_usage_mean"),
        kv_pool_tokens=pool_tokens if pool_tokens is not None else _gauge_pool(v),
        kv_cache=kv_cache,
        dram_active_mean=dram_active,
        progress=_progress(m, at, stall_seconds, runtime),
        progress_missing="not exposed: no token, step or scheduler series per engine",
        runtime=runtime,
        step_seconds=GaugeStats(v.get("step_seconds_busy_mean"), None, None),
        tokens_per_step=GaugeStats(v.get("tokens_per_step_busy_mean"), None, None),
    )


def _gauge_pool(v: Mapping[str, float]) -> int | None:
    """The KV pool in tokens from an engine's gauges (SGLang's tokens, TensorRT-LLM's
    blocks x tokens per block), held to what a card could hold, as the parser does."""
    tokens = v.get("pool_tokens")
    if tokens is None and v.get("pool_blocks") is not None:
        tokens = v["pool_blocks"] * (v.get("pool_block_size") or 1.0)
    if tokens is None or not 1 <= tokens <= MAX_POOL_TOKENS:
        return None
    return round(tokens)


def _engine_means(m: _Model, key: str) -> dict[str, float]:
    """Each engine's window mean (``key``), when two engines or more have one, as the
    sidecar's window gives them (one engine's is the merged value)."""
    return balance_means({e: v[key] for e, v in m.by_engine.items() if key in v})


def _checked(runtime: Runtime) -> tuple[str, ...]:
    """What the progress query read for this engine (``queries._progress``)."""
    if runtime is REFERENCE or runtime.name == "vllm":
        return ("generation_tokens", "prompt_tokens", "running", "waiting", "kv_usage")
    return tuple(
        dict.fromkeys([*sorted(runtime.moves_with_steps), "running", "waiting", "kv_usage"])
    )


def _progress(m: _Model, at: float, stall_seconds: float, runtime: Runtime) -> Progress | None:
    """Each engine stalled or not, from Prometheus' own range (``QueryPlan.stall_seconds``):
    work outstanding throughout it and not one change of its step-driven series. The
    seconds without progress are then at least that range (Prometheus cannot say when the
    last change was), which is past ``stall_after_seconds``."""
    rows = {e: v for e, v in m.by_engine.items() if "engine_changes" in v}
    if not rows:
        return None
    without = {
        e: stall_seconds
        if v["engine_changes"] == 0 and v.get("engine_outstanding", 0.0) > 0
        else 0.0
        for e, v in sorted(rows.items())
    }
    worst = max(without, key=lambda e: (without[e], e))
    asleep = {e: "asleep" for e, v in m.by_engine.items() if v.get("engine_awake") == 0.0}
    return Progress(
        last_progress_at=at - without[worst],
        seconds_without_progress=without[worst],
        running=rows[worst].get("engine_outstanding"),
        checked=_checked(runtime),
        engines_without=without if len(without) > 1 else {},
        asleep=asleep,
    )
