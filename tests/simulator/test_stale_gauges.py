"""Mass aborts and stale gauges (vLLM #22545, #29928; daemon/vllm_triage/simulator/faults.py): the
running, waiting and KV gauges stop at their values while the engine serves on."""

from __future__ import annotations

import pytest

from vllm_triage.simulator import Arrival, Engine, llama_8b

from support.simscrape import fixture_scrapes, inline, load, scrapes, server

TIMES = (119.0, 120.0, 125.0, 200.0, 300.0, 420.0)
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
MOVING = (
    "vllm:generation_tokens_total",
    "vllm:inter_token_latency_seconds_count",
    "vllm:time_to_first_token_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
)


class TestAfterMassAborts:
    """stale_gauges_after_aborts.yaml: at 120 s every request is aborted and the gauges
    go stale; a light load is served from then on."""

    def test_the_gauges_stay_at_the_loaded_values(self) -> None:
        runs = fixture_scrapes("stale_gauges_after_aborts", TIMES)
        at_abort = [runs[1].value(g) for g in GAUGES]
        running, waiting, kv = at_abort
        assert running > 100 and waiting > 5 and kv > 0.9  # the picture
        for scrape in runs[2:]:
            assert [scrape.value(g) for g in GAUGES] == at_abort, scrape.t

    def test_tokens_and_itl_keep_moving_at_a_light_loads_rate(self) -> None:
        runs = fixture_scrapes("stale_gauges_after_aborts", TIMES)
        for name in MOVING:
            values = [s.value(name) for s in runs[2:]]
            assert values == sorted(set(values)), name  # strictly up
        loaded = (runs[1].value(MOVING[0]) - 0.0) / 120.0
        light = (runs[5].value(MOVING[0]) - runs[3].value(MOVING[0])) / 220.0
        assert light == pytest.approx(2.0 * 180, rel=0.2)  # 2 requests/s of 180 tokens
        assert light < loaded / 10  # what ~115 running requests would make, they don't

    def test_the_aborts_are_counted_as_aborts_and_nothing_else(self) -> None:
        before, at, after = fixture_scrapes("stale_gauges_after_aborts", TIMES)[:3]
        aborted = "vllm:request_success_total"
        assert before.value(aborted, finished_reason="abort") == 0
        gone = after.value(aborted, finished_reason="abort")
        # Everything that ran or waited as the phase began, less what finished in the
        # step then in flight (aborts wait for the step boundary).
        assert gone == pytest.approx(at.value(GAUGES[0]) + at.value(GAUGES[1]), abs=3)
        e2e = "vllm:e2e_request_latency_seconds_count"
        done = after.value(aborted, finished_reason="length")
        assert after.value(e2e) == done  # no aborted request in a per-request histogram
        assert at.value(aborted, finished_reason="abort") in (0, gone)

    def test_only_the_engine_named_goes_stale(self) -> None:
        sc = inline(
            {
                "name": "dp_stale",
                "server": server(data_parallel_size=2),
                "phases": [
                    {"duration_seconds": 60, "workload": load(arrival_rate_per_s=6.0)},
                    {
                        "duration_seconds": 240,
                        "engines": [{"rank": 1, "stale_gauges": True}],
                        "workload": load(arrival_rate_per_s=6.0, seed=1),
                    },
                ],
            }
        )
        runs = scrapes(sc, [60.0 + 10 * i for i in range(1, 25)])
        kv = [s.by_engine("vllm:kv_cache_usage_perc") for s in runs]
        assert len({k["1"] for k in kv}) == 1
        assert len({k["0"] for k in kv}) > 10
        tokens = [s.by_engine("vllm:generation_tokens_total")["1"] for s in runs]
        assert tokens == sorted(set(tokens))


class TestEngineAbort:
    SPEC = llama_8b(
        "NVIDIA H100 SXM",
        num_gpu_blocks=25000,
        max_num_batched_tokens=8192,
        max_model_len=32768,
        max_num_seqs=2,
    )

    def test_the_longest_waiting_go_first_and_their_blocks_come_back(self) -> None:
        engine = Engine(self.SPEC)
        for at in (0.0, 0.1, 0.2, 0.3):
            engine.submit(Arrival(at, 600, 2000))
        engine.advance_to(1.0)
        assert (engine.num_running, engine.num_waiting) == (2, 2)
        engine.abort(0.5)  # after the step in flight
        engine.advance_to(1.1)
        assert engine.stats.finished["abort"] == 2
        assert engine.num_running == 2  # the two that waited now run
        assert engine.num_waiting == 0
        assert engine.stats.ttft.count == 4  # the aborted two before, the others since
        assert engine.stats.e2e.count == 0
        assert engine.kv_usage == pytest.approx(2 * 38 / 25000, rel=0.2)
