"""Sleeping engines (daemon/vllm_triage/simulator/faults.py): ``vllm:engine_sleep_state`` with sleep
mode only, no steps while asleep, requests sent to a sleeper wait, waking resumes."""

from __future__ import annotations

import pytest

from vllm_triage.errors import ConfigError
from vllm_triage.simulator import SCENARIOS, Arrival, Engine, llama_8b

from support.simscrape import Scrape, fixture_scrapes, inline, load, scrapes, server

SLEEP = "vllm:engine_sleep_state"
ASLEEP_TIMES = (100.0, 200.0, 419.0, 425.0, 540.0)
IDLE_TIMES = (170.0, 200.0, 300.0, 479.0, 540.0)


def states(scrape: Scrape, engine: str) -> dict[str, float]:
    return {lab["sleep_state"]: v for lab, v in scrape.rows(SLEEP) if lab["engine"] == engine}


AWAKE = {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
LEVEL_1 = {"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0}
LEVEL_2 = {"awake": 0.0, "weights_offloaded": 0.0, "discard_all": 1.0}


class TestAsleepWithRequests:
    """dp_asleep_with_requests.yaml: engine 1 sleeps (level 1) from 120 s to 420 s."""

    def test_the_sleep_state_says_who_sleeps_at_which_level(self) -> None:
        awake, asleep, late, woken, _ = fixture_scrapes("dp_asleep_with_requests", ASLEEP_TIMES)
        assert awake.types[SLEEP] == "gauge"
        assert len(awake.rows(SLEEP)) == 6  # three states for each of two engines
        assert states(awake, "0") == states(awake, "1") == AWAKE
        for scrape in (asleep, late):
            assert states(scrape, "0") == AWAKE
            assert states(scrape, "1") == LEVEL_1
        assert states(woken, "1") == AWAKE

    def test_a_sleeping_engine_takes_no_steps_and_its_gauges_stay(self) -> None:
        _, asleep, late, _, _ = fixture_scrapes("dp_asleep_with_requests", ASLEEP_TIMES)
        for name in (
            "vllm:iteration_tokens_total_count",  # one per step
            "vllm:generation_tokens_total",
            "vllm:inter_token_latency_seconds_count",
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
        ):
            assert asleep.by_engine(name)["1"] == late.by_engine(name)["1"], name
        steps = "vllm:iteration_tokens_total_count"
        assert late.by_engine(steps)["0"] > asleep.by_engine(steps)["0"] + 1000

    def test_requests_sent_to_the_sleeper_wait_until_it_wakes(self) -> None:
        _, asleep, late, woken, after = fixture_scrapes("dp_asleep_with_requests", ASLEEP_TIMES)

        def taken(s: Scrape) -> float:  # the API server renders every request it takes
            return s.total("vllm:request_render_duration_seconds_count")

        def finished(s: Scrape) -> float:
            return s.total("vllm:e2e_request_latency_seconds_count")

        in_flight = taken(late) - finished(late)
        assert taken(late) - taken(asleep) == pytest.approx(3.0 * 219, rel=0.15)
        assert in_flight > 300  # sent to engine 1, not seen in its frozen gauges
        assert late.by_engine("vllm:num_requests_waiting")["1"] == 0
        assert woken.by_engine("vllm:num_requests_waiting")["1"] > 100  # the backlog shows
        gained = (
            after.by_engine("vllm:e2e_request_latency_seconds_count")["1"]
            - (late.by_engine("vllm:e2e_request_latency_seconds_count")["1"])
        )
        assert gained > in_flight
        assert taken(after) - finished(after) < 20  # drained


class TestIdleAsleep:
    """dp_idle_asleep.yaml: no requests from 120 s; both engines at level 2 from 180 s to
    480 s; traffic again from 480 s."""

    def test_level_2_is_discard_all_and_nothing_moves(self) -> None:
        idle, asleep, late, _, woken = fixture_scrapes("dp_idle_asleep", IDLE_TIMES)
        assert states(idle, "0") == states(idle, "1") == AWAKE
        for scrape in (asleep, late):
            assert states(scrape, "0") == states(scrape, "1") == LEVEL_2
            assert scrape.by_engine("vllm:num_requests_running") == {"0": 0.0, "1": 0.0}
            assert scrape.by_engine("vllm:num_requests_waiting") == {"0": 0.0, "1": 0.0}
        for name in ("vllm:generation_tokens_total", "vllm:iteration_tokens_total_count"):
            assert idle.by_engine(name) == late.by_engine(name), name
        assert states(woken, "0") == states(woken, "1") == AWAKE
        for engine, made in woken.by_engine("vllm:generation_tokens_total").items():
            assert made > late.by_engine("vllm:generation_tokens_total")[engine]


class TestEngineSleep:
    SPEC = llama_8b(
        "NVIDIA H100 SXM", num_gpu_blocks=25000, max_num_batched_tokens=8192, max_model_len=32768
    )

    def test_sleep_waits_for_the_step_in_flight_then_drops_the_kv_cache(self) -> None:
        engine = Engine(self.SPEC)
        engine.submit(Arrival(0.0, 600, 400))
        engine.advance_to(1.0)
        steps, running, kv = engine.stats.steps, engine.num_running, engine.kv_usage
        assert running == 1 and kv > 0
        engine.sleep(1)  # a step is in flight: it finishes first
        assert engine.sleep_level == 0
        engine.advance_to(30.0)
        assert engine.sleep_level == 1
        assert engine.stats.steps == steps + 1
        assert (engine.num_running, engine.kv_usage) == (running, kv)  # as last reported
        assert engine.published_load == (0, 1)
        engine.wake()
        engine.advance_to(60.0)
        assert engine.stats.finished["length"] == 1
        # The KV cache was dropped: the prompt and the tokens so far were computed again,
        # one prefill step more than a hang of the same length costs (which keeps it).
        hung = Engine(self.SPEC)
        hung.submit(Arrival(0.0, 600, 400))
        hung.advance_to(1.0)
        hung.hang()
        hung.advance_to(30.0)
        hung.resume()
        hung.advance_to(60.0)
        assert hung.stats.generation_tokens == engine.stats.generation_tokens == 400
        assert engine.stats.floor_s > hung.stats.floor_s + 0.01

    def test_without_sleep_mode_no_sleep_state_and_no_sleeping(self) -> None:
        (scrape,) = scrapes(SCENARIOS["healthy"], [30.0])
        assert SLEEP not in scrape.families()
        data = {
            "name": "no_sleep_mode",
            "server": server(data_parallel_size=2),
            "phases": [
                {
                    "duration_seconds": 60,
                    "engines": [{"rank": 1, "sleep_level": 1}],
                    "workload": load(),
                }
            ],
        }
        with pytest.raises(ConfigError, match=r"phases\[0\]\.engines\[0\]\.sleep_level"):
            inline(data)
