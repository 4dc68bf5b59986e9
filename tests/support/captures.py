"""The captured vLLM payloads (tests/fixtures/vllm), the seed article's ceiling table, and
a reference reader built on prometheus_client (the text format's reference parser) to hold
our fast parser to."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.core.runtime import GAUGE_MERGE, POOL_GAUGES, Family, RuntimeSpec

from support.parsing import SAMPLES
from support.paths import VLLM_CAPTURES

VLLM_FIXTURES = sorted(VLLM_CAPTURES.glob("*.txt"))

#: The seed article's table (docs/physics.md): an 8B model at 16 bits, tokens/s rounded.
SEED_CEILINGS = {
    "CPU, dual-channel DDR5-5600": 6,
    "NVIDIA A10G": 38,
    "NVIDIA L40S": 54,
    "NVIDIA RTX 4090": 63,
    "NVIDIA A100 80GB SXM": 127,
    "NVIDIA H100 SXM": 209,
}


def fixture_text(name: str) -> str:
    return (VLLM_CAPTURES / name).read_text(encoding="utf-8")


def reference_models(text: str) -> dict[str, dict[str, Any]]:
    """Per model, the field values prometheus_client's parse implies.

    Merged like the product merges them (engines summed; KV usage as mean and max;
    the newest naming wins), but read with prometheus_client, so comparing the two
    proves our reader sees exactly the values the reference parser sees.
    """
    accs: dict[tuple[str, str, str], dict[str, Any]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            hit = SAMPLES.get(sample.name)
            if hit is None or hit[1].kind in ("info", "state"):
                continue
            spec = hit[1]
            acc = accs[(sample.labels.get("model_name", ""), spec.field, spec.generation)]
            v = sample.value
            if spec.kind == "gauge":
                acc.setdefault("gauges", []).append(v)
            elif spec.kind == "bucket":
                buckets = acc.setdefault("buckets", {})
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + v
            else:
                acc[spec.kind] = acc.get(spec.kind, 0.0) + v
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for model in {m for m, _, _ in accs}:
        for field in {f for m, f, _ in accs if m == model}:
            gen = next(g for g in ("new", "both", "old") if (model, field, g) in accs)
            acc = accs[(model, field, gen)]
            if "gauges" in acc:
                values = acc["gauges"]
                if field == "kv_usage":
                    out[model]["kv_usage"] = sum(values) / len(values)
                    out[model]["kv_usage_max"] = max(values)
                else:
                    out[model][field] = sum(values)
            elif "buckets" in acc:
                if field == "iteration_tokens" and "count" in acc:
                    out[model]["iterations"] = acc["count"]  # engine steps (ModelSeries)
                if "count" not in acc or "sum" not in acc or math.inf not in acc["buckets"]:
                    continue  # a truncated histogram: the parser leaves it out too
                bounds = tuple(sorted(acc["buckets"]))
                out[model][field] = (
                    bounds,
                    tuple(acc["buckets"][b] for b in bounds),
                    acc["count"],
                    acc["sum"],
                )
            else:
                out[model][field] = acc["counter"]
    return dict(out)


def snapshot_models(snapshot: Any) -> dict[str, dict[str, Any]]:
    """The same shape as ``reference_models``, from a ``Snapshot``."""
    out: dict[str, dict[str, Any]] = {}
    for name, series in snapshot.models.items():
        fields: dict[str, Any] = {}
        for field in series.__dataclass_fields__:
            # Engine by engine and sleep states are no merged value: tested on their own.
            if field in ("model_name", "engines", "per_engine", "sleep"):
                continue
            value = getattr(series, field)
            if value is None:
                continue
            if hasattr(value, "bounds"):
                value = (value.bounds, value.cumulative, value.count, value.sum)
            fields[field] = value
        out[name] = fields
    return out


def _names(spec: RuntimeSpec) -> dict[str, list[tuple[Family, str]]]:
    """Each sample name of ``spec``'s first prefix -> the families (and their part) it
    may be, in the spec's order."""
    out: dict[str, list[tuple[Family, str]]] = defaultdict(list)
    for fam in spec.families:
        if fam.type in ("info", "state"):
            continue
        parts = (
            (("_bucket", "bucket"), ("_sum", "sum"), ("_count", "count"))
            if fam.type == "histogram"
            else (("", fam.type),)
        )
        for suffix, kind in parts:
            out[spec.prefixes[0] + fam.name + suffix].append((fam, kind))
    return out


def _merged(field: str, values: list[float]) -> float:
    how = GAUGE_MERGE[field]
    if how == "sum":
        return sum(values)
    if how == "max":
        return max(values)
    return sum(values) / len(values)


def reference_series(text: str, spec: RuntimeSpec, *, openmetrics: bool = False) -> dict[str, Any]:
    """Per model, the field values prometheus_client's parse implies for any runtime,
    read through ``spec``'s families as written (not the parser's compiled table): a
    sample counts when a family names it and its labels match; copies of one scheduler's
    series (``spec.copy_labels``) count once; gauges merge as the vocabulary says,
    counters and histograms add up; the newest naming wins. The same shape as
    ``snapshot_models``."""
    parse = om_families if openmetrics else text_string_to_metric_families
    names = _names(spec)
    accs: dict[tuple[str, str, str], dict[str, Any]] = defaultdict(dict)
    firsts: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, ...]] = {}
    for family in parse(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            matching = [
                (fam, kind)
                for fam, kind in names.get(sample.name, [])
                if all(labels.get(a, "") == b for a, b in fam.match)
            ]
            if not matching:
                continue
            if spec.copy_labels:
                rest = tuple(sorted((k, v) for k, v in labels.items() if k not in spec.copy_labels))
                which = tuple(labels.get(k, "") for k in spec.copy_labels)
                if firsts.setdefault((sample.name, rest), which) != which:
                    continue
            fam, kind = matching[0]
            acc = accs[(labels.get(spec.model_label, ""), fam.field, fam.generation)]
            if kind == "gauge":
                acc.setdefault("gauges", []).append(sample.value)
            elif kind == "bucket":
                buckets = acc.setdefault("buckets", {})
                le = float(labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            else:
                acc[kind] = acc.get(kind, 0.0) + sample.value
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for model, field in sorted({(m, f) for m, f, _ in accs}):
        gen = next(g for g in ("new", "both", "old") if (model, field, g) in accs)
        acc = accs[(model, field, gen)]
        if field in POOL_GAUGES:
            continue  # the snapshot's pool, not a model's field
        if "gauges" in acc:
            out[model][field] = _merged(field, acc["gauges"])
            if field == "kv_usage":
                out[model]["kv_usage_max"] = max(acc["gauges"])
        elif "buckets" in acc:
            if field == "iteration_tokens":
                out[model].setdefault("iterations", acc["count"])
            bounds = tuple(sorted(acc["buckets"]))
            counts = tuple(acc["buckets"][b] for b in bounds)
            out[model][field] = (bounds, counts, acc["count"], acc["sum"])
        else:
            out[model][field] = acc["counter"]
    return dict(out)
