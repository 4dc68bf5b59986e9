"""`vllm-triage check` (daemon/vllm_triage/commands/check.py): the verdict of one window of a live
server, its exit codes and its words, against simulated servers on 127.0.0.1."""

from __future__ import annotations

import functools
import json
import os
import pty
import re
import select
import subprocess
from pathlib import Path

import pytest

from vllm_triage.cli import build_parser
from vllm_triage.commands import check as check_command
from vllm_triage.commands.check import check
from vllm_triage.simulator import get_scenario

from support.clirun import COMMAND, HANG_S, vllm_triage
from support.clock import FakeClock
from support.harness import metrics_url, refused_port, simulated, simulated_on
from support.localserver import replies, serving
from support.paths import BUNDLED_SCENARIOS

#: What starting the installed command costs, on the fake clock: its first scrape comes
#: this long after the server started.
STARTUP_S = 1.0


def check_in_process(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    clock: FakeClock,
    *argv: str,
) -> tuple[int, str]:
    """``vllm-triage check ARGV`` as the installed command parses and prints it, in this
    process, with ``clock`` for the check's clock and sleep: its window passes at once.
    The exit code and stdout."""
    monkeypatch.setattr(
        check_command, "check", functools.partial(check, sleep=clock.sleep, clock=clock)
    )
    args = build_parser().parse_args(["check", *argv])
    code: int = args.func(args)
    return code, capsys.readouterr().out


