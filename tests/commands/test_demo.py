"""Tests for daemon/vllm_triage/demo/: the self-check (expectations.py), the offline and live
results, and the live view (view.py) while an incident clears."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from vllm_triage.assemble import build_scraped
from vllm_triage.config.load import load_settings
from vllm_triage.core.incidents import State
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.demo.expectations import Event, Segment, problems, segments
from vllm_triage.demo.live import LiveDemoResult, demo_settings, shared_slo
from vllm_triage.demo.offline import (
    START_AT,
    default_duration,
    run_scenario,
    scenario_settings,
)
from vllm_triage.demo.pacing import Strain
from vllm_triage.demo.view import DemoTarget, render, status_lines
from vllm_triage.errors import ConfigError
from vllm_triage.rules import runtime_table
from vllm_triage.simulator import get_scenario
from vllm_triage.target import Target

from support.paths import SCENARIO_FIXTURES
from support.scenarios import recorded

#: The tour before issue 16: the card swapped under the server for its fault phases.
CARD_SWAP = SCENARIO_FIXTURES / "tour-card-swap.yaml"
CAUSES = ["prefill_bound", "decode_bound", "queue_bound", "kv_pressure", "stalled"]


def offline(name: str) -> tuple[list[str], tuple[str, ...]]:
    scenario = get_scenario(name)
    run = run_scenario(
        name, scenario_settings(scenario, None), duration_s=default_duration(scenario)
    )
    return run.fired, run.problems


class TestTheTour:
    def test_the_new_tour_fires_each_phase_cause_first_and_nothing_else(self) -> None:
        """`demo --offline --scenario tour`: one card, four causes in order, each once."""
        fired, found = offline("tour")
        assert fired == CAUSES
        assert found == ()

    def test_the_old_card_swapping_tour_fails_the_check(self) -> None:
        """Today's tour (before issue 16) said "every cause fired"; the check now names what
        went wrong: prefill_bound fired first in the decode phase, and lingered."""
        fired, found = offline(str(CARD_SWAP))
        assert fired.count("prefill_bound") > 1  # it fired again in the decode phase
        assert (
            "the first firing during the decode_bound phase (240 s to 420 s) was "
            "prefill_bound at 275 s, not decode_bound"
        ) in found
        assert "prefill_bound was still firing when the decode_bound phase" in " ".join(found)

    def test_the_tour_is_judged_against_its_own_slo(self) -> None:
        """The scenario's `slo:` sits under the user's settings: a file or variable wins."""
        tour = get_scenario("tour")
        assert scenario_settings(tour, None).slo.itl_p99_seconds == 0.024
        assert scenario_settings(get_scenario("healthy"), None).slo.itl_p99_seconds == 0.1

    def test_a_users_setting_beats_the_scenarios(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        cfg = tmp_path / "triage.yaml"
        cfg.write_text("slo: {itl_p99_seconds: 0.05}\n")
        tour = get_scenario("tour")
        assert scenario_settings(tour, str(cfg)).slo.itl_p99_seconds == 0.05
        monkeypatch.setenv("VLLM_TRIAGE_SLO__ITL_P99_SECONDS", "0.07")
        assert scenario_settings(tour, str(cfg)).slo.itl_p99_seconds == 0.07

    def test_the_live_daemon_is_told_the_tours_card(self) -> None:
        """One card now, so the tour's target gets its hardware (the decode ceiling)."""
        settings = demo_settings(
            None,
            scenarios={"tour": get_scenario("tour")},
            urls={"tour": "http://127.0.0.1:1/metrics"},
            speed=20,
            listen="127.0.0.1:0",
            sink_url="http://127.0.0.1:2/alerts",
        )
        [target] = settings.targets
        assert target.hardware is not None and target.hardware.gpu == "NVIDIA H100 SXM"
        assert target.model is not None and target.model.dtype == "bfloat16"
        assert settings.slo.itl_p99_seconds == 0.024

    def test_scenarios_built_for_different_slos_cannot_share_a_live_run(self) -> None:
        with pytest.raises(ConfigError, match=r"different SLOs.*one at a time"):
            shared_slo({"tour": get_scenario("tour"), "healthy": get_scenario("healthy")})
        assert shared_slo({"tour": get_scenario("tour")}) == {"itl_p99_seconds": 0.024}


