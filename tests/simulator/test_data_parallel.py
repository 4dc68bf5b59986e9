"""Data-parallel engines behind one API server (daemon/vllm_triage/simulator/deployment.py,
frontend.py): every engine series labelled with its rank, one KV pool and set of caps per engine,
the least-loaded balancer, and one engine hung while the other serves."""

from __future__ import annotations

import pytest

from vllm_triage.core.parse import SnapshotParser
from vllm_triage.rules import runtime_table
from vllm_triage.simulator import SCENARIOS, Simulation
from vllm_triage.simulator.frontend import Balancer

from support.simscrape import LLAMA, Scrape, fixture, fixture_scrapes, inline, load, scrapes, server

#: vLLM's series that carry no ``engine`` label (the API server's, not an engine's).
UNLABELLED = {
    "vllm:request_render_duration_seconds",
    "vllm:admission_rejections",
    "vllm:lora_requests_info",
}
HEALTHY_TIMES = (120.0, 240.0)
HUNG_TIMES = (235.0, 300.0, 400.0, 539.0, 541.0, 660.0)


def engine_series(scrape: Scrape) -> dict[str, set[str]]:
    """Each ``vllm:`` family's ``engine`` label values (families without one left out)."""
    out: dict[str, set[str]] = {}
    for (name, labels), _ in scrape.samples.items():
        family = next(f for f in scrape.types if name == f or name.startswith(f + "_"))
        if family.startswith("vllm:") and family not in UNLABELLED:
            engines = out.setdefault(family, set())
            engines.add(dict(labels).get("engine", "<none>"))
    return out


class TestLabels:
    def test_every_engine_series_carries_its_rank(self) -> None:
        scrape = fixture_scrapes("dp_healthy", HEALTHY_TIMES)[0]
        families = engine_series(scrape)
        assert len(families) == 17  # gauges, counters (with _created), histograms, config
        assert {
            "vllm:num_requests_running",
            "vllm:request_success",
            "vllm:cache_config_info",
        } <= set(families)
        for family, engines in families.items():
            assert engines == {"0", "1"}, family
        pools = scrape.rows("vllm:cache_config_info")
        assert sorted(lab["engine"] for lab, _ in pools) == ["0", "1"]

    def test_four_engines_are_ranks_0_to_3(self) -> None:
        sc = inline(
            {
                "name": "dp4",
                "server": server(data_parallel_size=4),
                "phases": [{"duration_seconds": 60, "workload": load(arrival_rate_per_s=12.0)}],
            }
        )
        (scrape,) = scrapes(sc, [60.0])
        made = scrape.by_engine("vllm:generation_tokens_total")
        assert sorted(made) == ["0", "1", "2", "3"]
        assert all(v > 0 for v in made.values())

    def test_one_engine_renders_as_before_without_sleep_or_render_series(self) -> None:
        (scrape,) = scrapes(SCENARIOS["healthy"], [60.0])
        assert engine_series(scrape)["vllm:num_requests_running"] == {"0"}
        assert "vllm:engine_sleep_state" not in scrape.families()
        assert "vllm:request_render_duration_seconds" not in scrape.families()

    def test_the_daemons_parser_reads_two_engines_as_one_model(self) -> None:
        scrape = fixture_scrapes("dp_healthy", HEALTHY_TIMES)[1]
        snap = SnapshotParser(runtime_table()).parse_bytes(scrape.text.encode(), at=240.0)
        assert snap.problems == ()
        model = snap.models[LLAMA]
        assert model.engines == 2
        assert model.ttft is not None
        assert model.ttft.count == scrape.total("vllm:time_to_first_token_seconds_count")


