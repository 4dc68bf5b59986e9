"""The PromQL fleet mode sends each tick: instant queries in which Prometheus does the
windowing, one per signal, each answering for every server (its identity labels) and
``model_name`` at once. What they ask:

- the latency histograms' bucket increases over the window (``ttft``, ``itl``,
  ``iteration_tokens``), ``le`` kept: the quantiles are computed here from the bucket
  deltas (``daemon/vllm_triage/core/histogram.py``), as the sidecar does, so they say where in the
  buckets they fell;
- every histogram's ``_sum`` and ``_count`` increases (means, observation counts) and the
  counters' increases (rates, speculative decoding);
- the gauges' mean, max and min over the window, their means over the moments requests
  were running (a subquery at the evaluation step), the samples and the engines;
- engine by engine (the ``engine`` label, vLLM's data-parallel rank): whether its
  step-driven series changed over the stall range, its work outstanding and sleep state
  then, and its window means of waiting requests and KV usage (the balance);
- ``cache_config_info``'s pool size and settings (bytes, utilization, cache dtype); and,
  with DCGM, each pod's card, GPU count and memory activity.

Every vLLM naming era can be asked for: a field's names (the current one, the V0 one,
Ray Serve's prefix) are joined with ``or on (<server>, model_name)``, so a server that
exposes several gets the first, as the parser's "the newest naming wins". Each tick
first asks which names the fleet exposes at all (the label values API, from the index
alone), and only those go into the queries: a fleet on one vLLM version gets plain
queries, without alternatives (``or`` costs Prometheus a fifth of a query's time).

One query per signal rather than a union of tagged rows: tagging each row with
``label_replace`` cost Prometheus as much again as the query itself (bench/bench_fleet.py).

To add a signal (a gauge, a progress age), add one row to ``GAUGES`` (its key and its
PromQL from the server's instant vector) and read its key in ``fleet.signals.totals``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vllm_triage.core.names import NameTable, Spec
from vllm_triage.core.runtime import COUNTER_FIELDS, HISTOGRAM_FIELDS, RuntimeSpec
from vllm_triage.rules import runtime_table

_RUNTIMES = runtime_table()
_TABLE = NameTable.of(_RUNTIMES)
#: The label the fleet's rows name a data-parallel rank by (vLLM's own); another engine's
#: rank label is copied into it (SGLang's ``dp_rank``).
RANK = "engine"
#: The label the progress query tags each family's changes with (summed away).
SERIES = "triage_series"


@dataclass(frozen=True, slots=True)
class Name:
    """One exposed sample name read for one field: whose (``runtime``), under which
    prefix, and how (``spec``: its kind, naming era and label matchers)."""

    name: str
    prefix: str
    spec: Spec
    runtime: RuntimeSpec


_RANK = {"new": 0, "both": 1, "old": 2}


def _names_in_order() -> tuple[Name, ...]:
    """Every runtime's names, in the parser's order of preference: the runtimes in the
    table's order (vLLM first), each one's first prefix before the others, the newest
    naming before the old."""
    found = []
    for name, reading in _TABLE.samples.items():
        rt = _TABLE.spec(reading.runtime)
        for one in reading.specs:
            key = (reading.runtime, rt.prefixes.index(reading.prefix), _RANK[one.generation])
            found.append((key, name, Name(name, reading.prefix, one, rt)))
    return tuple(entry for *_, entry in sorted(found, key=lambda f: (f[0], f[1])))


NAMES = _names_in_order()
#: Every sample name the queries may read, as the parser reads it (its prefix and its
#: first reading).
SAMPLES: dict[str, tuple[str, Spec]] = {}
for _entry in NAMES:
    SAMPLES.setdefault(_entry.name, (_entry.prefix, _entry.spec))
PREFIXES = _TABLE.prefixes

#: Histograms whose buckets are read (for quantiles and the roofline's step mix); the
#: others only need their sum and count.
BUCKET_FIELDS = ("ttft", "itl", "iteration_tokens")
#: Counters the signals read (``requests_finished`` is not one of them).
COUNTERS = tuple(c for c in COUNTER_FIELDS if c != "requests_finished")
DCGM_MODEL = "modelName"
DCGM_UUID = "UUID"
#: ``cache_config_info``'s labels read: the pool's size, and what sizes its KV bytes per
#: token (``core.roofline.kvpool.CacheConfig``).
POOL_LABELS = (
    "engine",
    "block_size",
    "num_gpu_blocks",
    "kv_cache_size_tokens",
    "kv_cache_memory_bytes",
    "gpu_memory_utilization",
    "cache_dtype",
)
#: Every name the queries may read, as one regular expression (for the names call).
NAMES_REGEX = "|".join(re.escape(name) for name in sorted(SAMPLES))


def entries(field: str, kind: str, runtime: str | None = None) -> list[Name]:
    """Every exposed name of one field and kind (of one runtime's, or of every one), in
    the parser's order of preference."""
    return [
        e
        for e in NAMES
        if e.spec.field == field
        and e.spec.kind == kind
        and (runtime is None or e.runtime.name == runtime)
    ]


def names(field: str, kind: str, runtime: str | None = "vllm") -> list[str]:
    """vLLM's exposed names of one field and kind (``runtime=None``: every engine's), in
    the parser's order of preference: ``vllm:`` before ``ray_vllm:``, the current naming
    before the old."""
    return list(dict.fromkeys(e.name for e in entries(field, kind, runtime)))


def runtime_reads(rt: RuntimeSpec, expr: str) -> str:
    """An aggregation ``AGG by (labels) (inner)`` over one engine's series, reading them
    as vLLM's: copies of one scheduler's series read once (the max over the copy labels,
    as the parser takes the first), its rank label copied into ``engine`` and its model
    label into ``model_name``. vLLM's expression is returned as it is."""
    agg, sep, inner = expr.partition(") (")
    if not sep or not inner.endswith(")") or " by (" not in agg:
        raise ValueError(f"not an aggregation over a vector: {expr!r}")
    kept = {label.strip() for label in agg.split(" by (", 1)[1].split(",")}
    renames = [
        (to, frm)
        for to, frm in ((RANK, rt.rank_label), ("model_name", rt.model_label))
        if frm is not None and frm != to and to in kept
    ]
    if not rt.copy_labels and not renames:
        return expr
    inner = inner[:-1]
    if rt.copy_labels:
        inner = f"max without ({', '.join(rt.copy_labels)}) ({inner})"
    for to, frm in renames:
        inner = f'label_replace({inner}, "{to}", "$1", "{frm}", "(.*)")'
    return f"{agg}) ({inner})"


def duration(seconds: float) -> str:
    """A PromQL duration; milliseconds, because Prometheus 2 takes no decimal seconds."""
    return f"{round(seconds * 1000)}ms"


def inner(selector: str) -> str:
    """``{a="x"}`` -> ``a="x"``: the matchers, to put beside a metric name."""
    return selector.strip().removeprefix("{").removesuffix("}").strip()


def _selector(name: str, matchers: str) -> str:
    return f"{name}{{{matchers}}}" if matchers else name


@dataclass(frozen=True, slots=True)
class FleetQuery:
    """One instant query of a tick: ``key`` names what each of its rows is."""

    key: str
    promql: str


#: (key, the gauge's field, PromQL from the server-and-model instant vector ``v``, the
#: window's range ``w``, the step ``r`` and the window's length ``o`` as an offset).
#: ``v`` is summed over a server's data-parallel engines (running, waiting) or averaged
#: (KV usage), as the parser merges them.
GaugeRow = tuple[str, str, Callable[[str, str, str, str], str]]
GAUGES: tuple[GaugeRow, ...] = (
    ("running_max", "running", lambda v, w, r, o: f"max_over_time(({v})[{w}:{r}])"),
    ("waiting_max", "waiting", lambda v, w, r, o: f"max_over_time(({v})[{w}:{r}])"),
    ("waiting_min", "waiting", lambda v, w, r, o: f"min_over_time(({v})[{w}:{r}])"),
    ("running_busy_mean", "running", lambda v, w, r, o: f"avg_over_time((({v}) > 0)[{w}:{r}])"),
    # The queue at the window's start and end: its growth counts among the arrivals
    # (the load ratio, ``core.predict``).
    ("waiting_first", "waiting", lambda v, w, r, o: f"last_over_time(({v})[{r}:{r}] offset {o})"),
    ("waiting_last", "waiting", lambda v, w, r, o: v),
)
#: (key, field, aggregation over engines, function over the window's raw samples).
OVER_TIME = (
    ("running_mean", "running", "sum", "avg_over_time"),
    ("waiting_mean", "waiting", "sum", "avg_over_time"),
    ("kv_usage_mean", "kv_usage", "avg", "avg_over_time"),
    ("kv_usage_max", "kv_usage", "max", "max_over_time"),
    ("snapshots", "running", "max", "count_over_time"),
)


@dataclass(frozen=True, slots=True)
class QueryPlan:
    """The queries of one fleet: its selector, server identity, window and step."""

    selector: str
    identity: tuple[str, ...]
    window_seconds: float
    step_seconds: float
    #: Labels read per server besides the identity (the DCGM join, the rules' labels).
    server_labels: tuple[str, ...] = ()
    dcgm_selector: str | None = None
    dcgm_join: tuple[str, ...] = ()
    dcgm_gpu_metric: str = "DCGM_FI_DEV_FB_USED"
    dcgm_dram_metric: str = "DCGM_FI_PROF_DRAM_ACTIVE"
    #: The range over which an engine with work outstanding and no change at all in its
    #: step-driven series is stalled: at least a minute, so that it holds several scrapes
    #: of Prometheus' own (``stall_window``).
    stall_seconds: float = 60.0
    #: The functions with Prometheus' semantics on this backend (``fleet.backend``), and
    #: what its ranges need added to hold a sample exactly a range old, as Prometheus 2's
    #: and the sidecar's windows do (VictoriaMetrics' ranges are open on the left).
    increase: str = "increase"
    changes: str = "changes"
    range_pad_seconds: float = 0.0
    #: The shard label, read per server when server-side sharding is on
    #: (``fleet.pieces``): how many servers each bucket holds sizes the next pieces.
    shard_label: str | None = None

    @property
    def by(self) -> str:
        return ", ".join(dict.fromkeys((*self.identity, "model_name")))

    def queries(
        self, present: frozenset[str] | None = None, piece: str = "", *, vllm: bool = True
    ) -> list[FleetQuery]:
        """Every query of a tick. ``present``: the names the fleet exposes (``None``:
        not known, so every naming is asked for); a field none of whose names is
        present is not asked for at all. ``piece``: a matcher added to every selector
        (``fleet.pieces``); ``vllm`` False asks DCGM's queries only."""
        return _Builder(self, present, piece).queries(vllm=vllm)


def _joined(*matchers: str) -> str:
    return ", ".join(m for m in matchers if m)


class _Builder:
    def __init__(self, plan: QueryPlan, present: frozenset[str] | None, piece: str) -> None:
        self.plan = plan
        self.present = present
        self.piece = piece
        self.matchers = _joined(inner(plan.selector), piece)
        self.inc = plan.increase
        self.by = plan.by
        self.w = duration(plan.window_seconds + plan.range_pad_seconds)
        self.r = duration(plan.step_seconds)
        self.o = duration(plan.window_seconds)

    def _names(self, field: str, kind: str) -> list[str]:
        return list(dict.fromkeys(e.name for e in self._entries(field, kind)))

    def _entries(self, field: str, kind: str, runtime: str | None = None) -> list[Name]:
        return [
            e
            for e in entries(field, kind, runtime)
            if self.present is None or e.name in self.present
        ]

    def _selector(self, e: Name) -> str:
        """``e``'s name with the plan's matchers and the engine's own (SGLang's
        ``mode="decode"``)."""
        own = ", ".join(f'{k}="{v}"' for k, v in e.spec.match)
        return _selector(e.name, ", ".join(m for m in (self.matchers, own) if m))

    def runtimes(self) -> list[RuntimeSpec]:
        """The engines the fleet exposes (every one when it is not known), vLLM first."""
        return [
            rt
            for rt in _RUNTIMES.specs
            if any(self.present is None or e.name in self.present for e in NAMES if e.runtime is rt)
        ]

    def _each(self, field: str, kind: str, template: str, on: str | None = None) -> str | None:
        """``template`` (``{s}``: a selector) over a field's names, every engine's, the
        first winning per server and model; ``None`` when the fleet exposes none of them."""
        exprs = [
            runtime_reads(e.runtime, template.format(s=self._selector(e)))
            for e in self._entries(field, kind)
        ]
        if not exprs:
            return None
        if len(exprs) == 1:
            return exprs[0]
        return f" or on ({on or self.by}) ".join(f"({e})" for e in exprs)

    def queries(self, *, vllm: bool = True) -> list[FleetQuery]:
        out: list[FleetQuery | None] = []
        if vllm:
            by, w, inc = self.by, self.w, self.inc
            for field in BUCKET_FIELDS:
                expr = self._each(field, "bucket", f"sum by ({by}, le) ({inc}({{s}}[{w}]))")
                out.append(self._query(f"{field}_bucket", expr))
            for field in HISTOGRAM_FIELDS:
                for part in ("sum", "count"):
                    expr = self._each(field, part, f"sum by ({by}) ({inc}({{s}}[{w}]))")
                    out.append(self._query(f"{field}_{part}", expr))
            for field in COUNTERS:
                expr = self._each(field, "counter", f"sum by ({by}) ({inc}({{s}}[{w}]))")
                out.append(self._query(field, expr))
            out += self._gauges()
            out.append(self._copies())
            out += self._progress()
            out += self._balance()
            out.append(self._pool())
            out.append(self._runtime())
            out += self._engine_gauges()
        out += self._dcgm()
        return [q for q in out if q is not None]

    def _copies(self) -> FleetQuery | None:
        """Per server and model, the most series any one engine has now: 1, unless the
        answers hold the same server twice (an HA pair not deduplicated, two scrape jobs
        on one pod), which doubles every sum: that server cannot be judged from them."""
        by = self.by
        each = self._each(
            "running", "gauge", f"count by ({by}, engine) ({{s}})", on=f"{by}, engine"
        )
        return self._query("copies", None if each is None else f"max by ({by}) ({each})")

    @staticmethod
    def _query(key: str, expr: str | None) -> FleetQuery | None:
        return None if expr is None else FleetQuery(key, expr)

    def _gauges(self) -> list[FleetQuery | None]:
        by, w, r = self.by, self.w, self.r
        out = [
            self._query(key, self._each(field, "gauge", f"{agg} by ({by}) ({fn}({{s}}[{w}]))"))
            for key, field, agg, fn in OVER_TIME
        ]
        running = self._each("running", "gauge", f"sum by ({by}) ({{s}})")
        for key, field, expr in GAUGES:
            v = self._each(field, "gauge", f"sum by ({by}) ({{s}})")
            out.append(self._query(key, None if v is None else expr(v, w, r, self.o)))
        kv = self._each("kv_usage", "gauge", f"avg by ({by}) ({{s}})")
        if kv is not None and running is not None:
            # Weighted by the requests running, as the sidecar's window weighs it.
            busy = (
                f"sum_over_time((({kv}) * on ({by}) ({running}))[{w}:{r}])"
                f" / (sum_over_time(({running})[{w}:{r}]) > 0)"
            )
            out.append(FleetQuery("kv_usage_busy_mean", busy))
        # Engines, and the labels the hardware rules and the DCGM join read.
        shard = (self.plan.shard_label,) if self.plan.shard_label else ()
        labels = ", ".join(
            dict.fromkeys((*self.plan.identity, "model_name", *self.plan.server_labels, *shard))
        )
        engines = self._each(
            "running", "gauge", f"count by ({labels}) (last_over_time({{s}}[{w}]))"
        )
        out.append(self._query("engines", engines))
        return out

    def _progress(self) -> list[FleetQuery | None]:
        """Engine by engine (``engine``, the data-parallel rank; one engine without the
        label is one row): how many times its step-driven series changed over the stall
        range, the fewest requests it had outstanding then, and whether it is awake
        (vLLM's sleep mode). The merged series move while any one engine steps, so a hung
        engine among several shows only here."""
        by = f"{self.by}, engine"
        s = duration(self.plan.stall_seconds + self.plan.range_pad_seconds)
        moved = [
            self._each_of(
                "vllm", field, kind, f"sum by ({by}) ({self.plan.changes}({{s}}[{s}]))", on=by
            )
            for field, kind in (
                ("generation_tokens", "counter"),
                ("prompt_tokens", "counter"),
                ("running", "gauge"),
                ("waiting", "gauge"),
                ("kv_usage", "gauge"),
            )
        ]
        per_runtime = [" + ".join(f"({m})" for m in moved if m is not None) or None]
        per_runtime += [self._moved(rt, by, s) for rt in self.runtimes() if rt.name != "vllm"]
        found = [m for m in per_runtime if m is not None]
        changes = f" or on ({by}) ".join(f"({m})" for m in found) if len(found) > 1 else None
        if len(found) == 1:
            changes = found[0]
        owed = [
            self._each(field, "gauge", f"sum by ({by}) (min_over_time({{s}}[{s}]))", on=by)
            for field in ("running", "waiting")
        ]
        outstanding = " + ".join(f"({o})" for o in owed if o is not None) or None
        awake_matchers = ", ".join(m for m in ('sleep_state="awake"', self.matchers) if m)
        awake_exprs = [
            f"min by ({by}) (last_over_time({_selector(n, awake_matchers)}[{self.w}]))"
            for n in self._names("sleep_state", "state")
        ]
        awake = f" or on ({by}) ".join(f"({e})" for e in awake_exprs) or None
        return [
            self._query("engine_changes", changes),
            self._query("engine_outstanding", outstanding),
            self._query("engine_awake", awake),
        ]

    def _each_of(
        self, runtime: str, field: str, kind: str, template: str, on: str | None = None
    ) -> str | None:
        """``_each`` over one engine's names only."""
        exprs = [
            runtime_reads(e.runtime, template.format(s=self._selector(e)))
            for e in self._entries(field, kind, runtime)
        ]
        if not exprs:
            return None
        if len(exprs) == 1:
            return exprs[0]
        return f" or on ({on or self.by}) ".join(f"({e})" for e in exprs)

    def _moved(self, rt: RuntimeSpec, by: str, s: str) -> str | None:
        """How many times an engine's step-driven series changed over the stall range, rank
        by rank: the series its spec says move with its steps (``moves_with_steps``: never
        TensorRT-LLM's token counters, written when a request finishes) and the
        scheduler's gauges, each family tagged with its name (``changes`` drops it, and
        two families with the same labels would collide) and joined by ``or``, so one not
        yet written (a labelled counter before its first count) leaves the rest standing."""
        fields = [*sorted(rt.runtime.moves_with_steps), "running", "waiting", "kv_usage"]
        tagged: list[str] = []
        for field in dict.fromkeys(fields):
            for kind in ("counter", "gauge", "count"):
                for e in self._entries(field, kind, rt.name):
                    # Any label value moving is progress (every mode, every priority).
                    sel = _selector(e.name, self.matchers)
                    moved = f"{self.plan.changes}({sel}[{s}])"
                    one = f'label_replace({moved}, "{SERIES}", "{e.name}", "", "")'
                    if one not in tagged:
                        tagged.append(one)
        if not tagged:
            return None
        return runtime_reads(rt, f"sum by ({by}) ({' or '.join(tagged)})")

    def _runtime(self) -> FleetQuery | None:
        """Which engine each server and model is (by the first family of its running
        gauge), when the fleet shows another engine than vLLM: its row carries the
        engine's name as ``runtime``."""
        found = self.runtimes()
        if not found or [rt.name for rt in found] == ["vllm"]:
            return None
        exprs = []
        for rt in found:
            first = next(iter(self._entries("running", "gauge", rt.name)), None)
            if first is None:
                continue
            seen = runtime_reads(
                rt, f"count by ({self.by}) (last_over_time({self._selector(first)}[{self.w}]))"
            )
            exprs.append(f'label_replace({seen}, "runtime", "{rt.name}", "", "")')
        return self._query("runtime", f" or on ({self.by}) ".join(f"({e})" for e in exprs))

    def _engine_gauges(self) -> list[FleetQuery | None]:
        """The gauges another engine sizes its step and pool by: the last step's latency
        and the tokens per step over the scrapes with requests running (as the sidecar's
        window weighs them), and the KV pool's size from its gauges (SGLang's tokens,
        TensorRT-LLM's blocks and tokens per block)."""
        by, w, r = self.by, self.w, self.r
        running = self._each("running", "gauge", f"sum by ({by}) ({{s}})")
        out: list[FleetQuery | None] = []
        for field in ("step_seconds", "tokens_per_step"):
            v = self._each(field, "gauge", f"avg by ({by}) ({{s}})")
            if v is None or running is None:
                continue
            busy = f"avg_over_time((({v}) and on ({by}) (({running}) > 0))[{w}:{r}])"
            out.append(FleetQuery(f"{field}_busy_mean", busy))
        for field, agg in (
            ("pool_tokens", "sum"),
            ("pool_blocks", "sum"),
            ("pool_block_size", "max"),
        ):
            expr = self._each(field, "gauge", f"{agg} by ({by}) (last_over_time({{s}}[{w}]))")
            out.append(self._query(field, expr))
        return out

    def _balance(self) -> list[FleetQuery | None]:
        """Engine by engine: its window mean of waiting requests and of KV usage, as the
        sidecar's window has them (``core.engines``): the merged gauges read the same
        whether the load is spread evenly or one engine holds it all."""
        by = f"{self.by}, engine"
        return [
            self._query(
                f"engine_{field}_mean",
                self._each(
                    field, "gauge", f"{agg} by ({by}) (avg_over_time({{s}}[{self.w}]))", on=by
                ),
            )
            for field, agg in (("waiting", "sum"), ("kv_usage", "avg"))
        ]

    def _pool(self) -> FleetQuery | None:
        """``cache_config_info``: each engine's KV pool, per server (labels, not values)."""
        ident = ", ".join(self.plan.identity)
        by = ", ".join(dict.fromkeys((*self.plan.identity, *POOL_LABELS)))
        expr = self._each(
            "kv_pool", "info", f"count by ({by}) (last_over_time({{s}}[{self.w}]))", on=ident
        )
        return self._query("pool", expr)

    def _dcgm(self) -> Sequence[FleetQuery]:
        """Per pod (the DCGM side of the join): its cards and GPUs, its memory activity."""
        plan = self.plan
        if plan.dcgm_selector is None:
            return ()
        matchers = _joined(inner(plan.dcgm_selector), self.piece)
        join = ", ".join(plan.dcgm_join)
        gpus = _selector(plan.dcgm_gpu_metric, matchers)
        dram = _selector(plan.dcgm_dram_metric, matchers)
        cards = (
            f"count by ({join}, {DCGM_MODEL}) "
            f"(group by ({join}, {DCGM_MODEL}, {DCGM_UUID}) (last_over_time({gpus}[{self.w}])))"
        )
        activity = f"avg by ({join}) (avg_over_time({dram}[{self.w}]))"
        return (FleetQuery("dcgm_gpus", cards), FleetQuery("dcgm_dram", activity))