class TestSegments:
    def test_a_fault_and_the_healthy_time_after_it_are_one_segment(self) -> None:
        segs = segments(get_scenario("tour"))
        assert [s.expect for s in segs] == ["healthy", *CAUSES]
        assert [(s.start, s.end) for s in segs] == [
            (0, 60),
            (60, 255),
            (255, 450),
            (450, 645),
            (645, 840),
            (840, math.inf),
        ]
        assert all(s.heals for s in segs[1:])

    def test_a_scenario_without_expectations_takes_its_default(self) -> None:
        [seg] = segments(get_scenario("kv_pressure"), default="kv_pressure")
        assert (seg.expect, seg.start, seg.end, seg.heals) == ("kv_pressure", 0, math.inf, False)
        assert segments(get_scenario("kv_pressure")) == []


SEGS = [
    Segment("healthy", 0, 60, ""),
    Segment("prefill_bound", 60, 200, "", heals=True),
    Segment("decode_bound", 200, math.inf, "", heals=True),
]


class TestProblems:
    def test_as_built(self) -> None:
        events = [
            Event(90, "firing", "prefill_bound"),
            Event(180, "resolved", "prefill_bound"),
            Event(230, "firing", "decode_bound"),
            Event(330, "resolved", "decode_bound"),
        ]
        assert problems(SEGS, events) == []

    @pytest.mark.parametrize(
        ("events", "still", "problem"),
        [
            (
                [Event(30, "firing", "queue_bound")],
                [],
                "queue_bound fired at 30 s during the healthy start (0 s to 60 s)",
            ),
            (
                [Event(90, "firing", "decode_bound"), Event(120, "firing", "prefill_bound")],
                [],
                "the first firing during the prefill_bound phase (60 s to 200 s) was "
                "decode_bound at 90 s, not prefill_bound",
            ),
            (
                [Event(90, "firing", "prefill_bound"), Event(150, "firing", "queue_bound")],
                [],
                "queue_bound also fired at 150 s during the prefill_bound phase",
            ),
            (
                [
                    Event(90, "firing", "prefill_bound"),
                    Event(120, "resolved", "prefill_bound"),
                    Event(150, "firing", "prefill_bound"),
                ],
                [],
                "prefill_bound fired again at 150 s",
            ),
            ([], [], "prefill_bound never fired during the prefill_bound phase"),
            (
                [Event(90, "firing", "prefill_bound"), Event(230, "firing", "decode_bound")],
                [],
                "prefill_bound was still firing when the decode_bound phase (200 s to the end) "
                "began",
            ),
            (
                [
                    Event(90, "firing", "prefill_bound"),
                    Event(180, "resolved", "prefill_bound"),
                    Event(230, "firing", "decode_bound"),
                ],
                ["decode_bound"],
                "decode_bound was still firing when the run ended",
            ),
        ],
        ids=["healthy-start", "wrong-first", "also", "again", "never", "lingers", "at-end"],
    )
    def test_each_problem_says_what_and_when(
        self, events: list[Event], still: list[str], problem: str
    ) -> None:
        found = problems(SEGS, events, still_firing=still)
        assert any(problem in p for p in found), found

    def test_a_fault_the_scenario_ends_on_may_still_fire(self) -> None:
        [seg] = segments(get_scenario("kv_pressure"), default="kv_pressure")
        events = [Event(40, "firing", "kv_pressure")]
        assert problems([seg], events, still_firing=["kv_pressure"]) == []


