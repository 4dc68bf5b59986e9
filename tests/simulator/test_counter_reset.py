"""A counter reset inside the live process (daemon/vllm_triage/simulator/faults.py): every ``vllm:``
counter and histogram starts again from 0, ``_created`` moves to the reset, gauges and
the load go on as before."""

from __future__ import annotations

import pytest

from support.simscrape import START, fixture_scrapes, inline, load, scrapes, server

TIMES = (239.0, 240.0, 241.0, 480.0)
COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count",
    "vllm:iteration_tokens_total_count",
    "vllm:e2e_request_latency_seconds_sum",
)


def test_every_counter_and_histogram_restarts_from_zero() -> None:
    before, at, just_after, end = fixture_scrapes("counter_reset_in_process", TIMES)
    for name in COUNTERS:
        assert before.value(name) > 500, name
        assert at.value(name) < before.value(name) / 50, name
        assert just_after.value(name) < before.value(name) / 50, name
        # The same load after as before: the counters climb back at the same rate.
        assert end.value(name) == pytest.approx(before.value(name), rel=0.15), name
    success = sum(v for _, v in just_after.rows("vllm:request_success_total"))
    assert success < 10
    buckets = [v for _, v in just_after.rows("vllm:inter_token_latency_seconds_bucket")]
    assert buckets[-1] == just_after.value("vllm:inter_token_latency_seconds_count")


def test_created_moves_to_the_reset_and_gauges_do_not_reset() -> None:
    before, _, just_after, _ = fixture_scrapes("counter_reset_in_process", TIMES)
    created = "vllm:generation_tokens_created"
    assert before.value(created) == START
    assert just_after.value(created) == START + 240.0
    assert just_after.value("vllm:time_to_first_token_seconds_created") == START + 240.0
    # Requests in flight across the reset: still running, still holding their KV.
    assert just_after.value("vllm:num_requests_running") > 0
    assert just_after.value("vllm:kv_cache_usage_perc") > 0


def test_all_engines_and_the_render_histogram_reset_together() -> None:
    sc = inline(
        {
            "name": "dp_reset",
            "server": server(data_parallel_size=2, render_overhead_s=0.001),
            "phases": [
                {"duration_seconds": 60, "workload": load(arrival_rate_per_s=6.0)},
                {
                    "duration_seconds": 60,
                    "reset_counters": True,
                    "workload": load(arrival_rate_per_s=6.0, seed=1),
                },
            ],
        }
    )
    before, after = scrapes(sc, [59.0, 61.0])
    render = "vllm:request_render_duration_seconds_count"
    assert before.value(render) > 300
    assert after.value(render) < 30
    assert after.value("vllm:request_render_duration_seconds_created") == START + 60.0
    made = "vllm:generation_tokens_total"
    assert min(before.by_engine(made).values()) > 10_000
    assert max(after.by_engine(made).values()) < 1_000
