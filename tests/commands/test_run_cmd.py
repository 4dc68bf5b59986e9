"""`vllm-triage run` as a user runs it (daemon/vllm_triage/commands/run.py): the installed command
in a subprocess, a simulated server, a webhook receiver, all on 127.0.0.1."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from vllm_triage.cli import build_parser
from vllm_triage.config.load import load_settings
from vllm_triage.errors import ConfigError
from vllm_triage.simulator import get_scenario

from support.clirun import COMMAND, HANG_S, vllm_triage, wait_for_event
from support.harness import free_port, metrics_url, simulated, wait_for
from support.receiver import Receiver


@contextmanager
def command(tmp_path: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [str(COMMAND), *args],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Each sample ``name`` of the daemon's /metrics: its labels and value."""
    text = httpx.get(url, timeout=5).text
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def diagnosis_state(url: str) -> dict[str, float]:
    return {labels["diagnosis"]: value for labels, value in samples(url, "vllm_triage_diagnosis")}


def write_config(tmp_path: Path, target: str, receiver: str, listen: str, **extra: object) -> Path:
    cfg = {
        "listen": listen,
        "targets": [{"name": "sim", "url": target, "hardware": {"gpu": "A100 80GB SXM"}}],
        "receivers": [
            {
                "type": "alertmanager_webhook",
                "url": receiver,
                "hmac_secret": "not-in-any-log",
                "retry_initial_seconds": 0.2,
            }
        ],
        **extra,
    }
    path = tmp_path / "triage.yaml"
    path.write_text(json.dumps(cfg), encoding="utf-8")  # JSON is YAML
    return path


#: The shutdown grace of the SIGTERM test: the receiver takes 2 s to answer.
GRACE_S = 60.0


class TestRun:
    @pytest.mark.e2e
    def test_kv_pressure_shows_on_metrics_and_fires_within_two_minutes(
        self, tmp_path: Path
    ) -> None:
        """The issue's check, in real time: `run --config FILE` against `simulate --scenario
        kv_pressure` at 1x shows diagnosis="kv_pressure" 1 and delivers a firing payload."""
        with (
            Receiver() as rx,
            simulated(get_scenario("kv_pressure"), speed=1.0) as sim,
        ):
            cfg = write_config(tmp_path, metrics_url(sim), rx.url, "127.0.0.1:0")
            with command(tmp_path, "run", "--config", str(cfg)) as proc:
                listen = wait_for_event(proc, "started", HANG_S)["listen"]
                wait_for(rx.bodies, timeout=HANG_S, every=0.5)
                url = f"http://{listen}/metrics"
                scrapes = sum(v for _, v in samples(url, "vllm_triage_scrapes_total"))
                state = diagnosis_state(url)
                proc.send_signal(signal.SIGTERM)
                rest = proc.communicate(timeout=HANG_S)[1]
        # Within two minutes of the server's time: the scrapes taken until it fired (one
        # more at most, taken since), not the host's clock, which a busy machine slows.
        assert 0 < scrapes <= 120 / load_settings(cfg).interval_seconds + 1, scrapes
        assert state["kv_pressure"] == 1.0 and sum(state.values()) == 1.0
        body = rx.bodies()[0]
        assert body["status"] == "firing"
        assert body["alerts"][0]["labels"]["diagnosis"] == "kv_pressure"
        assert proc.returncode == 0
        assert '"event": "stopped"' in rest
        assert "not-in-any-log" not in rest

    def test_sigterm_delivers_what_is_pending_first(self, tmp_path: Path) -> None:
        """SIGTERM while a notification is in flight to a slow receiver: it is delivered,
        then the daemon exits 0, within shutdown_grace_seconds (as it says itself: nothing
        undelivered; the grace is long enough that a busy machine does not use it up)."""
        with (
            Receiver() as rx,
            simulated(get_scenario("kv_pressure"), speed=10.0) as sim,
        ):
            rx.behaviour.delay = 2.0
            cfg = write_config(
                tmp_path,
                metrics_url(sim),
                rx.url,
                "127.0.0.1:0",
                interval_seconds=0.5,
                scrape_timeout_seconds=30,
                shutdown_grace_seconds=GRACE_S,
            )
            with command(tmp_path, "run", "--config", str(cfg)) as proc:
                wait_for_event(proc, "started", HANG_S)
                wait_for(lambda: rx.attempts >= 1, timeout=HANG_S)
                proc.send_signal(signal.SIGTERM)
                rest = proc.communicate(timeout=GRACE_S + HANG_S)[1]
        assert proc.returncode == 0
        assert [b["status"] for b in rx.bodies()][:1] == ["firing"]
        stopped = [json.loads(line) for line in rest.splitlines() if '"stopped"' in line]
        assert stopped and stopped[0]["undelivered"] == 0

    @pytest.mark.parametrize(
        ("config", "fragment"),
        [
            pytest.param("interval_seconds: -1\n", "interval_seconds", id="negative-interval"),
            pytest.param("listen: nowhere\n", "listen", id="bad-listen"),
            pytest.param(
                "targets: [{name: a, url: 'ftp://x'}]\n", "targets.0.url", id="bad-target-url"
            ),
            pytest.param(
                "targets: [{name: a, url: 'http://x'}, {name: a, url: 'http://y'}]\n",
                "names must be unique",
                id="duplicate-targets",
            ),
            pytest.param(
                "targets: [{name: a, url: 'http://x'}]\n"
                "receivers: [{type: pagerduty, url: 'http://x'}]\n",
                "receivers.0.type",
                id="unknown-receiver-type",
            ),
            pytest.param("# nothing to watch\n", "no targets", id="no-targets"),
        ],
    )
    def test_invalid_config_exits_2_and_starts_nothing(
        self, tmp_path: Path, config: str, fragment: str
    ) -> None:
        port = free_port()
        path = tmp_path / "bad.yaml"
        if "listen" not in config:
            config += f"listen: 127.0.0.1:{port}\n"
        path.write_text(config, encoding="utf-8")
        result = vllm_triage("run", "--config", str(path), cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert fragment in result.stderr
        assert '"started"' not in result.stderr
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)

    def test_a_port_in_use_is_a_clear_error(self, tmp_path: Path) -> None:
        with Receiver() as rx:
            result = vllm_triage(
                "run",
                "--target",
                "http://127.0.0.1:1/metrics",
                "--listen",
                f"127.0.0.1:{rx.port}",
                cwd=tmp_path,
            )
        assert result.returncode == 2
        assert "cannot listen on" in result.stderr


