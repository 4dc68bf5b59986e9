"""Fleet mode: every vLLM server a Prometheus-compatible query API knows, diagnosed by the
same core as a scraped one, with Prometheus doing the windowing.

Each tick (one per ``interval_seconds``, at a time on that step's grid) sends a few
instant queries (``daemon/vllm_triage/fleet/queries.py``): bucket, counter and sum increases over
``window_seconds``, gauge statistics, the KV pool, and DCGM's cards. The rows are
grouped by ``identity_labels`` (default ``job`` and ``instance``): each group is one
server, discovered the first time it appears and kept as a target with its own
incidents. Its rows become the core's window totals and signals
(``daemon/vllm_triage/fleet/signals.py``), its card and model are resolved
(``daemon/vllm_triage/fleet/hardware.py``), and ``Evaluator.judge`` runs the same diagnosis and
incident tracking as a scrape: same exports, same webhooks, same state store. The cost
of a tick grows with servers, not with buckets x steps.

Replicas: ``prometheus.shard`` gives this one the servers whose stable hash of their name
(BLAKE2b, never Python's salted ``hash``) modulo ``count`` is ``index``, so replicas with
the indexes 0 .. count-1 diagnose every server exactly once.

The query API itself is a target too (named ``prometheus``), so ``vllm_triage_target_up``
and ``vllm_triage_scrape_failures_total`` say when it cannot be read.

Its answer is read as a target's body is (``vllm_triage.net.fetch.BodyLimit``): at most
``max_body_bytes`` once decoded, with one layer of gzip accepted and inflated inside that
limit (a query's JSON shrinks about tenfold, and the query API is often across a
network), redirects not followed (its credentials stay with its URL), the whole request
bounded by ``timeout_seconds``; the JSON is decoded on a worker thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog

from vllm_triage.config.schema import TENANT_HEADER, PrometheusSourceSettings
from vllm_triage.core.names import label_value
from vllm_triage.core.signals import signals_from_totals
from vllm_triage.errors import ScrapeError
from vllm_triage.fleet.answers import Reading, label_values, query_answer
from vllm_triage.fleet.backend import BUILDINFO, Backend, backend, detect
from vllm_triage.fleet.completeness import REASONS, SeriesDrop
from vllm_triage.fleet.cycles import paused, settle
from vllm_triage.fleet.hardware import Card, HardwareResolver
from vllm_triage.fleet.pieces import PIECE_SERVERS, UNLABELLED, Piece, owned, plan, unlabelled
from vllm_triage.fleet.queries import (
    NAMES,
    NAMES_REGEX,
    FleetQuery,
    QueryPlan,
    entries,
    inner,
    names,
)
from vllm_triage.fleet.signals import Fleet, Server, totals
from vllm_triage.logs import Chorus, Throttle
from vllm_triage.net.bounded import request
from vllm_triage.net.redact import quoted, safe_url
from vllm_triage.notify.notifier import Notifier
from vllm_triage.state import TargetState
from vllm_triage.store import StateStore
from vllm_triage.target import Health, Target

log = structlog.get_logger("vllm_triage.fleet")

_NAME_OK = re.compile(r"[^A-Za-z0-9_.:/@-]+")
#: Queries of one tick in flight at once (Prometheus runs 20 at a time by default,
#: ``--query.max-concurrency``, for every user together).
CONCURRENT_QUERIES = 6
#: How much of a refusal's body is kept for its message (a query API says why there).
ERROR_BYTES = 1024


def _form(pairs: Sequence[tuple[str, str]]) -> dict[str, str | list[str]]:
    """Form fields as httpx takes them: a name given twice (``replicaLabels[]``) a list."""
    out: dict[str, str | list[str]] = {}
    for key, value in pairs:
        held = out.get(key)
        if held is None:
            out[key] = value
        else:
            out[key] = [*([held] if isinstance(held, str) else held), value]
    return out


def target_name(labels: Mapping[str, str], identity: Iterable[str]) -> str:
    """``job/instance`` (or the configured identity labels), usable as a label value."""
    parts = [labels.get(k, "") for k in identity]
    name = "/".join(p for p in parts if p) or "unlabelled"
    name = _NAME_OK.sub("_", name)
    return label_value(name if name[0].isalnum() else "t" + name)


def shard_of(name: str, count: int) -> int:
    """The shard a server belongs to: the same on every replica, in every process."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