class TestLiveResult:
    def test_failed_scrapes_make_a_failed_check_the_hosts(self) -> None:
        """A machine too slow for the speed: scrapes time out and phases go unseen; the
        check says what went differently, and the host is named as why
        (tests/commands/test_demo_pacing.py has the verdict's words)."""
        result = LiveDemoResult(
            events={"tour": [Event(95, "firing", "prefill_bound")]},
            segments={"tour": segments(get_scenario("tour"))},
            scrape_failures={"tour": {"timeout": 12}},
            speed=25,
            strain=Strain(ticks=200, failed=12),
        )
        ok, why = result.verdicts()["tour"]
        assert not ok and "decode_bound never fired" in why
        assert result.host_too_slow

    def test_the_verdict_is_the_self_check(self) -> None:
        segs = segments(get_scenario("tour"))
        good = LiveDemoResult(
            events={"tour": [Event(95, "firing", "prefill_bound")]},
            segments={"tour": segs},
        )
        ok, why = good.verdicts()["tour"]
        assert not ok and "decode_bound never fired" in why
        # The old verdict ("every cause fired") passed a run whose decode phase fired
        # prefill_bound first; this one does not.
        events = [
            Event(95, "firing", "prefill_bound"),
            Event(195, "resolved", "prefill_bound"),
            Event(270, "firing", "prefill_bound"),
            Event(300, "resolved", "prefill_bound"),
            Event(300, "firing", "decode_bound"),
            Event(425, "resolved", "decode_bound"),
            Event(465, "firing", "queue_bound"),
            Event(615, "resolved", "queue_bound"),
            Event(660, "firing", "kv_pressure"),
            Event(830, "resolved", "kv_pressure"),
            Event(870, "firing", "stalled"),
            Event(910, "resolved", "stalled"),
        ]
        bad = LiveDemoResult(events={"tour": events}, segments={"tour": segs})
        ok, why = bad.verdicts()["tour"]
        assert not ok and "was prefill_bound at 270 s, not decode_bound" in why
        fixed = [e for e in events if not (e.cause == "prefill_bound" and e.at in (270, 300))]
        ok, why = LiveDemoResult(events={"tour": fixed}, segments={"tour": segs}).verdicts()["tour"]
        assert ok, why


def clearing_watcher() -> Target:
    """The daemon's watcher fed the tour's scrapes until its first incident is resolving
    (the SLOs met again, not yet for ``resolve_after`` evaluations in a row)."""
    tour = get_scenario("tour")
    settings = load_settings(
        flags={"targets": [{"name": "tour", "url": "http://127.0.0.1:1/metrics"}]},
        base={"slo": dict(tour.slo)},
    )
    watcher = build_scraped(
        settings, settings.targets[0], client=httpx.AsyncClient(), notifier=None
    ).target
    parser = SnapshotParser(runtime_table())
    for at, body in recorded(tour, start_at=START_AT, interval_s=5.0, duration_s=255.0):
        watcher.consume(parser.parse(body, at))
        view = watcher.state.view
        assert view is not None
        if State.RESOLVING in view.states.values():
            return watcher
    raise AssertionError("the prefill incident never started to clear")


class TestTheViewWhileAnIncidentClears:
    def test_it_says_clearing_n_of_m_not_confidence_zero(self) -> None:
        watcher = clearing_watcher()
        view = watcher.state.view
        assert view is not None and view.resolve_after == 3
        [model] = view.evaluation.diagnoses
        assert view.clear_runs[model] == 1
        screen = render(
            [DemoTarget(watcher.state, "tour", "healthy again")],
            sim_seconds=200,
            total_seconds=300,
            speed=20,
            metrics_url="http://127.0.0.1:9468",
            delivered=1,
            start_at=START_AT,
        )
        assert "PREFILL_BOUND" in screen
        assert "clearing: 1 of 3 clear evaluations" in screen
        assert "confidence 0.00" not in screen
        [line] = status_lines(watcher.state, start_at=START_AT)
        assert "prefill_bound clearing, 1 of 3 clear evaluations" in line
