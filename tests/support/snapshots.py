"""Hand-made snapshots for unit tests: a model's cumulative series at a given time."""

from __future__ import annotations

import math
from itertools import accumulate
from typing import Any

from vllm_triage.core.model import Histogram, KVPool, ModelSeries, Snapshot

TTFT_BOUNDS = (0.02, 0.04, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, math.inf)


def hist(
    per_bucket: list[float], bounds: tuple[float, ...] = TTFT_BOUNDS, total: float = 0.0
) -> Histogram:
    """A cumulative histogram from per-bucket counts (not cumulative)."""
    cumulative = tuple(float(c) for c in accumulate(per_bucket))
    return Histogram(bounds=bounds, cumulative=cumulative, count=cumulative[-1], sum=total)


def snap(at: float, model: str = "m", pool: KVPool | None = None, **fields: Any) -> Snapshot:
    return Snapshot(
        at=at,
        era="v1",
        prefix="vllm:",
        models={model: ModelSeries(model_name=model, **fields)},
        kv_pool=pool,
    )