@dataclass(frozen=True, slots=True)
class FleetParts:
    """What the assembly builds for fleet mode, besides the targets it makes."""

    source: PrometheusSourceSettings
    window_seconds: float
    step_seconds: float
    min_observations: int
    max_body_bytes: int
    hardware: HardwareResolver
    #: Builds a discovered server's bare ``Target`` (the same assembly function that
    #: builds a configured target's), from its name and its identity labels, its
    #: condition lines going where the third argument says.
    new_target: Callable[[str, Mapping[str, str], Chorus], Target]
    #: The query API's own health, reported like a target's (named ``prometheus``).
    api: Health
    #: Every query's headers: JSON, one layer of gzip, the API's credentials and tenant.
    headers: Mapping[str, str]
    #: The range over which an engine must show no change to be stalled (``QueryPlan``).
    stall_seconds: float = 60.0


@dataclass(slots=True)
class _Tick:
    """What one tick read besides the rows: which pieces' answers may miss data."""

    #: Piece index -> why its answers may be missing data; ``everything``: an index
    #: call's answer was partial, so any server may be missing.
    partial: dict[int, str] = field(default_factory=dict)
    everything: str | None = None
    answers: int = 0
    partial_answers: int = 0
    #: The largest answer's bytes, and the servers of its piece.
    largest: tuple[int, int] = (0, 0)
    notes: set[str] = field(default_factory=set)

    def took(self, piece: Piece, reading: Reading) -> None:
        self.answers += 1
        if reading.partial is not None:
            self.partial_answers += 1
            self.partial.setdefault(piece.index, reading.partial)
        self.notes.update(n[:200] for n in reading.notes[:3])


