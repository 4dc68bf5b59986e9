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
import contextlib
import gc
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import structlog

from vllm_triage.config.schema import PrometheusSourceSettings
from vllm_triage.core.names import label_value
from vllm_triage.core.signals import signals_from_totals
from vllm_triage.errors import ScrapeError
from vllm_triage.fleet.hardware import Card, HardwareResolver
from vllm_triage.fleet.queries import NAMES_REGEX, FleetQuery, QueryPlan, inner
from vllm_triage.fleet.signals import Fleet, Server, totals
from vllm_triage.logs import Chorus, Throttle
from vllm_triage.net.bounded import request
from vllm_triage.net.redact import safe_url
from vllm_triage.notify.notifier import Notifier
from vllm_triage.state import TargetState
from vllm_triage.store import StateStore
from vllm_triage.target import Health, Target

log = structlog.get_logger("vllm_triage.fleet")

_NAME_OK = re.compile(r"[^A-Za-z0-9_.:/@-]+")
#: Queries of one tick in flight at once (Prometheus runs 20 at a time by default,
#: ``--query.max-concurrency``, for every user together).
CONCURRENT_QUERIES = 6


def target_name(labels: Mapping[str, str], identity: Iterable[str]) -> str:
    """``job/instance`` (or the configured identity labels), usable as a label value."""
    parts = [labels.get(k, "") for k in identity]
    name = "/".join(p for p in parts if p) or "unlabelled"
    name = _NAME_OK.sub("_", name)
    return label_value(name if name[0].isalnum() else "t" + name)


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cycle collector off for a stretch that allocates a great many objects
    without a cycle (JSON rows, signals, diagnoses): reference counting frees them all
    the same. Left on, the collector scanned every live object of the fleet several
    times per tick, 40 % of a tick's CPU at 2,000 servers and growing with the square of
    the fleet (bench/bench_fleet.py). No await happens inside."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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
    #: Every query's headers: JSON, one layer of gzip, the API's credentials.
    headers: Mapping[str, str]
    #: The range over which an engine must show no change to be stalled (``QueryPlan``).
    stall_seconds: float = 60.0


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
    ) -> None:
        self.parts = parts
        self.source: PrometheusSourceSettings = parts.source
        self.targets: dict[str, Target] = {}
        self.in_flight = False
        self.hardware = parts.hardware
        self.api = parts.api
        src = self.source
        dcgm = src.dcgm
        self.plan = QueryPlan(
            selector=src.selector,
            identity=tuple(src.identity_labels),
            window_seconds=parts.window_seconds,
            step_seconds=parts.step_seconds,
            server_labels=tuple(dict.fromkeys((*dcgm.join, *self.hardware.labels))),
            dcgm_selector=dcgm.selector if dcgm.enabled else None,
            dcgm_join=tuple(dcgm.join.values()),
            dcgm_gpu_metric=dcgm.gpu_metric,
            dcgm_dram_metric=dcgm.dram_metric,
            stall_seconds=parts.stall_seconds,
        )
        #: The names the fleet exposed at the last tick, and the queries asking for them.
        self.present: frozenset[str] | None = None
        self.queries: list[FleetQuery] = self.plan.queries()
        #: Servers in the last answers (all of them, and this shard's), rows and bytes.
        self.seen = self.owned = 0
        self.last_rows = self.last_bytes = 0
        self._client = client
        self._notifier = notifier
        self._clock = clock
        self._store = store
        self._headers = dict(parts.headers)
        self._last: float | None = None
        self._said_left_out = False
        # Rows a proxy mangled arrive every tick: said once a minute, counted always.
        self._unusable = Throttle()
        # What the servers would each log in a tick (discovered, failing alike), said as
        # one line per event: 2,000 servers made 6,000 lines on the first tick.
        self._chorus = Chorus()
        self._release_foreign()

    def owns(self, name: str) -> bool:
        shard = self.source.shard
        return shard.count == 1 or shard_of(name, shard.count) == shard.index

    def _release_foreign(self) -> None:
        """Restored incidents of servers that are now another shard's (the replica count
        changed): that replica diagnoses them now, so this one resolves its alerts for
        them and forgets them, as for a target no longer configured."""
        store, notifier = self._store, self._notifier
        if store is None or self.source.shard.count == 1:
            return
        alerted: set[str] = set()
        if notifier is not None:
            alerted = {a.labels.get("target", "") for a in notifier.active.values()}
        foreign = {n for n in set(store.restored.incidents) | alerted if n and not self.owns(n)}
        if not foreign:
            return
        with store.batch():
            for name in sorted(foreign):
                self._chorus.warning("fleet_server_now_another_shards", target=name)
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

    async def exposed(self, at: float) -> frozenset[str] | None:
        """The names of the series the queries read that the fleet exposed in the
        window (the label values API: the index alone, no samples); ``None`` when the
        API cannot say, and every naming is asked for."""
        url = f"{self.source.url.rstrip('/')}/api/v1/label/__name__/values"
        matchers = ", ".join(
            m for m in (f'__name__=~"{NAMES_REGEX}"', inner(self.source.selector)) if m
        )
        params = {
            "match[]": "{" + matchers + "}",
            "start": f"{at - self.parts.window_seconds:.3f}",
            "end": f"{at:.3f}",
        }
        try:
            body = await self._bounded("GET", url, params=params)
            doc = json.loads(body)
            found = doc["data"] if isinstance(doc, dict) else None
        except (ScrapeError, ValueError, KeyError, TypeError, RecursionError):
            found = None
        if not isinstance(found, list):
            return None
        return frozenset(n for n in found if isinstance(n, str))

    async def query(self, q: FleetQuery, at: float) -> bytes:
        """One instant query's body (POST: the queries are long)."""
        url = f"{self.source.url.rstrip('/')}/api/v1/query"
        data = {"query": q.promql, "time": f"{at:.3f}"}
        return await self._bounded("POST", url, data=data, what=q.key)

    async def _bounded(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        data: Mapping[str, str] | None = None,
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
            params=params,
            data=data,
            shown=shown,
        )
        if not answer.ok:
            raise ScrapeError(f"HTTP {answer.status} from {shown}", reason="http_status")
        return answer.body

    @staticmethod
    def rows(q: FleetQuery, body: bytes) -> list[dict[str, Any]]:
        """The rows of an instant query's answer; ``ScrapeError`` if it is not one."""
        try:
            doc = json.loads(body)
            if doc.get("status") != "success":
                raise ValueError(doc.get("error", "status is not success"))
            if doc["data"]["resultType"] != "vector":
                raise ValueError(f"a {doc['data']['resultType']}, not a vector")
            result: list[dict[str, Any]] = doc["data"]["result"]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise ScrapeError(
                f"not an instant query answer ({q.key}): {str(exc)[:200]}", reason="parse"
            ) from exc
        return result

    async def tick(self) -> None:
        """One evaluation round for the whole fleet; never raises for what the API did."""
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
        try:
            # The same step twice is skipped; an earlier one (the clock went back) is
            # judged, and each server's window starts again there (``Target``).
            if at == self._last:
                return
            present = await self.exposed(at)
            if present != self.present:
                self.present = present
                self.queries = self.plan.queries(present)
            await self._read_all(fleet, at)
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
        with cyclic_gc_paused():
            self._judge(fleet, at)
        self._chorus.say(log)

    async def _read_all(self, fleet: Fleet, at: float) -> None:
        """Every query of the tick, a few in flight at a time (the query API serves
        dashboards and rules too), each answer read as it arrives while the others are
        evaluated, and dropped once read: memory holds one parsed answer at a time."""
        limit = asyncio.Semaphore(CONCURRENT_QUERIES)
        join = tuple(self.source.dcgm.join.values())

        async def one(q: FleetQuery) -> None:
            async with limit:
                body = await self.query(q, at)
            # Read here, not handed back: a finished task keeps its result alive.
            self.last_bytes += len(body)
            try:
                with cyclic_gc_paused():
                    fleet.read(q.key, self.rows(q, body), join)
            except ScrapeError:
                raise
            except Exception as exc:
                # Whatever a peer's bytes hold, they fail this tick as the API's fault
                # (counted, logged once), never the scheduler's job with a traceback.
                raise ScrapeError(
                    f"unreadable answer ({q.key}): {type(exc).__name__}: {str(exc)[:200]}",
                    reason="parse",
                ) from exc

        tasks = [asyncio.create_task(one(q)) for q in self.queries]
        self.last_bytes = 0
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

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

    def _judge(self, fleet: Fleet, at: float) -> None:
        window = self.parts.window_seconds
        min_obs = self.parts.min_observations
        join = tuple(self.source.dcgm.join)
        owned = self._bounded_fleet({n: s for n, s in fleet.servers.items() if self.owns(n)})
        self.seen, self.owned = len(fleet.servers), len(owned)
        for name, target in self.targets.items():
            if name not in owned:
                target.failed("absent", "no series for this server in the query API")
        for name, server in sorted(owned.items()):
            if not server.models:
                continue  # only a KV pool so far: nothing to judge
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
