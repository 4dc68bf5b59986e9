"""Histogram arithmetic with Prometheus semantics: deltas across resets, and quantiles.

``bucket_quantile`` follows ``histogram_quantile`` for classic histograms
(prometheus/promql/quantile.go, ``bucketQuantile``): linear interpolation inside the
bucket that holds the rank, a lower bound of 0 for the first bucket when its bound is
positive, and the highest finite bound when the rank falls in the +Inf bucket. Unlike
PromQL it also says *where* the rank fell (``Quantile.position``), because "p99 is 80 s"
means something else when 80 s is simply vLLM's largest bucket.
"""

from __future__ import annotations

import math

from vllm_triage.core.model import Histogram, Quantile


def counter_delta(newer: float, older: float) -> float:
    """Increase of a counter between two scrapes; a decrease means the target restarted.

    After a restart the counter starts from zero, so the newer value *is* the increase
    since then (what PromQL's ``increase`` assumes too). Never negative.
    """
    return newer if newer < older else newer - older


def histogram_delta(newer: Histogram, older: Histogram) -> Histogram:
    """Observations made between two scrapes, bucket by bucket.

    A restarted target (its count, its sum or any bucket went down) or a changed bucket
    layout (an upgraded vLLM) means the older scrape is no baseline: the newer histogram
    then holds everything observed since the restart. (vLLM observes durations and token
    counts, never negative, so a live sum only grows; a fuzz test found a sum that fell
    while the count rose giving a negative mean.)
    """
    if newer.bounds != older.bounds or newer.count < older.count or newer.sum < older.sum:
        return newer
    cumulative = tuple(n - o for n, o in zip(newer.cumulative, older.cumulative, strict=True))
    if any(c < 0 for c in cumulative):
        return newer
    return Histogram(
        bounds=newer.bounds,
        cumulative=cumulative,
        count=newer.count - older.count,
        sum=newer.sum - older.sum,
    )


def histogram_add(a: Histogram, b: Histogram) -> Histogram:
    """Sum of two histograms with the same bounds (the caller checks them)."""
    return Histogram(
        bounds=a.bounds,
        cumulative=tuple(x + y for x, y in zip(a.cumulative, b.cumulative, strict=True)),
        count=a.count + b.count,
        sum=a.sum + b.sum,
    )


def observations(h: Histogram) -> float:
    """Observations in the buckets (the +Inf bucket), which quantiles are taken from."""
    return h.cumulative[-1]


def bucket_quantile(q: float, h: Histogram) -> Quantile | None:
    """The q-quantile of a (delta) histogram, or ``None`` when it has no observations.

    ``q`` must lie in [0, 1]; PromQL's out-of-range answers (-Inf, +Inf) are no use to a
    diagnosis, so this refuses them.
    """
    if not 0.0 <= q <= 1.0 or math.isnan(q):
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    bounds, cumulative = h.bounds, list(h.cumulative)
    # PromQL forces monotonicity (ensureMonotonic) before searching; so do we.
    for i in range(1, len(cumulative)):
        cumulative[i] = max(cumulative[i], cumulative[i - 1])
    if len(bounds) < 2:
        return None
    total = cumulative[-1]
    if total <= 0:
        return None
    rank = q * total
    b = next(i for i, c in enumerate([*cumulative[:-1], math.inf]) if c >= rank)
    if b == len(bounds) - 1:
        return Quantile(q=q, value=bounds[-2], position="above_last_bound")
    if b == 0 and bounds[0] <= 0:
        return Quantile(q=q, value=bounds[0], position="below_first_bound")
    start = 0.0
    count = cumulative[b]
    if b > 0:
        start = bounds[b - 1]
        count -= cumulative[b - 1]
        rank -= cumulative[b - 1]
    # An empty bucket can only hold rank 0 (q = 0); PromQL answers NaN there, we the start.
    value = start + (bounds[b] - start) * (rank / count) if count > 0 else start
    return Quantile(q=q, value=value, position="below_first_bound" if b == 0 else "interpolated")
