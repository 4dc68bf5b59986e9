"""``vllm-triage demo`` as a user runs it (daemon/vllm_triage/commands/demo.py): the installed
command in a subprocess, offline and live, from a temporary directory."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from support.clirun import COMMAND, HANG_S, vllm_triage
from support.paths import SCENARIO_FIXTURES

CARD_SWAP = SCENARIO_FIXTURES / "tour-card-swap.yaml"


class TestDemo:
    def test_demo_json(self, tmp_path: Path) -> None:
        """The demo's queue scenario fires queue_bound, as JSON lines."""
        result = vllm_triage(
            "demo",
            "--offline",
            "--scenario",
            "queue_bound",
            "--duration",
            "90",
            "--format",
            "json",
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        events = [json.loads(line) for line in result.stdout.splitlines()]
        assert events[0]["diagnosis"] == "queue_bound"
        assert events[0]["target"] == "simulated/queue_bound"

    @pytest.mark.e2e
    def test_live_demo_runs_the_tour_through_the_daemon(self, tmp_path: Path) -> None:
        """The README's first command, off a terminal: each phase, the signals
        every 30 simulated seconds, the four causes delivered as alerts in the tour's
        order and nothing else, the URLs, the first alert as the receiver got it, and
        the path of the tour's report, recorded as the daemon watched it."""
        result = vllm_triage(
            "demo",
            "--listen",
            "127.0.0.1:0",
            cwd=tmp_path,
            env={"TMPDIR": str(tmp_path)},
        )
        assert result.returncode == 0, result.stdout + result.stderr
        out = result.stdout
        assert "derived metrics: http://127.0.0.1:" in out and "/metrics" in out
        assert re.search(r"status page: +http://127\.0\.0\.1:\d+/\n", out)
        assert "tour: as built: each phase's own cause fired first, nothing else" in out
        assert (
            "alerts fired: prefill_bound, decode_bound, queue_bound, kv_pressure, stalled; "
            "resolved: prefill_bound, decode_bound, queue_bound, kv_pressure, stalled"
        ) in out
        report = Path(next(ln for ln in out.splitlines() if ln.endswith("tour-report.html")))
        assert report.parent.parent == tmp_path
        # The folder left behind is named, with its size and how to be rid of it.
        kept = re.search(r"Recording kept in (\S+) \((\d+\.\d) MB\)", out)
        assert kept is not None and Path(kept.group(1)) == report.parent
        assert float(kept.group(2)) > 0 and "delete it when done" in out
        assert sorted(p.name for p in report.parent.iterdir()) == [
            "demo.log",
            "tour",
            "tour-report.html",
            "tour-settings.yaml",
        ]
        assert f"replay {report.parent}/tour --config {report.parent}/tour-settings.yaml" in out
        page = report.read_text(encoding="utf-8")
        for cause in ("prefill_bound", "decode_bound", "queue_bound", "kv_pressure", "stalled"):
            assert f'"cause":"{cause}"' in page
        assert ", 0 failed." in out
        for cause in ("prefill_bound", "decode_bound", "queue_bound", "kv_pressure"):
            assert f"FIRING    {cause}" in out
            assert f"[tour] now playing: {cause}" in out
        # The signals, off a terminal too.
        assert re.search(r"\[tour\] \d\d:\d\d  TTFT p99 .* ITL p99 .* -> healthy", out)
        # One real payload, pretty-printed: the Alertmanager webhook the receiver got.
        payload = out.split("as your receiver would get it (Alertmanager webhook, v4):\n")[1]
        first = json.loads(payload[: payload.rindex("}") + 1])
        assert first["version"] == "4" and first["status"] == "firing"
        assert first["alerts"][0]["labels"]["diagnosis"] == "prefill_bound"
        assert "Traceback" not in result.stderr
        # The log lines went to the demo's log file, named, not between its lines.
        assert f"  log:             {report.parent}/demo.log" in out
        assert '"event":' not in out + result.stderr

    def test_offline_tour_is_as_built(self, tmp_path: Path) -> None:
        """`demo --offline --scenario tour`: the whole tour, judged by the same check."""
        result = vllm_triage("demo", "--offline", "--scenario", "tour", cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "-> as built over 214 scrapes" in result.stdout
        assert "1 of 1 scenario diagnosed as built." in result.stdout

    def test_offline_old_tour_is_not_as_built(self, tmp_path: Path) -> None:
        """The card-swapping tour of before (a scenario file): exit 1, saying what went
        differently, where the old demo said "every cause fired"."""
        result = vllm_triage("demo", "--offline", "--scenario", str(CARD_SWAP), cwd=tmp_path)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "NOT AS BUILT" in result.stdout
        assert "was prefill_bound at 275 s, not decode_bound" in result.stdout
        assert "0 of 1 scenario diagnosed as built." in result.stdout

    def test_an_unknown_scenario_is_a_usage_error(self, tmp_path: Path) -> None:
        result = vllm_triage("demo", "--scenario", "tuor", cwd=tmp_path)
        assert result.returncode == 2
        assert "no scenario 'tuor'; there are:" in result.stderr and "tour" in result.stderr

    def test_keep_running_serves_until_ctrl_c(self, tmp_path: Path) -> None:
        """--keep-running: after its verdict the demo's URLs still answer; Ctrl-C stops it
        with the verdict's exit code: 0 as built, or 3 where the host was too busy to
        judge (the verdict itself is the e2e tier's, and test_demo_pacing.py's)."""
        proc = subprocess.Popen(
            [
                *(str(COMMAND), "demo", "--scenario", "kv_pressure", "--duration", "60"),
                *("--speed", "30", "--listen", "127.0.0.1:0", "--keep-running"),
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:  # to its verdict (a hang: the guard below)
                lines.append(line)
                if line.startswith("Still serving"):
                    break
            text = "".join(lines)
            verdict = re.search(r"^kv_pressure: (as built|could not judge)", text, re.M)
            assert verdict, text
            url = re.search(r"(http://127\.0\.0\.1:\d+)/metrics", lines[-1])
            assert url, text
            time.sleep(1.0)  # the daemon keeps scraping the held last phase
            got = httpx.get(url.group(1) + "/api/v1/diagnoses", timeout=HANG_S).json()
            assert got["targets"][0]["target"] == "kv_pressure"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=HANG_S)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == {"as built": 0, "could not judge": 3}[verdict[1]], err
        assert "stopped." in out and "Traceback" not in err
        # Its log lines (a busy host's scrape_skipped among them) are in its log file.
        assert '"event":' not in text + out + err and "  log:  " in text

    def test_ctrl_c_says_interrupted_and_exits_130(self, tmp_path: Path) -> None:
        proc = subprocess.Popen(
            [str(COMMAND), "demo", "--listen", "127.0.0.1:0"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if "now playing" in line:
                    break
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=HANG_S)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, out + err
        assert "interrupted" in out
        assert "NOT AS BUILT" not in out and "Traceback" not in err

    def test_offline_only_options_need_offline(self, tmp_path: Path) -> None:
        """--format is --offline's (--record is both's: the live daemon records too)."""
        result = vllm_triage("demo", "--format", "json", cwd=tmp_path)
        assert result.returncode == 2
        assert "needs --offline" in result.stderr

    def test_demo_records_for_replay(self, tmp_path: Path) -> None:
        """`demo --record DIR` writes a recording that `replay` diagnoses the same way."""
        demo = vllm_triage(
            "demo",
            "--offline",
            "--scenario",
            "kv_pressure",
            "--duration",
            "120",
            "--record",
            "rec",
            cwd=tmp_path,
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "1 of 1 scenario diagnosed as built" in demo.stdout
        replay = vllm_triage("replay", "rec/kv_pressure", "--format", "json", cwd=tmp_path)
        assert json.loads(replay.stdout.splitlines()[0])["diagnosis"] == "kv_pressure"
