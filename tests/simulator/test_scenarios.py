"""Each preset shows the signature of its cause (tests for
daemon/vllm_triage/simulator/scenarios.py).

The statistics are computed here from the scraped text alone, as the daemon will:
percentiles from bucket deltas with Prometheus ``histogram_quantile`` semantics, gauges as
mean and max of the samples in the window, counters as deltas (docs/physics.md, "Signals,
windows and percentiles").
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import cache

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.simulator import SCENARIOS, get_scenario, record

START = 1_800_000_000.0
INTERVAL = 15.0

Samples = dict[str, list[tuple[dict[str, str], float]]]


@dataclass(frozen=True)
class Scrape:
    t: float  # seconds since the scenario started
    samples: Samples

    def gauge(self, name: str) -> float:
        return sum(v for _, v in self.samples.get(name, []))

    def buckets(self, histogram: str) -> dict[float, float]:
        """Cumulative count per ``le``, summed over every series (engines, models)."""
        out: dict[float, float] = {}
        for labels, value in self.samples.get(f"{histogram}_bucket", []):
            le = float(labels["le"])
            out[le] = out.get(le, 0.0) + value
        return out


@cache
def scrapes(name: str, duration_s: float) -> tuple[Scrape, ...]:
    out: list[Scrape] = []
    for at, text in record(
        get_scenario(name), start_at=START, interval_s=INTERVAL, duration_s=duration_s
    ):
        samples: Samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((s.labels, s.value))
        out.append(Scrape(at - START, samples))
    return tuple(out)


def quantile(q: float, cumulative: dict[float, float]) -> float:
    """Prometheus ``histogram_quantile`` over cumulative buckets."""
    bounds = sorted(cumulative)
    total = cumulative[math.inf]
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = cumulative[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


@dataclass(frozen=True)
class Window:
    """What the daemon would compute over (t0, t1]."""

    first: Scrape
    last: Scrape
    inside: tuple[Scrape, ...]

    def p99(self, histogram: str) -> float:
        return self.quantile(0.99, histogram)

    def quantile(self, q: float, histogram: str) -> float:
        start, end = self.first.buckets(histogram), self.last.buckets(histogram)
        return quantile(q, {le: end[le] - start.get(le, 0.0) for le in end})

    def delta(self, name: str) -> float:
        return self.last.gauge(name) - self.first.gauge(name)

    def mean(self, name: str) -> float:
        return sum(s.gauge(name) for s in self.inside) / len(self.inside)

    def max(self, name: str) -> float:
        return max(s.gauge(name) for s in self.inside)


def window(name: str, t0: float, t1: float, duration_s: float = 300.0) -> Window:
    all_ = scrapes(name, duration_s)
    inside = tuple(s for s in all_ if t0 < s.t <= t1)
    first = next(s for s in all_ if s.t == t0)
    return Window(first, inside[-1], inside)


TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
WAITING = "vllm:num_requests_waiting"
KV = "vllm:kv_cache_usage_perc"
QUEUE_SUM = "vllm:request_queue_time_seconds_sum"
PREFILL_SUM = "vllm:request_prefill_time_seconds_sum"
DECODE_SUM = "vllm:request_decode_time_seconds_sum"
TTFT_SUM = f"{TTFT}_sum"
TTFT_COUNT = f"{TTFT}_count"
PREEMPTIONS = "vllm:num_preemptions_total"


def test_healthy_meets_every_slo() -> None:
    """Light traffic on an H100: TTFT and ITL far inside the SLOs, no queue, KV nearly empty."""
    for t0 in (0.0, 120.0, 240.0):
        w = window("healthy", t0, t0 + 60.0)
        assert w.p99(TTFT) < 0.5
        assert w.p99(ITL) < 0.05
        assert w.max(WAITING) == 0
        assert w.max(KV) < 0.1
        assert w.delta(TTFT_COUNT) > 100


def test_prefill_bound_is_slow_ttft_with_an_empty_queue() -> None:
    """Long prompts: TTFT p99 well over 2 s, yet almost nothing waits and prefill dominates."""
    w = window("prefill_bound", 60.0, 300.0)
    assert w.p99(TTFT) > 2.0
    assert w.mean(WAITING) < 0.5
    assert w.max(KV) < 0.5
    assert w.delta(PREFILL_SUM) > 2 * w.delta(QUEUE_SUM)
    assert w.delta(PREEMPTIONS) == 0


def test_decode_bound_is_slow_itl_at_the_bandwidth_ceiling() -> None:
    """CPU row of the seed table: ~6 tokens/s per stream, no queue, TTFT still under 1 s."""
    w = window("decode_bound", 60.0, 300.0)
    assert w.p99(ITL) > 0.15
    assert w.max(WAITING) == 0
    assert w.max(KV) < 0.2
    assert w.p99(TTFT) < 1.0
    ceiling = SCENARIOS["decode_bound"].spec.decode_ceiling_tokens_per_s
    mean_itl = w.delta(f"{ITL}_sum") / w.delta(f"{ITL}_count")
    assert 0.85 < (1 / mean_itl) / ceiling < 1.0


def test_queue_bound_waits_with_kv_to_spare() -> None:
    """More arrivals than max_num_seqs can serve: a growing queue, KV low, TTFT is queue time."""
    w = window("queue_bound", 60.0, 300.0)
    assert w.mean(WAITING) > 50
    assert w.last.gauge(WAITING) > w.first.gauge(WAITING)
    assert w.max(KV) < 0.5
    assert w.p99(TTFT) > 2.0
    assert w.delta(QUEUE_SUM) > 0.8 * w.delta(TTFT_SUM)
    assert w.p99(ITL) < 0.1


def test_kv_pressure_fills_the_pool_queues_and_preempts() -> None:
    """Long contexts in a small pool: KV near 1, requests waiting, preemptions every minute."""
    for t0 in (60.0, 120.0, 180.0, 240.0):
        w = window("kv_pressure", t0, t0 + 60.0)
        assert w.mean(KV) > 0.9
        assert w.mean(WAITING) > 0
        assert w.delta(PREEMPTIONS) > 0


@pytest.mark.parametrize(
    ("start", "cause"),
    [
        (60.0, "prefill_bound"),
        (255.0, "decode_bound"),
        (450.0, "queue_bound"),
        (645.0, "kv_pressure"),
    ],
    ids=["prefill", "decode", "queue", "kv"],
)
def test_tour_walks_through_each_cause_and_recovers(start: float, cause: str) -> None:
    """One H100 throughout: each 90 s fault shows its signature in its last minute, and
    the healthy time after it heals (rules/scenarios/tour.yaml has the arithmetic)."""
    total = SCENARIOS["tour"].duration_s
    fault = window("tour", start + 30.0, start + 90.0, total)
    itl_slo = SCENARIOS["tour"].slo["itl_p99_seconds"]
    signature = {
        "prefill_bound": fault.p99(TTFT) > 2.0 and fault.mean(WAITING) < 1,
        # Every token slow (p50 too: not prefill spikes), nothing waiting, decode's time.
        "decode_bound": fault.p99(ITL) > itl_slo
        and fault.quantile(0.5, ITL) > 0.01
        and fault.max(WAITING) == 0
        and fault.delta(PREFILL_SUM) < fault.delta(DECODE_SUM),
        "queue_bound": fault.mean(WAITING) > 20 and fault.max(KV) < 0.5,
        "kv_pressure": fault.mean(KV) > 0.9 and fault.delta(PREEMPTIONS) > 0,
    }
    assert signature[cause]
    assert [k for k, v in signature.items() if v] == [cause]
    assert SCENARIOS["tour"].phase_at(start).expect == cause
    healed = window("tour", start + 150.0, start + 195.0, total)
    assert healed.max(WAITING) == 0
    assert healed.max(KV) < 0.1
    assert healed.p99(ITL) < itl_slo


def test_the_tour_never_changes_its_server() -> None:
    """A real server does not swap its card: no phase of the tour brings its own."""
    assert all(p.spec is None for p in SCENARIOS["tour"].phases)


def test_a_hung_engine_serves_the_same_metrics_until_it_resumes() -> None:
    """The stalled scenario hangs from 240 s to 540 s: every scrape of the hang after
    its first is byte for byte the same (frozen gauges, flat counters, no observation),
    and once the engine resumes the counters move again."""
    scraped = dict(record("stalled", start_at=START, interval_s=15.0, duration_s=600.0))
    hung = [scraped[START + t] for t in range(255, 540, 15)]
    assert len(hung) == 19 and all(body == hung[0] for body in hung)
    assert "vllm:num_requests_running" in hung[0]
    assert scraped[START + 240] != hung[0] or scraped[START + 225] != hung[0]
    assert scraped[START + 555] != hung[0]
    running = scrapes("stalled", 600.0)[20].gauge("vllm:num_requests_running")
    assert running > 0  # work is outstanding while nothing moves


def test_ten_minutes_of_tour_take_seconds_not_minutes() -> None:
    """Virtual time: 600 simulated seconds, scraped every 15 s, without waiting for them.
    The bound is a guard against falling back to real time or a runaway loop, not a speed
    goal (``make bench`` measures speed): the tour's busiest phase steps ~120 streams."""
    started = time.process_time()
    scraped = list(record("tour", start_at=START, interval_s=15.0, duration_s=600.0))
    assert len(scraped) == 41
    assert time.process_time() - started < 60.0


def test_every_scenario_is_named_and_runs_from_t0() -> None:
    assert set(SCENARIOS) == {
        "healthy",
        "prefill_bound",
        "decode_bound",
        "queue_bound",
        "kv_pressure",
        "stalled",
        "tour",
    }
    for name, sc in SCENARIOS.items():
        assert sc.name == name
        assert sc.duration_s >= 600.0
