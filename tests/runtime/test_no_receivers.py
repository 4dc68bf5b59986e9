"""``run`` with no receiver says so at start (daemon/vllm_triage/service.py): incidents are then
shown on the status page, /metrics and the API, and sent nowhere; with one, nothing is said."""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from vllm_triage.config.load import load_settings

from support.harness import running_daemon

TARGET = {"name": "t", "url": "http://127.0.0.1:9/metrics"}


def started(receivers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    settings = load_settings(
        flags={
            "listen": "127.0.0.1:0",
            "state_dir": None,
            "interval_seconds": 5,
            "targets": [TARGET],
            "receivers": receivers,
        }
    )
    with capture_logs() as logs, running_daemon(settings):
        pass
    return logs


def test_no_receiver_is_a_warning_at_start_with_what_to_do() -> None:
    logs = started([])
    (warned,) = [e for e in logs if e["event"] == "no_receivers"]
    assert warned["log_level"] == "warning"
    assert "sent nowhere" in warned["consequence"]
    assert "--webhook URL" in warned["hint"] and "receivers:" in warned["hint"]
    # Said once the daemon has started, after the line that lists its (no) receivers.
    events = [e["event"] for e in logs]
    assert events.index("started") < events.index("no_receivers")
    assert next(e for e in logs if e["event"] == "started")["receivers"] == []


def test_a_receiver_silences_it() -> None:
    logs = started([{"type": "alertmanager_webhook", "url": "http://127.0.0.1:9/hook"}])
    assert not [e for e in logs if e["event"] == "no_receivers"]
