"""The scenario-file keys of a deployed server (daemon/vllm_triage/simulator/scenario_files.py):
strict like the rest, errors naming the key, and the test scenarios that use them."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_triage.errors import ConfigError
from vllm_triage.simulator import EnginePhase, Phase

from support.simscrape import SCENARIOS, fixture, inline, load, server

NEW_FIXTURES = (
    "dp_healthy",
    "dp_one_engine_hung",
    "dp_asleep_with_requests",
    "dp_idle_asleep",
    "stale_gauges_after_aborts",
    "render_bound",
    "counter_reset_in_process",
)


def two_phases(first: dict[str, Any], **scenario: Any) -> dict[str, Any]:
    return {
        "name": "keys",
        "server": server(data_parallel_size=2, enable_sleep_mode=True),
        "phases": [
            {"duration_seconds": 60, "workload": load(), **first},
            {"duration_seconds": 60, "workload": load()},
        ],
        **scenario,
    }


def test_the_keys_reach_the_spec_and_the_phases() -> None:
    sc = inline(
        two_phases(
            {
                "reset_counters": True,
                "engines": [
                    {"rank": 1, "sleep_level": 2},
                    {"rank": 0, "abort_fraction": 0.5, "stale_gauges": True, "hang": True},
                ],
            },
            server=server(
                data_parallel_size=2,
                enable_sleep_mode=True,
                api_server_count=3,
                render_overhead_s=0.01,
                render_s_per_token=0.0001,
            ),
        )
    )
    spec = sc.spec
    assert (spec.data_parallel_size, spec.api_server_count, spec.enable_sleep_mode) == (2, 3, True)
    assert spec.render_s(100) == pytest.approx(0.02)
    first, second = sc.phases
    assert first.reset_counters and not second.reset_counters
    assert first.engine(1) == EnginePhase(1, sleep_level=2)
    assert first.engine(0) == EnginePhase(0, hang=True, abort_fraction=0.5, stale_gauges=True)
    assert second.engine(1) == EnginePhase(1)


def test_a_phase_wide_hang_hangs_every_engine() -> None:
    sc = inline(two_phases({"hang": True}))
    assert all(sc.phases[0].engine(rank).hang for rank in (0, 1))


@pytest.mark.parametrize(
    ("first", "key"),
    [
        ({"engines": [{"rank": 2, "hang": True}]}, r"phases\[0\]\.engines\[0\]\.rank"),
        ({"engines": [{"rank": 0}, {"rank": 0}]}, r"phases\[0\]\.engines\[1\]\.rank"),
        ({"engines": [{"rank": 0, "sleep_level": 3}]}, r"engines\[0\]\.sleep_level"),
        ({"engines": [{"rank": 0, "abort_fraction": 1.5}]}, r"engines\[0\]\.abort_fraction"),
        ({"engines": [{"rank": 0, "asleep": True}]}, r"engines\[0\]\.asleep"),
        ({"engines": [{"hang": True}]}, r"engines\[0\]\.rank"),
        ({"server": {"data_parallel_size": 4}}, r"phases\[0\]\.server\.data_parallel_size"),
        ({"server": {"api_server_count": 2}}, r"phases\[0\]\.server\.api_server_count"),
        ({"reset_counters": "yes"}, r"phases\[0\]\.reset_counters"),
        ({"workload": load(request_type="embed")}, r"phases\[0\]\.workload\.request_type"),
    ],
    ids=[
        "rank-not-below-data-parallel-size",
        "rank-listed-twice",
        "sleep-level-3",
        "abort-fraction-over-1",
        "unknown-key-asleep",
        "engine-without-rank",
        "phase-changes-data-parallel-size",
        "phase-changes-api-server-count",
        "reset-counters-not-a-bool",
        "request-type-embed",
    ],
)
def test_mistakes_are_refused_naming_the_key(first: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        inline(two_phases(first))


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"data_parallel_size": 0}, r"server\.data_parallel_size"),
        ({"render_overhead_s": -0.1}, r"server\.render_overhead_s"),
        ({"enable_sleep_mode": "true"}, r"server\.enable_sleep_mode"),
    ],
    ids=["data-parallel-size-0", "negative-render-overhead", "sleep-mode-a-string"],
)
def test_server_mistakes_are_refused_naming_the_key(change: dict[str, Any], key: str) -> None:
    data = two_phases({})
    data["server"] = {**data["server"], **change}
    with pytest.raises(ConfigError, match=key):
        inline(data)


def test_the_dataclasses_refuse_what_one_server_cannot_do() -> None:
    sc = fixture("dp_healthy")
    with pytest.raises(ValueError, match="rank 2"):
        type(sc)(sc.name, sc.spec, (Phase(60.0, sc.phases[0].workload, engines=(EnginePhase(2),)),))
    with pytest.raises(ValueError, match="once"):
        Phase(60.0, sc.phases[0].workload, engines=(EnginePhase(0), EnginePhase(0)))


@pytest.mark.parametrize("name", NEW_FIXTURES)
def test_each_test_scenario_loads_and_says_what_it_shows(name: str) -> None:
    scenario = fixture(name)
    assert scenario.name == name
    head = []
    for line in (SCENARIOS / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        head.append(line)
    text = "\n".join(head)
    assert "correct diagnosis" in text.lower(), name
    assert "physics" in text.lower(), name
