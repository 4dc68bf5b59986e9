"""The API server's render time (daemon/vllm_triage/simulator/frontend.py): TTFT = render + queue +
prefill, render time grows with prompt length and load and shrinks with more API-server
processes, and ``vllm:request_render_duration_seconds`` carries no engine label."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from vllm_triage.simulator import Arrival, ServerSpec, Simulation, Workload, llama_8b
from vllm_triage.simulator.frontend import rendered

from support.simscrape import LLAMA, Scrape, fixture, fixture_scrapes, inline, load, scrapes, server

RENDER = "vllm:request_render_duration_seconds"
TTFT = "vllm:time_to_first_token_seconds"
QUEUE = "vllm:request_queue_time_seconds"
PREFILL = "vllm:request_prefill_time_seconds"
#: render_bound.yaml: 3 requests/s to 120 s, 6.4 to 420 s, 3 to 540 s.
TIMES = (20.0, 120.0, 170.0, 420.0, 540.0)


def mean(a: Scrape, b: Scrape, name: str) -> float:
    """The mean observation of histogram ``name`` between two scrapes."""
    count = b.total(f"{name}_count") - a.total(f"{name}_count")
    return (b.total(f"{name}_sum") - a.total(f"{name}_sum")) / count


def render_scenario(processes: int = 1, **workload: Any) -> dict[str, Any]:
    return {
        "name": "render",
        "server": server(
            api_server_count=processes, render_overhead_s=0.12, render_s_per_token=0.00002
        ),
        "phases": [{"duration_seconds": 300, "workload": load(**workload)}],
    }


class TestSeries:
    def test_one_histogram_per_request_type_without_an_engine_label(self) -> None:
        scrape = fixture_scrapes("render_bound", TIMES)[1]
        assert scrape.types[RENDER] == "histogram"
        rows = scrape.rows(f"{RENDER}_count")
        assert [lab for lab, _ in rows] == [{"model_name": LLAMA, "request_type": "chat"}]
        bounds = [lab["le"] for lab, _ in scrape.rows(f"{RENDER}_bucket")]
        assert bounds[0] == "0.0001" and bounds[-2:] == ["10.0", "+Inf"] and len(bounds) == 17
        # Every request the engine got was rendered first: finished, running or waiting.
        taken = sum(
            scrape.value(name)
            for name in (
                "vllm:e2e_request_latency_seconds_count",
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
            )
        )
        assert scrape.value(f"{RENDER}_count") == taken

    def test_completion_requests_get_their_own_series_at_their_first_render(self) -> None:
        data = render_scenario(request_type="completion", arrival_rate_per_s=1.0)
        (before, after) = scrapes(inline(data), [0.0, 60.0])
        assert RENDER not in before.families()  # created lazily, as vLLM does
        (row,) = after.rows(f"{RENDER}_count")
        assert row[0]["request_type"] == "completion"


class TestTtft:
    def test_ttft_is_render_plus_queue_plus_prefill_request_by_request(self) -> None:
        sim = Simulation(fixture("render_bound"), keep_records=True)
        sim.advance_to(540.0)
        ((_, engine),) = sim.engines
        assert len(engine.records) > 2000
        for r in engine.records:
            assert r.render_s >= 0.12
            assert r.ttft_s == pytest.approx(r.render_s + r.queue_s + r.prefill_s, abs=1e-9)

    def test_under_load_ttft_is_mostly_render(self) -> None:
        _, _, start, end, _ = fixture_scrapes("render_bound", TIMES)
        render, ttft = mean(start, end, RENDER), mean(start, end, TTFT)
        assert render > 0.5  # ~1 s: the single process is ~96 % busy
        assert ttft == pytest.approx(
            render + mean(start, end, QUEUE) + mean(start, end, PREFILL), rel=0.1
        )
        assert mean(start, end, QUEUE) < 0.01  # nothing waits in the engine
        assert ttft - render < 0.15


class TestRenderTime:
    def test_grows_with_the_prompt(self) -> None:
        # 0.3 requests/s: (almost) no one waits for the process; the cost is the render.
        slow = {"arrival_rate_per_s": 0.3}
        short = scrapes(
            inline(render_scenario(prompt_tokens=500, spread=0.0, **slow)), [0.0, 300.0]
        )
        long = scrapes(
            inline(render_scenario(prompt_tokens=4000, spread=0.0, **slow)), [0.0, 300.0]
        )
        assert mean(*short, RENDER) == pytest.approx(0.12 + 500 * 0.00002, rel=0.05)
        assert mean(*long, RENDER) == pytest.approx(0.12 + 4000 * 0.00002, rel=0.05)

    def test_grows_with_load(self) -> None:
        low_start, low_end, high_start, high_end, _ = fixture_scrapes("render_bound", TIMES)
        low = mean(low_start, low_end, RENDER)
        assert low == pytest.approx(0.2, rel=0.25)
        assert mean(high_start, high_end, RENDER) > 3 * low

    def test_shrinks_with_more_api_servers(self) -> None:
        busy = {"arrival_rate_per_s": 6.4, "prompt_tokens": 1500, "output_tokens": 150}
        one = scrapes(inline(render_scenario(1, **busy)), [60.0, 300.0])
        two = scrapes(inline(render_scenario(2, **busy)), [60.0, 300.0])
        four = scrapes(inline(render_scenario(4, **busy)), [60.0, 300.0])
        assert mean(*two, RENDER) < mean(*one, RENDER) / 3
        assert mean(*four, RENDER) < mean(*two, RENDER)
        assert mean(*four, RENDER) == pytest.approx(0.15, rel=0.1)  # the render alone
        assert mean(*two, TTFT) < mean(*one, TTFT) / 3


class TestQueue:
    SPEC = llama_8b(
        "NVIDIA H100 SXM", num_gpu_blocks=25000, max_num_batched_tokens=8192, max_model_len=32768
    )

    def clients(self, *prompts: tuple[float, int]) -> list[tuple[Arrival, ServerSpec]]:
        spec = dataclasses.replace(self.SPEC, render_s_per_token=0.001)
        return [(Arrival(at, p, 10), spec) for at, p in prompts]

    def test_one_process_renders_in_turn(self) -> None:
        out = list(rendered(self.clients((0.0, 1000), (0.1, 100)), 1))
        assert [(a.sent_s, a.at_s) for a in out] == [(0.0, 1.0), (0.1, pytest.approx(1.1))]

    def test_two_processes_let_a_short_render_pass_a_long_one(self) -> None:
        out = list(rendered(self.clients((0.0, 1000), (0.1, 100)), 2))
        assert [a.prompt_tokens for a in out] == [100, 1000]
        assert [a.at_s for a in out] == [pytest.approx(0.2), 1.0]

    def test_workload_request_type_reaches_the_arrival(self) -> None:
        (arrival,) = Workload(burst=1, request_type="completion").arrivals(0.0, 1.0)
        assert arrival.request_type == "completion"
