"""Tests for daemon/vllm_triage/demo/view.py: the live demo's terminal screen."""

from __future__ import annotations

from vllm_triage.demo.offline import START_AT
from vllm_triage.demo.view import DemoTarget, render

from support.watched import watched


def test_the_screen_names_the_status_page_and_the_incident() -> None:
    state = watched("kv_pressure", duration_s=300)
    screen = render(
        [DemoTarget(state, "kv_pressure", "KV pressure")],
        sim_seconds=300,
        total_seconds=660,
        speed=20,
        metrics_url="http://127.0.0.1:9468",
        delivered=1,
        start_at=START_AT,
    )
    lines = screen.splitlines()
    assert "  status page      http://127.0.0.1:9468/" in lines
    assert "  derived metrics  http://127.0.0.1:9468/metrics" in lines
    assert "diagnosis: KV_PRESSURE (since 00:30), firing, confidence" in screen