class PrometheusSource:
    """The fleet's one scheduled job: query, split by server, judge each server."""

    def __init__(
        self,
        parts: FleetParts,
        *,
        client: httpx.AsyncClient,
        notifier: Notifier | None,
        clock: Callable[[], float] = time.time,
        store: StateStore | None = None,
        own_client: bool = False,
    ) -> None:
        self.parts = parts
        self.source: PrometheusSourceSettings = parts.source
        self.targets: dict[str, Target] = {}
        self.in_flight = False
        self.hardware = parts.hardware
        self.api = parts.api
        src = self.source
        #: The query API's kind, once known (``auto``: after the first build-info probe).
        self.backend: Backend | None = None
        if src.backend != "auto":
            self.backend = backend(src.backend, replica_labels=tuple(src.replica_labels))
        self.plan = self._plan()
        #: The names the fleet exposed at the last tick, and the queries asking for them.
        self.present: frozenset[str] | None = None
        self.queries: list[FleetQuery] = self.plan.queries()
        #: The last tick's pieces (``fleet.pieces``), and its queries with their piece.
        self.pieces: list[Piece] = [Piece(UNLABELLED)]
        self.work: list[tuple[Piece, FleetQuery]] = []
        #: Servers in the last answers (all of them, and this shard's), rows and bytes.
        self.seen = self.owned = 0
        self.last_rows = self.last_bytes = 0
        #: Servers per shard bucket at the last tick, and servers a piece may hold.
        self.bucket_sizes: dict[int, int] = {}
        self.per_piece = PIECE_SERVERS
        self.drop = SeriesDrop(src.series_drop_ratio, src.series_drop_ticks)
        self._client = client
        self._own_client = own_client
        self._notifier = notifier
        self._clock = clock
        self._store = store
        self._headers = dict(parts.headers)
        self._last: float | None = None
        self._ticks = 0
        self._said_left_out = False
        # Rows a proxy mangled arrive every tick: said once a minute, counted always.
        self._unusable = Throttle()
        # What the servers would each log in a tick (discovered, failing alike), said as
        # one line per event: 2,000 servers made 6,000 lines on the first tick.
        self._chorus = Chorus()
        self._incomplete = Throttle()
        self._odd_buckets = Throttle()
        self.api.state.cannot_tell = dict.fromkeys(REASONS, 0)
        # Restored incidents of servers now another replica's: let go at start when
        # ownership is the name's hash. With server-side sharding a server's bucket is
        # known only from its series, and a server gone while the daemon was down (one
        # replica or several) is known only from its absence: both after the first whole
        # tick.
        self._released = False
        if src.shard.buckets == 0 and src.shard.count > 1:
            self._release(lambda name: not self.owns(name))

    def _plan(self) -> QueryPlan:
        src, dcgm = self.source, self.source.dcgm
        known = self.backend or backend("prometheus")
        return QueryPlan(
            selector=src.selector,
            identity=tuple(src.identity_labels),
            window_seconds=self.parts.window_seconds,
            step_seconds=self.parts.step_seconds,
            server_labels=tuple(dict.fromkeys((*dcgm.join, *self.hardware.labels))),
            dcgm_selector=dcgm.selector if dcgm.enabled else None,
            dcgm_join=tuple(dcgm.join.values()),
            dcgm_gpu_metric=dcgm.gpu_metric,
            dcgm_dram_metric=dcgm.dram_metric,
            stall_seconds=self.parts.stall_seconds,
            increase=known.increase,
            changes=known.changes,
            range_pad_seconds=known.range_pad_seconds,
            shard_label=src.shard.label if src.shard.buckets else None,
        )

    async def close(self) -> None:
        """Close the query API's client, when it is this source's own (its TLS)."""
        if self._own_client:
            await self._client.aclose()

    def owns(self, name: str) -> bool:
        """Whether a server without the shard label is this replica's (its name's hash)."""
        shard = self.source.shard
        return shard.count == 1 or shard_of(name, shard.count) == shard.index

    def _release(self, foreign_if: Callable[[str], bool]) -> None:
        """Restored incidents of servers that are now another shard's (the replica count
        changed) or gone (absent from the first whole tick since the start): another
        replica diagnoses them now, or nothing ever will, so this one resolves its alerts
        for them and forgets them, as for a target no longer configured."""
        store, notifier = self._store, self._notifier
        if store is None:
            return
        alerted: set[str] = set()
        if notifier is not None:
            alerted = {a.labels.get("target", "") for a in notifier.active.values()}
        candidates = (set(store.restored.incidents) | alerted) - set(self.targets)
        foreign = {n for n in candidates if n and foreign_if(n)}
        if not foreign:
            return
        with store.batch():
            # One replica: a server absent from a whole tick is gone. Several: it is
            # another's, or gone (which, no replica can tell from its absence alone).
            event = (
                "fleet_server_gone"
                if self.source.shard.count == 1
                else "fleet_server_now_another_shards"
            )
            for name in sorted(foreign):
                self._chorus.warning(event, target=name)
                if name in store.restored.incidents:
                    store.save_incidents(name, ())
                    del store.restored.incidents[name]
            if notifier is not None:
                notifier.resolve_gone(alerted - foreign, self._clock())
        self._chorus.say(log)

    def states(self) -> list[TargetState]:
        return [self.api.state] + [t.state for _, t in sorted(self.targets.items())]

    def _target(self, name: str, labels: Mapping[str, str]) -> Target:
        target = self.targets.get(name)
        if target is None:
            identity = {k: labels[k] for k in self.source.identity_labels if labels.get(k)}
            target = self.targets[name] = self.parts.new_target(name, identity, self._chorus)
            self._chorus.info("fleet_target_discovered", target=name)
        return target

    def _url(self, path: str) -> str:
        return f"{self.source.url.rstrip('/')}{path}"

    @property
    def _params(self) -> tuple[tuple[str, str], ...]:
        return self.backend.params if self.backend is not None else ()

    async def exposed(self, at: float, piece: str = "") -> tuple[frozenset[str] | None, str | None]:
        """The names of the series the queries read that the fleet exposed in the
        window (the label values API: the index alone, no samples), and whether that
        answer was partial; ``None`` when the API cannot say, and every naming is asked
        for. ``piece``: a matcher added to the selector."""
        matchers = ", ".join(
            m for m in (f'__name__=~"{NAMES_REGEX}"', inner(self.source.selector), piece) if m
        )
        try:
            reading = await self._label_values("__name__", matchers, at)
        except ScrapeError as exc:
            if exc.reason != "http_status":
                return None, None  # no answer at all: asking again would only wait again
            return await self._engines_exposed(at, piece)
        return frozenset(reading.rows), reading.partial

    async def _engines_exposed(
        self, at: float, piece: str
    ) -> tuple[frozenset[str] | None, str | None]:
        """When the names call is refused (VictoriaMetrics refuses one that touches more
        series than its ``-search.maxUniqueTimeseries``: every series of a large fleet),
        which engines the fleet runs, from their running gauges alone (one series per
        engine): every naming of those engines is asked for, and no other engine's.
        Asking every engine's would make the longest query (the stall watch's) pass
        VictoriaMetrics' bound on a query's length (``-search.maxQueryLen``, 16 KB)
        once a piece's bucket matcher is long. ``None`` when this is refused too."""
        running = {e.name: e.runtime.name for e in entries("running", "gauge", None)}
        regex = "|".join(re.escape(n) for n in running)
        matchers = ", ".join(
            m for m in (f'__name__=~"{regex}"', inner(self.source.selector), piece) if m
        )
        try:
            reading = await self._label_values("__name__", matchers, at)
        except ScrapeError:
            return None, None
        engines = {running[n] for n in reading.rows if n in running}
        if not engines:
            return None, reading.partial
        return frozenset(e.name for e in NAMES if e.runtime.name in engines), reading.partial

    async def _label_values(self, label: str, matchers: str, at: float) -> Reading:
        """One label values call over the window, restricted to ``matchers``."""
        params = [
            ("match[]", "{" + matchers + "}"),
            ("start", f"{at - self.parts.window_seconds:.3f}"),
            ("end", f"{at:.3f}"),
            *self._params,
        ]
        url = self._url(f"/api/v1/label/{label}/values")
        body = await self._bounded("GET", url, params=params, what=f"{label} values")
        return label_values(f"{label} values", body)

    async def query(self, q: FleetQuery, at: float) -> bytes:
        """One instant query's body (POST: the queries are long)."""
        data = [("query", q.promql), ("time", f"{at:.3f}"), *self._params]
        return await self._bounded("POST", self._url("/api/v1/query"), data=data, what=q.key)

    async def _bounded(
        self,
        method: str,
        url: str,
        *,
        params: Sequence[tuple[str, str]] | None = None,
        data: Sequence[tuple[str, str]] | None = None,
        what: str = "",
    ) -> bytes:
        """One answer of the query API, read as every answer is (``net.bounded``): at
        most ``max_body_bytes`` once decoded (one layer of gzip inflated inside that
        limit), redirects not followed, the whole request bounded by ``timeout_seconds``."""
        shown = safe_url(url) + (f" ({what})" if what else "")
        answer = await request(
            self._client,
            method,
            url,
            timeout=self.source.timeout_seconds,
            max_bytes=self.parts.max_body_bytes,
            headers=self._headers,
            params=_form(params) if params is not None else None,
            data=_form(data) if data is not None else None,
            shown=shown,
            error_bytes=ERROR_BYTES,
        )
        if not answer.ok:
            raise ScrapeError(
                self._refused(answer.status, answer.body, shown), reason="http_status"
            )
        return answer.body

    def _refused(self, status: int, body: bytes, shown: str) -> str:
        """Why the query API said no, with what to do about it."""
        said = quoted(body.decode("utf-8", "replace").strip(), 200)
        text = f"HTTP {status} from {shown}" + (f": {said}" if said else "")
        if status in (401, 403):
            tenant = any(k.lower() == TENANT_HEADER.lower() for k in self._headers)
            if not tenant:
                return (
                    f"{text}; a Mimir or Cortex query API answers so without a tenant: set "
                    f"prometheus.tenant (sent as {TENANT_HEADER}); otherwise check "
                    "prometheus.bearer_token(_file) or basic_auth"
                )
            return f"{text}; check the credentials and prometheus.tenant ({TENANT_HEADER})"
        return text

    @staticmethod
    def rows(q: FleetQuery, body: bytes) -> list[dict[str, Any]]:
        """The rows of an instant query's answer; ``ScrapeError`` if it is not one."""
        rows: list[dict[str, Any]] = query_answer(q.key, body).rows
        return rows

    async def _know_backend(self) -> None:
        """``backend: auto``: ask the build info once, and plan the queries for what it says."""
        if self.backend is not None:
            return
        url = self._url(BUILDINFO)
        shown = safe_url(url)
        answer = await request(
            self._client,
            "GET",
            url,
            timeout=self.source.timeout_seconds,
            max_bytes=64 * 1024,
            headers=self._headers,
            shown=shown,
            error_bytes=ERROR_BYTES,
        )
        if answer.status in (401, 403):
            raise ScrapeError(
                self._refused(answer.status, answer.body, shown), reason="http_status"
            )
        if answer.ok:
            kind, how = detect(answer.body)
        else:
            kind, how = "prometheus", f"build info: HTTP {answer.status}; read as Prometheus"
        self.backend = backend(kind, known_from=how)
        self.plan = self._plan()
        self.present, self.queries = None, self.plan.queries()
        log.info("fleet_backend", backend=kind, known_from=how)

    def _authorize(self) -> None:
        """``bearer_token_file``: read before each tick, so a rotated token is used."""
        path = self.source.bearer_token_file
        if path is None:
            return
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ScrapeError(
                f"cannot read prometheus.bearer_token_file {path}: {why}", reason="auth"
            ) from None
        if not token or any(c in token for c in "\r\n\0"):
            raise ScrapeError(
                f"prometheus.bearer_token_file {path} holds no usable token", reason="auth"
            )
        self._headers["Authorization"] = f"Bearer {token}"

    async def _index(self, at: float, tick: _Tick) -> list[Piece]:
        """The tick's pieces: from the index alone, which names the fleet exposes and,
        with server-side sharding, which buckets exist (the label values API)."""
        shard = self.source.shard
        if not shard.buckets:
            present, partial = await self.exposed(at)
            self._use(present)
            if partial is not None:
                tick.everything = partial
            return [Piece(UNLABELLED)]
        label = shard.label
        # The buckets from one gauge every server exposes (one series per engine): a
        # match over every series of a large fleet passes VictoriaMetrics' bound on the
        # series one label values call may touch (-search.maxUniqueTimeseries).
        running = "|".join(re.escape(n) for n in names("running", "gauge", None))
        sel = ", ".join(m for m in (f'__name__=~"{running}"', inner(self.source.selector)) if m)
        (present, partial), buckets, (bare, bare_partial) = await asyncio.gather(
            self.exposed(at),
            self._label_values(label, sel, at),
            self.exposed(at, f'{label}=""'),
        )
        self._use(present)
        tick.everything = partial or buckets.partial or bare_partial
        mine, odd = owned(buckets.rows, shard.index, shard.count)
        if odd:
            self._odd_buckets.warn(
                log,
                "fleet_shard_label_not_a_bucket",
                count=None,
                label=label,
                values=[quoted(v, 40) for v in odd[:5]],
                hint=f"{label} must hold the relabel rule's bucket number "
                "(vllm-triage render relabel); these series are no replica's",
            )
        pieces = plan(mine, self.bucket_sizes, label, self.per_piece)
        # Series without the label: vLLM's when any came in the window (or the API
        # could not say), DCGM's always (a rule may be on vLLM's job only).
        pieces.append(unlabelled(label, vllm=bare is None or bool(bare)))
        return pieces

    def _use(self, present: frozenset[str] | None) -> None:
        if present != self.present:
            self.present = present
            self.queries = self.plan.queries(present)

    async def tick(self) -> None:
        """One evaluation round for the whole fleet; never raises for what the API did."""
        with paused():
            await self._tick()
        self._ticks += 1
        settle(self._ticks)

    async def _tick(self) -> None:
        self.in_flight = True
        step = self.parts.step_seconds
        now = self._clock()
        # Evaluation times on a fixed grid: consecutive ticks neither repeat nor drift.
        at = now - now % step
        api = self.api.state
        started = time.monotonic()
        fleet = Fleet(
            identity=tuple(self.source.identity_labels),
            name_of=lambda labels: target_name(labels, self.source.identity_labels),
        )
        tick = _Tick()
        try:
            # The same step twice is skipped; an earlier one (the clock went back) is
            # judged, and each server's window starts again there (``Target``).
            if at == self._last:
                return
            self._authorize()
            await self._know_backend()
            self.pieces = await self._index(at, tick)
            self.work = [
                (piece, q)
                for piece in self.pieces
                for q in self.plan.queries(self.present, piece.matcher, vllm=piece.vllm)
            ]
            await self._read_all(fleet, at, tick)
        except ScrapeError as exc:
            self.api.failed(exc.reason, str(exc))
            return
        except asyncio.CancelledError:
            # Only shutdown cancels a tick: not the API's fault, and letting it out would
            # make the scheduler log a crash.
            log.debug("fleet_tick_cancelled")
            return
        finally:
            api.attempted(now, time.monotonic() - started)
            self.in_flight = False
        self.api.succeeded(now)
        self._last = at
        self.last_rows = fleet.rows
        api.partial_answers += tick.partial_answers
        if fleet.unusable:
            self.api.state.series_problems += fleet.unusable
            self._unusable.warn(
                log,
                "fleet_rows_unusable",
                count=None,
                rows=fleet.unusable,
                of=fleet.rows,
                held_back=self._unusable.held,
                why="labels that are not strings",
            )
        self._size(fleet, tick)
        self._judge(fleet, at, tick)
        self._chorus.say(log)

    async def _read_all(self, fleet: Fleet, at: float, tick: _Tick) -> None:
        """Every query of the tick, a few in flight at a time (the query API serves
        dashboards and rules too), each answer read as it arrives while the others are
        evaluated, and dropped once read: memory holds one parsed answer at a time."""
        limit = asyncio.Semaphore(CONCURRENT_QUERIES)
        join = tuple(self.source.dcgm.join.values())

        async def one(piece: Piece, q: FleetQuery) -> None:
            async with limit:
                body = await self.query(q, at)
            # Read here, not handed back: a finished task keeps its result alive.
            self.last_bytes += len(body)
            if len(body) > tick.largest[0]:
                tick.largest = (len(body), piece.index)
            try:
                reading = query_answer(q.key, body)
                tick.took(piece, reading)
                fleet.read(q.key, reading.rows, join, piece.index)
            except ScrapeError:
                raise
            except Exception as exc:
                # Whatever a peer's bytes hold, they fail this tick as the API's fault
                # (counted, logged once), never the scheduler's job with a traceback.
                raise ScrapeError(
                    f"unreadable answer ({q.key}): {type(exc).__name__}: {str(exc)[:200]}",
                    reason="parse",
                ) from exc

        tasks = [asyncio.create_task(one(piece, q)) for piece, q in self.work]
        self.last_bytes = 0
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _size(self, fleet: Fleet, tick: _Tick) -> None:
        """Servers per bucket, and how many a piece may hold so that its largest answer
        stays under a quarter of ``max_body_bytes``: the next tick's pieces."""
        label = self.plan.shard_label
        if label is None:
            return
        sizes: dict[int, int] = {}
        per_piece: dict[int, int] = {}
        for server in fleet.servers.values():
            per_piece[server.piece] = per_piece.get(server.piece, 0) + 1
            bucket = server.labels.get(label, "")
            if bucket.isdigit() and len(bucket) <= 9:
                sizes[int(bucket)] = sizes.get(int(bucket), 0) + 1
        self.bucket_sizes = sizes
        size, piece = tick.largest
        servers = per_piece.get(piece, 0)
        if size and servers:
            fits = self.parts.max_body_bytes // 4 // max(1, size // servers)
            self.per_piece = max(1, min(PIECE_SERVERS, fits))

    def _bounded_fleet(self, owned: dict[str, Server]) -> dict[str, Server]:
        """At most ``max_servers``: the servers already judged first, then the others by
        name; the rest are counted and said once (a selector that is too broad must not
        grow memory, alerts and the API document with it)."""
        cap = self.source.max_servers
        over = len(owned) - cap
        self.api.state.servers_left_out = max(0, over)
        if over <= 0:
            self._said_left_out = False
            return owned
        known = [n for n in sorted(owned) if n in self.targets]
        rest = [n for n in sorted(owned) if n not in self.targets]
        keep = (known + rest)[:cap]
        if not self._said_left_out:
            self._said_left_out = True
            log.warning(
                "fleet_servers_left_out",
                servers=len(owned),
                judged=cap,
                left_out=over,
                first_left_out=sorted(set(owned) - set(keep))[0][:120],
                hint="narrow prometheus.selector, shard the fleet, or raise "
                "prometheus.max_servers (and the memory limit with it)",
            )
        return {n: owned[n] for n in keep}

    def _cannot_tell(
        self, fleet: Fleet, owned: Mapping[str, Server], tick: _Tick
    ) -> dict[str, str]:
        """Each owned server whose answers may be missing data, and why."""
        partial = tick.everything is not None or bool(tick.partial)
        # A partial tick's rows are short by what did not come: no baseline from them.
        drop = not partial and self.drop.dropped(fleet.rows)
        out: dict[str, str] = {}
        for name, server in owned.items():
            if tick.everything is not None or server.piece in tick.partial:
                out[name] = "partial"
            elif drop:
                out[name] = "series_drop"
            elif server.copies > 1:
                out[name] = "duplicated"
            elif server.split:
                out[name] = "split"
        if partial or drop:
            # Known servers missing from answers that may miss data: gone, or missed.
            missed = "partial" if partial else "series_drop"
            out.update({n: missed for n in self.targets if n not in owned})
        return out

    def _say_cannot_tell(self, why: Mapping[str, str], tick: _Tick, fleet: Fleet) -> None:
        counts: dict[str, int] = dict.fromkeys(REASONS, 0)
        for reason in why.values():
            counts[reason] += 1
        self.api.state.cannot_tell = counts
        if tick.notes:
            log.debug("fleet_promql_notes", notes=sorted(tick.notes)[:3])
        if not why:
            self._incomplete.recovered(log, "fleet_answers_whole")
            return
        said = {r: n for r, n in counts.items() if n}
        first = tick.everything or next(iter(tick.partial.values()), None)
        hint = "nothing judged for these servers this tick; their last verdicts stand"
        if counts["duplicated"]:
            hint += (
                "; duplicated: deduplicate the HA pair (backend: thanos with "
                "replica_labels, or --query.replica-label on the querier) or narrow "
                "prometheus.selector to one scrape job per server"
            )
        if counts["series_drop"]:
            hint += (
                f"; series_drop: {fleet.rows} rows against {self.drop.baseline}; judged "
                f"again once the lower count holds {self.source.series_drop_ticks} ticks"
            )
        self._incomplete.warn(
            log,
            "fleet_cannot_tell",
            key=",".join(sorted(said)),
            count="ticks_since_last_log",
            servers=said,
            partial=first,
            hint=hint,
        )

    def _judge(self, fleet: Fleet, at: float, tick: _Tick) -> None:
        window = self.parts.window_seconds
        min_obs = self.parts.min_observations
        join = tuple(self.source.dcgm.join)
        mine = {n: s for n, s in fleet.servers.items() if s.piece != UNLABELLED or self.owns(n)}
        owned = self._bounded_fleet(mine)
        self.seen, self.owned = len(fleet.servers), len(owned)
        why = self._cannot_tell(fleet, owned, tick)
        self._say_cannot_tell(why, tick, fleet)
        whole = tick.everything is None and not tick.partial and self.drop.low == 0
        if whole:
            # Only a whole tick says a server is gone: a partial one may just miss it.
            for name, target in self.targets.items():
                if name not in owned:
                    target.failed("absent", "no series for this server in the query API")
            if not self._released:
                self._released = True
                # Not ``owned``: a server left out by ``max_servers`` is neither gone nor
                # another's, and its alerts stand.
                self._release(lambda name: name not in mine)
        for name, server in sorted(owned.items()):
            if not server.models or name in why:
                continue  # only a KV pool so far, or answers that may miss data
            target = self._target(name, server.labels)
            target.state.attempted(at)
            try:
                pod = tuple(server.labels.get(k, "") for k in join)
                gpus = fleet.dcgm_gpus.get(pod) if any(pod) else None
                card = Card(gpus) if gpus else None
                dram = fleet.dcgm_dram.get(pod) if any(pod) else None
                pool, cache = server.pool_tokens(), server.cache_config()
                rulebooks = {
                    m: self.hardware.resolve(server.labels, m, card) for m in server.models
                }
                signals = {
                    m: signals_from_totals(
                        totals(
                            server,
                            m,
                            at,
                            window,
                            pool_tokens=pool,
                            kv_cache=cache,
                            dram_active=dram,
                            stall_seconds=self.plan.stall_seconds,
                        ),
                        min_obs,
                    )
                    for m in server.models
                }
            except Exception as exc:  # whatever one server's rows set off (errors.py)
                # That server's failure alone: the servers after it are judged this tick.
                target.unjudgeable(exc)
                continue
            target.consume_signals(at, signals, rulebooks, tuple(server.problems))