class TestFlags:
    """What ``run``'s flags hand the assembly, read in-process: the daemon is not built."""

    def settings_of(self, monkeypatch: pytest.MonkeyPatch, *argv: str) -> Any:
        seen: list[Any] = []

        def build(settings: Any, **_: Any) -> Any:
            seen.append(settings)
            raise SystemExit(0)

        monkeypatch.setattr("vllm_triage.assemble.build_daemon", build)
        args = build_parser().parse_args(["run", *argv])
        with pytest.raises(SystemExit):
            args.func(args)  # not main(): it would set logging up over capture_logs
        return seen[0]

    def test_state_dir_is_a_flag(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        got = self.settings_of(
            monkeypatch, "--target", "http://127.0.0.1:8000/metrics", "--state-dir", str(tmp_path)
        )
        assert got.state_dir == str(tmp_path)

    def test_a_missing_optional_config_runs_on_the_defaults_and_says_so(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        missing = tmp_path / "triage.yaml"
        with capture_logs() as logs:
            got = self.settings_of(
                monkeypatch,
                "--config",
                str(missing),
                "--config-optional",
                "--target",
                "vllm=http://127.0.0.1:8000/metrics",
            )
        assert [t.name for t in got.targets] == ["vllm"]
        [said] = [e for e in logs if e["event"] == "config_missing"]
        assert said["log_level"] == "error" and said["config"] == str(missing)

    def test_a_missing_config_is_still_an_error_without_the_flag(self, tmp_path: Path) -> None:
        args = build_parser().parse_args(
            ["run", "--config", str(tmp_path / "nope.yaml"), "--target", "http://h:1/"]
        )
        # (Not main(): it would point the process's logging at this test's captured
        # stream, closed once the test ends.) The CLI turns a ConfigError into exit 2.
        with pytest.raises(ConfigError, match=r"nope\.yaml"):
            args.func(args)

    def test_an_optional_config_that_exists_is_read(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        path = tmp_path / "triage.yaml"
        path.write_text("slo: {ttft_p99_seconds: 1.25}\n", encoding="utf-8")
        got = self.settings_of(
            monkeypatch, "--config", str(path), "--config-optional", "--target", "http://h:1/"
        )
        assert got.slo.ttft_p99_seconds == 1.25
