"""Tests for daemon/vllm_triage/logs.py: how an incident reads in the console log and as JSON."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest
import structlog

from vllm_triage.logs import Throttle, configure
from vllm_triage.simulator import get_scenario

from support.clirun import COMMAND, HANG_S
from support.harness import metrics_url, refused_port, simulated

EVIDENCE = {
    "window_seconds": 59.91,
    "kv_usage_max": 0.999,
    "requests_waiting_mean": 13.0,
    "preemptions_per_second": 0.87,
    "gpu": "NVIDIA H100 SXM",
    "breaches": "ttft_p99,itl_p99,waiting",
}
SUMMARY = "KV cache ran out: 0.87/s preemptions, 13.0 requests waiting; KV 99.9% used at peak"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def log_firing(stream: io.StringIO, *, json_lines: bool | None = False) -> str:
    configure("info", json=json_lines, stream=stream)
    structlog.get_logger("vllm_triage.watcher").info(
        "incident_firing",
        target="llama-8b",
        model_name="meta-llama/Llama-3.1-8B-Instruct",
        diagnosis="kv_pressure",
        reason="opened",
        confidence=1.0,
        summary=SUMMARY,
        lasted_s=None,
        evidence=EVIDENCE,
    )
    return stream.getvalue()


@pytest.fixture(autouse=True)
def _restore_logging() -> object:
    yield
    configure("info", json=True)


class TestConsole:
    def test_summary_first_then_key_value_lines(self) -> None:
        text = log_firing(io.StringIO())
        first, *rest = text.rstrip("\n").split("\n")
        assert "FIRING" in first and "kv_pressure on llama-8b" in first
        assert first.endswith(SUMMARY)
        assert all(line.startswith("    ") and len(line) <= 100 for line in rest)
        body = " ".join(rest)
        assert "reason=opened confidence=1" in body
        assert "kv_usage_max=0.999" in body and "gpu=NVIDIA H100 SXM" in body
        assert "{" not in text  # no Python dict repr
        assert "\x1b[" not in text  # not a terminal: no colour

    def test_colour_on_a_terminal(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("NO_COLOR", raising=False)
        assert "\x1b[1m\x1b[31mFIRING" in log_firing(_Terminal())

    def test_no_color_is_honoured(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("NO_COLOR", "1")
        text = log_firing(_Terminal())
        assert "FIRING" in text and "\x1b[" not in text

    def test_other_events_keep_the_usual_columns(self) -> None:
        stream = io.StringIO()
        configure("info", json=False, stream=stream)
        structlog.get_logger().warning("scrape_failed", target="a", reason="connect")
        assert "scrape_failed" in stream.getvalue() and "reason=connect" in stream.getvalue()


class TestJson:
    def test_json_lines_carry_the_same_fields(self) -> None:
        record = json.loads(log_firing(io.StringIO(), json_lines=True))
        assert record["event"] == "incident_firing"
        assert record["summary"] == SUMMARY and record["evidence"] == EVIDENCE
        assert record["confidence"] == 1.0 and record["diagnosis"] == "kv_pressure"


def run_into_a_terminal(tmp_path: Path, env: dict[str, str], seconds: float = HANG_S) -> str:
    """`vllm-triage run` against a simulated KV-pressure server, its stderr a terminal,
    until it shows an incident (or ``seconds``, a guard against a hang); what the
    terminal showed."""
    leader, follower = pty.openpty()
    with simulated(get_scenario("kv_pressure"), speed=30.0) as sim:
        time.sleep(1.0)  # 30 simulated seconds: the pool is filling
        proc = subprocess.Popen(
            [
                *(str(COMMAND), "run", "--target", f"kv={metrics_url(sim)}"),
                *("--webhook", f"http://127.0.0.1:{refused_port()}/hook"),
                *("--listen", "127.0.0.1:0", "--interval", "0.3"),
            ],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=follower,
            # A scrape that waits on a busy machine is late, not failed (not under test).
            env={**os.environ, **env, "VLLM_TRIAGE_SCRAPE_TIMEOUT_SECONDS": "30"},
        )
        shown = b""
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline and b"FIRING" not in shown:
                if select.select([leader], [], [], 0.2)[0]:
                    shown += os.read(leader, 65536)
            time.sleep(0.5)  # the incident's key=value lines
            while select.select([leader], [], [], 0.2)[0]:
                shown += os.read(leader, 65536)
        finally:
            # Killed, not terminated: a SIGTERM would spend shutdown_grace_seconds (10 s)
            # trying to deliver the firing to the webhook that refuses it.
            proc.kill()
            proc.wait(timeout=HANG_S)
            os.close(follower)
            os.close(leader)
    return shown.decode(errors="replace")


class TestTheDaemonOnATerminal:
    def test_an_incident_in_colour_summary_first(self, tmp_path: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
        text = run_into_a_terminal(tmp_path, {**env, "TERM": "xterm"})
        line = next(x for x in text.splitlines() if "FIRING" in x)
        assert "\x1b[31mFIRING" in line and "kv_pressure on kv" in line, text[-2000:]
        assert "KV cache ran out" in line

    def test_no_color_from_the_installed_command(self, tmp_path: Path) -> None:
        text = run_into_a_terminal(tmp_path, {"NO_COLOR": "1"})
        assert "FIRING" in text, text[-2000:]
        assert "\x1b[" not in text


class _Lines:
    """A logger that keeps each line as (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, object]]] = []

    def warning(self, event: str, **fields: object) -> None:
        self.lines.append(("warning", event, fields))

    def info(self, event: str, **fields: object) -> None:
        self.lines.append(("info", event, fields))


class TestThrottle:
    """A repeating condition: its first line at once, then one a minute with how many
    it stands for, at once again when its reason changes, and one line when it ends."""

    def test_a_dead_target_for_three_minutes(self) -> None:
        now = [0.0]
        throttle = Throttle(60.0, clock=lambda: now[0])
        out = _Lines()
        for second in range(0, 180, 5):  # a failure every 5 s
            now[0] = float(second)
            reason = "timeout" if second < 100 else "connect"
            throttle.warn(out, "scrape_failed", key=reason, target="a", reason=reason)
        throttle.recovered(out, "scrape_recovered", target="a")
        throttle.recovered(out, "scrape_recovered", target="a")  # not logged again
        said = [
            (lvl, ev, f.get("reason"), f.get("failures_since_last_log")) for lvl, ev, f in out.lines
        ]
        assert said == [
            ("warning", "scrape_failed", "timeout", 1),  # 0 s
            ("warning", "scrape_failed", "timeout", 12),  # 60 s: it and 11 held back
            ("warning", "scrape_failed", "connect", 8),  # 100 s: new news, at once
            ("warning", "scrape_failed", "connect", 12),  # 160 s
            ("info", "scrape_recovered", None, None),
        ]
        assert out.lines[-1][2] == {"target": "a", "suppressed": 3}  # 165, 170, 175 s

    def test_no_count_field_and_a_condition_never_logged(self) -> None:
        throttle = Throttle(60.0, clock=lambda: 0.0)
        out = _Lines()
        throttle.recovered(out, "probe_recovered")  # never logged: nothing to end
        throttle.warn(out, "models_dropped", count=None, dropped=3)
        throttle.warn(out, "models_dropped", count=None, dropped=3)  # held back
        assert out.lines == [("warning", "models_dropped", {"dropped": 3})]
        assert throttle.held == 1
