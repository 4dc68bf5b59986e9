"""The PromQL fleet mode sends each tick: a few instant queries in which Prometheus does
the windowing, grouped by server (the identity labels) and ``model_name``.

Each query is a union of tagged rows: every sub-expression is wrapped in
``label_replace(..., "vllm_triage_field", "<key>", "", "")``, so one answer carries many
signals and ``daemon/fleet_signals.py`` reads each row by its key. What the queries ask:

- the latency histograms' bucket increases over the window (``ttft``, ``itl``,
  ``iteration_tokens``), one query each, ``le`` kept: the quantiles are computed here
  from the bucket deltas (``daemon/core/histogram.py``), as the sidecar does, so they
  say where in the buckets they fell;
- every histogram's ``_sum`` and ``_count`` increases (means, observation counts) and the
  counters' increases (rates, speculative decoding);
- the gauges' mean, max and min over the window, their means over the moments requests
  were running (a subquery at the evaluation step), the samples and the engines;
- ``cache_config_info``'s pool size; and, with DCGM, each pod's card, GPU count and
  memory activity.

Every vLLM naming era is asked for: the alternatives for one field (the current name,
the V0 name, Ray Serve's prefix) are joined with ``or on (<server>, model_name)``, so a
server that exposes several gets the first, as the parser's "the newest naming wins".

To add a signal (a gauge, a progress age), add one row to ``GAUGES`` (its key and a
function of the metric selector giving its PromQL) and read its key in
``fleet_signals.totals``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from daemon.core.names import COUNTER_FIELDS, HISTOGRAM_FIELDS, PREFIXES, SAMPLES

#: The label every row carries to say which signal it is.
FIELD = "vllm_triage_field"
#: Histograms whose buckets are read (for quantiles and the roofline's step mix); the
#: others only need their sum and count.
BUCKET_FIELDS = ("ttft", "itl", "iteration_tokens")
#: Counters the signals read (``requests_finished`` is not one of them).
COUNTERS = tuple(c for c in COUNTER_FIELDS if c != "requests_finished")
DCGM_MODEL = "modelName"
DCGM_UUID = "UUID"
POOL_LABELS = ("engine", "block_size", "num_gpu_blocks")

_RANK = {"new": 0, "both": 1, "old": 2}


def names(field: str, kind: str) -> list[str]:
    """Every exposed name of one field and kind, in the parser's order of preference:
    ``vllm:`` before ``ray_vllm:``, the current naming before the old."""
    found = [
        (PREFIXES.index(prefix), _RANK[spec.generation], name)
        for name, (prefix, spec) in SAMPLES.items()
        if spec.field == field and spec.kind == kind
    ]
    return [name for *_, name in sorted(found)]


def duration(seconds: float) -> str:
    """A PromQL duration; milliseconds, because Prometheus 2 takes no decimal seconds."""
    return f"{round(seconds * 1000)}ms"


def _selector(name: str, matchers: str) -> str:
    return f"{name}{{{matchers}}}" if matchers else name


def tagged(key: str, expr: str) -> str:
    return f'label_replace({expr}, "{FIELD}", "{key}", "", "")'


@dataclass(frozen=True, slots=True)
class FleetQuery:
    """One instant query of a tick: ``name`` for logs and errors, ``promql`` to send."""

    name: str
    promql: str


#: (key, the gauge's field, PromQL of one server-and-model instant vector ``v`` and the
#: window's range ``w`` and step ``r``). ``v`` is already summed (running, waiting) or
#: averaged (KV usage) over a server's data-parallel engines.
GaugeRow = tuple[str, str, Callable[[str, str, str], str]]
GAUGES: tuple[GaugeRow, ...] = (
    ("running_max", "running", lambda v, w, r: f"max_over_time(({v})[{w}:{r}])"),
    ("waiting_max", "waiting", lambda v, w, r: f"max_over_time(({v})[{w}:{r}])"),
    ("waiting_min", "waiting", lambda v, w, r: f"min_over_time(({v})[{w}:{r}])"),
    ("running_busy_mean", "running", lambda v, w, r: f"avg_over_time((({v}) > 0)[{w}:{r}])"),
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

    @property
    def _matchers(self) -> str:
        return self.selector.strip().removeprefix("{").removesuffix("}").strip()

    @property
    def _by(self) -> str:
        return ", ".join(dict.fromkeys((*self.identity, "model_name")))

    def _first(self, exprs: Sequence[str], on: str | None = None) -> str:
        """The first alternative with series, per server and model."""
        joiner = f" or on ({on or self._by}) "
        return joiner.join(f"({e})" for e in exprs)

    def _each(self, field: str, kind: str, template: str, on: str | None = None) -> str:
        """``template`` (``{s}`` is a selector) over every name of a field, first wins."""
        sel = [_selector(n, self._matchers) for n in names(field, kind)]
        return self._first([template.format(s=s, by=self._by) for s in sel], on)

    def buckets(self, field: str) -> FleetQuery:
        w = duration(self.window_seconds)
        expr = self._each(field, "bucket", f"sum by ({{by}}, le) (increase({{s}}[{w}]))")
        return FleetQuery(f"{field}_buckets", tagged(f"{field}_bucket", expr))

    def totals(self) -> FleetQuery:
        """Histogram sums and counts, and counters: increases over the window."""
        w = duration(self.window_seconds)
        rows = []
        for field in HISTOGRAM_FIELDS:
            for part in ("sum", "count"):
                expr = self._each(field, part, f"sum by ({{by}}) (increase({{s}}[{w}]))")
                rows.append(tagged(f"{field}_{part}", expr))
        for field in COUNTERS:
            expr = self._each(field, "counter", f"sum by ({{by}}) (increase({{s}}[{w}]))")
            rows.append(tagged(field, expr))
        return FleetQuery("totals", " or ".join(rows))

    def _instant(self, field: str, agg: str) -> str:
        return self._each(field, "gauge", agg + " by ({by}) ({s})")

    def gauges(self) -> FleetQuery:
        """Means and maxima of the gauges, busy means, samples, engines and labels."""
        w, r = duration(self.window_seconds), duration(self.step_seconds)
        rows = [
            tagged(key, self._each(field, "gauge", f"{agg} by ({{by}}) ({fn}({{s}}[{w}]))"))
            for key, field, agg, fn in (
                ("running_mean", "running", "sum", "avg_over_time"),
                ("waiting_mean", "waiting", "sum", "avg_over_time"),
                ("kv_usage_mean", "kv_usage", "avg", "avg_over_time"),
                ("kv_usage_max", "kv_usage", "max", "max_over_time"),
                ("snapshots", "running", "max", "count_over_time"),
            )
        ]
        for key, field, expr in GAUGES:
            rows.append(tagged(key, expr(self._instant(field, "sum"), w, r)))
        running = self._instant("running", "sum")
        kv = self._instant("kv_usage", "avg")
        busy_kv = f"avg_over_time((({kv}) and on ({self._by}) (({running}) > 0))[{w}:{r}])"
        rows.append(tagged("kv_usage_busy_mean", busy_kv))
        # Engines, and the labels the hardware rules and the DCGM join read.
        by = ", ".join(dict.fromkeys((*self.identity, "model_name", *self.server_labels)))
        engines = self._first(
            [
                f"count by ({by}) (last_over_time({_selector(n, self._matchers)}[{w}]))"
                for n in names("running", "gauge")
            ]
        )
        rows.append(tagged("engines", engines))
        return FleetQuery("gauges", " or ".join(rows))

    def pool(self) -> FleetQuery:
        """``cache_config_info``: each engine's KV pool, per server (labels, not values)."""
        w = duration(self.window_seconds)
        ident = ", ".join(self.identity)
        by = ", ".join(dict.fromkeys((*self.identity, *POOL_LABELS)))
        exprs = [
            f"count by ({by}) (last_over_time({_selector(n, self._matchers)}[{w}]))"
            for n in names("kv_pool", "info")
        ]
        return FleetQuery("pool", tagged("pool", self._first(exprs, on=ident)))

    def dcgm(self) -> FleetQuery | None:
        """Per pod (the DCGM side of the join): the card, the GPUs, the memory activity."""
        if self.dcgm_selector is None:
            return None
        w = duration(self.window_seconds)
        matchers = self.dcgm_selector.strip().removeprefix("{").removesuffix("}").strip()
        join = ", ".join(self.dcgm_join)
        gpus = _selector(self.dcgm_gpu_metric, matchers)
        dram = _selector(self.dcgm_dram_metric, matchers)
        cards = (
            f"count by ({join}, {DCGM_MODEL}) "
            f"(group by ({join}, {DCGM_MODEL}, {DCGM_UUID}) (last_over_time({gpus}[{w}])))"
        )
        activity = f"avg by ({join}) (avg_over_time({dram}[{w}]))"
        return FleetQuery(
            "dcgm", tagged("dcgm_gpus", cards) + " or " + tagged("dcgm_dram", activity)
        )

    def queries(self) -> list[FleetQuery]:
        out = [self.buckets(f) for f in BUCKET_FIELDS]
        out += [self.totals(), self.gauges(), self.pool()]
        dcgm = self.dcgm()
        if dcgm is not None:
            out.append(dcgm)
        return out