class TestCheck:
    """What a check decides is tested on a fake clock (the check's and the simulated
    server's: the window passes at once); ``test_progress_on_a_terminal`` runs the
    installed command against a server in real time."""

    def test_an_incident_exits_1_with_its_cause(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        clock = FakeClock()
        with simulated_on(clock, get_scenario("queue_bound"), speed=10.0) as url:
            clock.sleep(STARTUP_S)
            code, out = check_in_process(
                monkeypatch, capsys, clock, url, "--window", "6", "--format", "json"
            )
        assert code == 1, out
        report = json.loads(out)
        assert report["verdict"] == "incident"
        assert report["models"][0]["cause"] == "queue_bound"

    def test_healthy_exits_0(self) -> None:
        clock = FakeClock()
        with simulated_on(clock, get_scenario("healthy"), speed=10.0) as url:
            clock.sleep(STARTUP_S)
            result = check(
                url, window=6, scrapes=4, timeout=5, config=None, sleep=clock.sleep, clock=clock
            )
        assert result["verdict"] == "healthy", result
        assert result["models"][0]["cause"] is None

    def test_a_hung_engine_exits_1_stalled(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """The engine stops stepping 1 s in and never resumes; /metrics answers, frozen.
        The 2 s window sees no progress, so the check watches on until that has lasted
        stall_after_seconds (3 s here), then says stalled: not "cannot tell"."""
        hung = tmp_path / "hung.yaml"
        hung.write_text(
            (BUNDLED_SCENARIOS / "stalled.yaml")
            .read_text()
            .replace("duration_seconds: 240", "duration_seconds: 10")
            .replace("duration_seconds: 300", "duration_seconds: 100000")
        )
        cfg = tmp_path / "t.yaml"
        cfg.write_text("thresholds: {stall_after_seconds: 3}\n")
        clock = FakeClock()
        with simulated_on(clock, get_scenario(str(hung)), speed=10.0) as url:
            clock.sleep(1.5)
            started = clock()
            code, out = check_in_process(
                monkeypatch, capsys, clock,
                url, "--window", "2", "--scrapes", "3", "--config", str(cfg),
            )  # fmt: skip
            waited = clock() - started  # fake seconds: the schedule, not the machine
        assert code == 1, out
        assert "stalled (confidence" in out
        assert re.search(r"engine made no progress for \d+ s with \d+ requests running", out)
        assert "fix: Take a stack dump" in out
        assert waited < 20

    def test_a_refused_port_cannot_tell_at_once_exit_3(self, tmp_path: Path) -> None:
        """Refused: said once, at once (not after the 15 s window), exit 3 ("cannot tell"),
        distinct from 2 (a usage error)."""
        url = f"http://127.0.0.1:{refused_port()}/metrics"
        result = vllm_triage("check", url, cwd=tmp_path)
        assert result.returncode == 3, result.stdout + result.stderr
        assert "cannot tell" in result.stdout
        assert result.stdout.count("Connection refused") == 1
        assert "stopped after the first scrape" in result.stdout

    def test_a_url_without_scheme_is_a_usage_error_exit_2(self, tmp_path: Path) -> None:
        result = vllm_triage("check", "localhost:8000/metrics", cwd=tmp_path)
        assert result.returncode == 2
        assert "add the scheme (http://localhost:8000/metrics)" in result.stderr

    def test_the_base_url_says_add_metrics(self, tmp_path: Path) -> None:
        """`check http://host:8000` (vLLM answers 404 there): the hint names /metrics."""
        with serving(replies((404, b'{"detail":"Not Found"}'))) as srv:
            url = srv.url("/metrics")
            base = url.removesuffix("/metrics")
            result = vllm_triage("check", base, cwd=tmp_path)
        assert result.returncode == 3
        assert f"HTTP 404 from {base}: vLLM serves its metrics at /metrics: try {url}" in (
            result.stdout
        )

    def test_a_health_check_page_is_not_a_metrics_page(self, tmp_path: Path) -> None:
        with serving(replies((200, b"ok"))) as srv:
            url = srv.url("/metrics")
            healthz = url.replace("/metrics", "/healthz")
            result = vllm_triage("check", healthz, cwd=tmp_path)
        assert result.returncode == 3
        assert f"{healthz} did not answer with Prometheus metrics" in result.stdout
        assert f"try {url}" in result.stdout

    def test_each_distinct_error_once_with_its_count(self) -> None:
        """A server that fails every scrape after a good first one: one line, counted."""
        body = b'vllm:num_requests_running{model_name="m"} 1.0\n'
        clock = FakeClock()
        with serving(replies((200, body), (500, b"oops"))) as srv:
            url = srv.url("/metrics")
            result = check(
                url, window=0.3, scrapes=4, timeout=5, config=None, sleep=clock.sleep, clock=clock
            )
        assert result["verdict"] == "cannot_tell"
        assert result["errors"] == [{"error": f"HTTP 500 from {url}", "times": 3}]

    def test_progress_on_a_terminal(self, tmp_path: Path) -> None:
        """With stderr a terminal, each scrape shows as it happens; the line is cleared
        before the verdict (stdout is a pipe here, as in a script)."""
        leader, follower = pty.openpty()
        with simulated(get_scenario("healthy"), speed=10.0) as sim:
            proc = subprocess.run(
                [str(COMMAND), "check", metrics_url(sim), "--window", "2", "--scrapes", "3"],
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=follower,
                text=True,
                timeout=HANG_S,
                check=False,
            )
        os.close(follower)
        shown = b""
        while select.select([leader], [], [], 0.5)[0]:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
        os.close(leader)
        assert proc.returncode == 0, proc.stdout
        text = shown.decode()
        for n in (1, 2, 3):
            assert f"check: scrape {n} of 3 ok" in text
        assert text.endswith("\r\x1b[K")  # cleared: the verdict on stdout stands alone
        assert "healthy" in proc.stdout

    def test_an_incident_says_how_many_fixes_it_left_out(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """KV pressure has five fixes: three are shown, and the other two are said."""
        clock = FakeClock()
        with simulated_on(clock, get_scenario("kv_pressure"), speed=20.0) as url:
            clock.sleep(2)  # 40 simulated seconds: the pool is full
            code, out = check_in_process(monkeypatch, capsys, clock, url, "--window", "4")
        assert code == 1, out
        assert "kv_pressure" in out
        assert out.count("    fix: ") == 3
        assert "    (2 more fixes: --format json)" in out

    def test_help_documents_the_exit_codes(self, tmp_path: Path) -> None:
        result = vllm_triage("check", "--help", cwd=tmp_path)
        for code in ("0  healthy", "1  incident", "2  usage or settings error", "3  cannot tell"):
            assert code in result.stdout
