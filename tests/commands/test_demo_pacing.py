"""Tests for daemon/vllm_triage/demo/pacing.py and the live demo's verdict on a host that
cannot keep up: the pace (``simulator.serve.Pace``) slows without a jump in scenario
time, the pacer halves it on new strain once the last change has settled, and a failed
check on a strained host is "could not judge" (exit 3), never "NOT AS BUILT"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_triage.commands.demo import HOST_TOO_SLOW, _report, log_summary
from vllm_triage.demo.expectations import Event, segments
from vllm_triage.demo.live import LiveDemoResult
from vllm_triage.demo.pacing import SETTLE_TICKS, Pacer, Strain
from vllm_triage.simulator import get_scenario
from vllm_triage.simulator.serve import LiveSimulation, Pace

from support.clock import FakeClock

TOUR = segments(get_scenario("tour"))


def as_built() -> list[Event]:
    """What the receiver gets on a run of the tour that goes as built: each fault fires
    its own cause 20 s in, and resolves in the healthy time after it."""
    out = []
    for seg in TOUR:
        if seg.expect != "healthy":
            cleared = min(seg.end, seg.start + 150.0) - 10.0
            out += [
                Event(seg.start + 20, "firing", seg.expect),
                Event(cleared, "resolved", seg.expect),
            ]
    return out


def went_wrong() -> list[Event]:
    """The issue's run on a busy host: kv_pressure during the queue_bound phase, and
    never in its own."""
    [queue] = [s for s in TOUR if s.expect == "queue_bound"]
    wrong = Event(queue.start + 38, "firing", "kv_pressure")
    return sorted([e for e in as_built() if e.cause != "kv_pressure"] + [wrong], key=lambda e: e.at)


class TestPace:
    def test_virtual_time_runs_speed_times_the_clock(self) -> None:
        clock = FakeClock(100.0)
        pace = Pace(20.0, clock)
        clock.sleep(2.0)
        assert pace() == 40.0 and pace.speed == 20.0

    def test_a_slower_speed_goes_on_from_where_it_was(self) -> None:
        """No jump at the change: the time reached so far stays, the rate changes."""
        clock = FakeClock(100.0)
        pace = Pace(20.0, clock)
        clock.sleep(2.0)
        pace.set_speed(5.0)
        assert pace() == 40.0
        clock.sleep(2.0)
        assert pace() == 50.0 and pace.speed == 5.0

    def test_a_shared_pace_moves_the_simulation(self) -> None:
        clock = FakeClock(0.0)
        pace = Pace(10.0, clock)
        live = LiveSimulation(get_scenario("healthy"), speed=10.0, naming="v1", pace=pace)
        clock.sleep(1.0)
        assert live.advance() == 10.0
        pace.set_speed(1.0)
        clock.sleep(1.0)
        assert live.advance() == 11.0 and live.speed == 1.0

    def test_the_speed_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="speed must be > 0"):
            Pace(20.0).set_speed(0.0)


class TestPacer:
    def test_the_first_ticks_settle_then_new_strain_halves_the_speed(self) -> None:
        pacer = Pacer(20.0)
        # A skip among the start's ticks is the start's, not the host's.
        assert pacer.observe(10.0, Strain(skipped=1, ticks=SETTLE_TICKS - 1)) is None
        assert pacer.observe(30.0, Strain(skipped=1, ticks=SETTLE_TICKS + 2)) is None
        assert pacer.observe(40.0, Strain(skipped=2, ticks=SETTLE_TICKS + 3)) == 10.0
        assert [(s.at, s.speed) for s in pacer.slowdowns] == [(40.0, 10.0)]
        assert pacer.slowdowns[0].strain.skipped == 2

    def test_strain_counts_again_only_once_the_new_pace_settled(self) -> None:
        pacer = Pacer(20.0)
        ticks = SETTLE_TICKS
        assert pacer.observe(1.0, Strain(late=1, ticks=ticks)) == 10.0
        # Late answers already on their way when the pace changed: not news of the host.
        assert pacer.observe(2.0, Strain(late=2, ticks=ticks + SETTLE_TICKS - 1)) is None
        assert pacer.observe(3.0, Strain(late=3, ticks=ticks + SETTLE_TICKS)) == 5.0

    @pytest.mark.parametrize("sign", ["skipped", "late", "failed", "behind"])
    def test_each_sign_is_strain(self, sign: str) -> None:
        pacer = Pacer(8.0)
        assert pacer.observe(1.0, Strain(ticks=SETTLE_TICKS, **{sign: 1})) == 4.0

    def test_no_strain_no_change(self) -> None:
        pacer = Pacer(20.0)
        for ticks in range(100):
            assert pacer.observe(float(ticks), Strain(ticks=ticks)) is None
        assert pacer.speed == 20.0 and pacer.said() == ""

    def test_it_goes_no_slower_than_its_floor_and_counts_strain_there(self) -> None:
        pacer = Pacer(20.0, slowest=1 / 4)
        speeds = []
        for i in range(1, 8):
            speeds.append(pacer.observe(i, Strain(skipped=i, ticks=i * 10 * SETTLE_TICKS)))
        assert speeds == [10.0, 5.0, None, None, None, None, None]
        assert pacer.speed == pacer.floor == 5.0
        assert pacer.at_slowest == 5

    def test_it_says_by_how_much_it_slowed(self) -> None:
        pacer = Pacer(20.0)
        pacer.observe(69.0, Strain(skipped=1, ticks=SETTLE_TICKS))
        pacer.observe(300.0, Strain(skipped=2, ticks=4 * SETTLE_TICKS))
        said = pacer.said()
        assert "could not keep up at 20x" in said
        assert "to 5x (4 times slower than asked, from 69 s into the scenario on)" in said


class TestStrain:
    def test_it_says_n_of_m_scrapes_skipped_and_the_other_signs(self) -> None:
        assert Strain(skipped=74, ticks=230).said() == "74 of 230 scrapes skipped"
        said = Strain(skipped=1, ticks=9, late=3, failed=2, behind=1).said()
        assert said == (
            "1 of 9 scrapes skipped; 3 scrapes answered late; 2 failed; "
            "the simulator fell behind 1 time"
        )

    def test_news_is_any_sign_growing(self) -> None:
        before = Strain(skipped=1, ticks=10)
        assert not Strain(skipped=1, ticks=20).news(before)
        assert Strain(skipped=1, ticks=20, behind=1).news(before)


def tour_result(events: list[Event], strain: Strain) -> LiveDemoResult:
    return LiveDemoResult(
        events={"tour": events},
        segments={"tour": TOUR},
        speed=20.0,
        strain=strain,
    )


class TestTheVerdictOnABusyHost:
    def test_a_failed_check_on_a_strained_host_could_not_be_judged(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        result = tour_result(went_wrong(), Strain(skipped=74, ticks=230, behind=1))
        assert result.host_too_slow
        assert _report(result) == HOST_TOO_SLOW == 3
        out = capsys.readouterr().out
        assert "tour: could not judge: the host was too slow (74 of 230 scrapes skipped;" in out
        assert "NOT AS BUILT" not in out
        assert "kv_pressure also fired at" in out  # what went differently, still said
        assert "vllm-triage demo --offline" in out

    def test_a_failed_check_on_a_host_that_kept_up_is_not_as_built(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        result = tour_result(went_wrong(), Strain(ticks=230))
        assert not result.host_too_slow
        assert _report(result) == 1
        out = capsys.readouterr().out
        assert "tour: NOT AS BUILT: " in out and "could not judge" not in out

    def test_a_check_that_passed_on_a_strained_host_passed(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        pacer = Pacer(20.0)
        pacer.observe(69.0, Strain(skipped=1, ticks=SETTLE_TICKS))
        result = tour_result(as_built(), Strain(skipped=1, ticks=230))
        result.pacer = pacer
        assert not result.host_too_slow
        assert _report(result) == 0
        out = capsys.readouterr().out
        assert "tour: as built" in out
        assert "slowed the scenario's clock to 10x (2 times slower than asked" in out


class TestTheLog:
    def test_its_lines_are_counted_by_event(self, tmp_path: Path) -> None:
        log = tmp_path / "demo.log"
        lines = [{"event": "scrape_skipped"}] * 3 + [{"event": "simulate_falling_behind"}]
        log.write_text("".join(json.dumps(e) + "\n" for e in lines) + "not json\n")
        said = log_summary(log)
        assert said == (
            f"5 log lines (scrape_skipped 3, simulate_falling_behind 1, (other) 1) in {log}"
        )

    def test_an_empty_or_missing_log_says_nothing(self, tmp_path: Path) -> None:
        (tmp_path / "demo.log").write_text("")
        assert log_summary(tmp_path / "demo.log") == ""
        assert log_summary(tmp_path / "none.log") == ""
        assert log_summary(None) == ""
