"""The captured vLLM payloads (tests/fixtures/vllm), the seed article's ceiling table, and
a reference reader built on prometheus_client (the text format's reference parser) to hold
our fast parser to."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

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