class TestBalancing:
    def test_each_engine_serves_about_half(self) -> None:
        scrape = fixture_scrapes("dp_healthy", HEALTHY_TIMES)[1]
        done = scrape.by_engine("vllm:e2e_request_latency_seconds_count")
        total = sum(done.values())
        assert total == pytest.approx(6.0 * 240, rel=0.1)
        for count in done.values():
            assert count == pytest.approx(total / 2, rel=0.15)

    def test_each_engine_has_its_own_seats_and_queue(self) -> None:
        """A burst of 12 on two engines of 4 seats: 4 run and 2 wait on each."""
        sc = inline(
            {
                "name": "dp_seats",
                "server": server(data_parallel_size=2, max_num_seqs=4),
                "phases": [
                    {
                        "duration_seconds": 60,
                        "workload": load(arrival_rate_per_s=0.0, burst=12, output_tokens=2000),
                    }
                ],
            }
        )
        (scrape,) = scrapes(sc, [1.0])
        assert scrape.by_engine("vllm:num_requests_running") == {"0": 4.0, "1": 4.0}
        assert scrape.by_engine("vllm:num_requests_waiting") == {"0": 2.0, "1": 2.0}

    def test_least_loaded_wins_and_ties_go_to_the_lowest_rank(self) -> None:
        balancer = Balancer(3)
        assert [balancer.choose() for _ in range(3)] == [0, 1, 2]  # all 0: ties, then +4 each
        balancer.publish(0.1, [(0, 3), (0, 1), (1, 0)])  # scores 3, 1, 4
        assert balancer.choose() == 1  # 1 -> 5
        assert balancer.choose() == 0  # 3 -> 7
        assert balancer.choose() == 2  # 4 -> 8

    def test_a_stale_view_is_refreshed_only_when_counts_change_or_after_5_s(self) -> None:
        balancer = Balancer(2)
        balancer.publish(0.1, [(0, 0), (0, 0)])  # unchanged: the local counts stay
        assert balancer.due(0.15) is None
        assert balancer.choose() == 0
        assert balancer.choose() == 1
        assert balancer.choose() == 0  # 0 has 2 sent, 1 has 1: (8, 4)
        balancer.publish(0.2, [(0, 0), (0, 0)])
        assert balancer.choose() == 1
        balancer.publish(5.1, [(0, 0), (0, 0)])  # quiet for 5 s: sent again, counts reset
        assert balancer.choose() == 0

    def test_splitting_statically_and_data_parallel_do_not_combine(self) -> None:
        with pytest.raises(ValueError, match="data_parallel_size"):
            Simulation(fixture("dp_healthy"), engines=2)


class TestOneEngineHung:
    """dp_one_engine_hung.yaml: engine 1 hangs from 240 s to 540 s."""

    def test_the_hung_engines_series_freeze_while_the_other_advances(self) -> None:
        before, start, mid, end = fixture_scrapes("dp_one_engine_hung", HUNG_TIMES)[:4]
        moving = (
            "vllm:generation_tokens_total",
            "vllm:prompt_tokens_total",
            "vllm:inter_token_latency_seconds_count",
            "vllm:iteration_tokens_total_count",
            "vllm:e2e_request_latency_seconds_count",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
        )
        for name in moving:
            frozen = [s.by_engine(name)["1"] for s in (start, mid, end)]
            assert frozen == [frozen[0]] * 3, name
        for name in moving[:5]:
            served = [s.by_engine(name)["0"] for s in (before, start, mid, end)]
            assert served == sorted(set(served)), name  # strictly up
        assert start.by_engine("vllm:num_requests_running")["1"] > 0  # hung with work

    def test_requests_are_still_sent_to_it_and_wait_until_it_resumes(self) -> None:
        end, resumed, after = fixture_scrapes("dp_one_engine_hung", HUNG_TIMES)[3:]
        assert end.by_engine("vllm:num_requests_waiting")["1"] == 0  # frozen: they are unseen
        assert resumed.by_engine("vllm:num_requests_waiting")["1"] > 300
        ttft_1 = after.by_engine("vllm:time_to_first_token_seconds_sum")["1"]
        ttft_0 = after.by_engine("vllm:time_to_first_token_seconds_sum")["0"]
        assert ttft_1 > 100 * ttft_0  # minutes of waiting land in its histogram
        assert (
            after.by_engine("vllm:generation_tokens_total")["1"]
            > end.by_engine("vllm:generation_tokens_total")["1"]
        )
