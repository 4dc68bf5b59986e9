"""Data-parallel balance: whether one engine carries the queue or the KV pressure.

The merged gauges (waiting summed, KV usage averaged over engines) read the same whether
the load is spread evenly or one engine holds it all, yet the fixes differ: an even queue
needs capacity, one engine's queue needs the balancer fixed (an external load balancer
that pins sessions to one rank, vLLM's own balancer routing on a stale load report). So
with two engines or more each engine's window mean is evidence, and an engine far above
the others is named; where its resource is the one the breach is about (waiting for
``queue_bound``, KV usage for ``kv_pressure``), the diagnosis says the imbalance explains
it and puts the balancer's fixes first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vllm_triage.core.model import Cause, EvidenceValue, Signals

#: An engine's queue is its own when it holds at least this many more requests than the
#: others' mean, and at least twice their mean (one request more is chance, not a
#: balancer).
WAITING_EXCESS = 2.0
WAITING_RATIO = 2.0
#: An engine's KV usage is far above the others' when it is at least this much higher (a
#: fraction of its pool) and its pool is at least half full.
KV_EXCESS = 0.25
KV_FLOOR = 0.5


@dataclass(frozen=True, slots=True)
class Imbalance:
    """One engine above the others on one resource."""

    resource: str  # "waiting" or "kv_usage"
    engine: str
    value: float
    others: float  # the other engines' mean
    engines: int

    @property
    def explains(self) -> Cause:
        return "queue_bound" if self.resource == "waiting" else "kv_pressure"

    def sentence(self) -> str:
        if self.resource == "waiting":
            what = f"{self.value:.1f} requests waiting against {self.others:.1f}"
        else:
            what = f"KV cache {self.value:.0%} full against {self.others:.0%}"
        return (
            f"engine {self.engine} of {self.engines} carries it: {what} on the other "
            "engines (the data-parallel load is uneven)"
        )


def balance_means(means: Mapping[str, float]) -> dict[str, float]:
    """Engines' window means as evidence, in label order: two engines or more, else none
    (one engine's mean is the merged value). The sidecar and fleet mode both use it."""
    return dict(sorted(means.items())) if len(means) >= 2 else {}


def _highest(means: Mapping[str, float]) -> tuple[str, float, float] | None:
    if len(means) < 2:
        return None
    engine = max(means, key=lambda e: (means[e], e))
    rest = [v for e, v in means.items() if e != engine]
    return engine, means[engine], sum(rest) / len(rest)


def imbalances(s: Signals) -> list[Imbalance]:
    """The engines far above the others, on the waiting queue and on KV usage."""
    out: list[Imbalance] = []
    top = _highest(s.engine_waiting_mean)
    if top is not None:
        engine, value, others = top
        if value - others >= WAITING_EXCESS and value >= WAITING_RATIO * others:
            out.append(Imbalance("waiting", engine, value, others, len(s.engine_waiting_mean)))
    top = _highest(s.engine_kv_usage_mean)
    if top is not None:
        engine, value, others = top
        if value >= KV_FLOOR and value - others >= KV_EXCESS:
            out.append(Imbalance("kv_usage", engine, value, others, len(s.engine_kv_usage_mean)))
    return out


def _listed(means: Mapping[str, float], digits: int) -> tuple[str, ...]:
    return tuple(f"{engine}: {round(value, digits):g}" for engine, value in means.items())


def engine_evidence(s: Signals) -> dict[str, EvidenceValue]:
    """Each engine's means, and the imbalance, when two engines or more are seen."""
    ev: dict[str, EvidenceValue] = {}
    if s.engine_waiting_mean:
        ev["engines_waiting_mean"] = _listed(s.engine_waiting_mean, 2)
    if s.engine_kv_usage_mean:
        ev["engines_kv_usage_mean"] = _listed(s.engine_kv_usage_mean, 3)
    found = imbalances(s)
    if found:
        ev["engine_imbalance"] = "; ".join(i.sentence() for i in found)
    return ev


def explaining(s: Signals, cause: Cause | None) -> Imbalance | None:
    """The imbalance on the resource ``cause`` is about, if there is one."""
    return next((i for i in imbalances(s) if i.explains == cause), None)
