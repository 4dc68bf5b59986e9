"""``check`` started as a simulated hang ends says ``stalled`` (recovered), not
``queue_bound`` with nothing waiting; long after the hang it says healthy (the diagnosis
itself: tests/core/test_stall_recovered.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllm_triage.commands.check import check
from vllm_triage.simulator import get_scenario

from support.clock import FakeClock
from support.harness import simulated_on
from support.paths import BUNDLED_SCENARIOS

#: The hang's phases: 30 s healthy, then the engine still for HANG_S, then resumed.
HEALTHY_S, HANG_S = 30, 240


@pytest.fixture(scope="module")
def hang(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scenario") / "hang.yaml"
    path.write_text(
        (BUNDLED_SCENARIOS / "stalled.yaml")
        .read_text()
        .replace("duration_seconds: 240", f"duration_seconds: {HEALTHY_S}")
        .replace("duration_seconds: 300", f"duration_seconds: {HANG_S}")
    )
    return path


def check_at(hang: Path, before_end_s: float) -> dict[str, Any]:
    """``check`` (15 s, 4 scrapes) started ``before_end_s`` before the hang ends, on a
    fake clock (the simulated server's too: its minutes pass at once)."""
    clock = FakeClock()
    with simulated_on(clock, get_scenario(str(hang)), speed=1.0) as url:
        clock.sleep(HEALTHY_S + HANG_S - before_end_s)
        return check(
            url, window=15, scrapes=4, timeout=5, config=None, sleep=clock.sleep, clock=clock
        )


def test_check_started_as_a_hang_ends_says_stalled_recovered(hang: Path) -> None:
    """Half a second before the end: one frozen snapshot, then the engine moves. The
    window's TTFTs are the hang's (minutes); nobody waits. Before: queue_bound, 0.0
    waiting."""
    result = check_at(hang, 0.5)
    assert result["verdict"] == "incident"
    (model,) = result["models"]
    assert model["cause"] == "stalled", model["summary"]
    assert model["summary"].startswith("stalled, recovered")
    assert model["ttft_p99_seconds"] > 100 and model["requests_waiting_mean"] == 0.0
    ev = model["evidence"]
    assert ev["stall_recovered"] is True
    assert ev["stall_seconds_at_least"] >= 30  # the ITL gap's bucket: at least that long
    assert "not a queue" in model["summary"]


def test_watching_begun_during_the_hang_is_the_stall_seen_in_part(hang: Path) -> None:
    """Twelve seconds before the end: the first snapshots show the engine still, from
    the first one on; then it moves. At least the 10 s seen, and said so."""
    result = check_at(hang, 12)
    (model,) = result["models"]
    assert model["cause"] == "stalled", model["summary"]
    assert "already still when watching began" in model["summary"]


def test_long_after_the_hang_the_check_is_healthy_again(hang: Path) -> None:
    """A minute after the end the window holds none of the hang: judged as usual."""
    result = check_at(hang, -60)
    assert result["verdict"] == "healthy", result["models"]
