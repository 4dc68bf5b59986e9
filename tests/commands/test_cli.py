"""Tests for daemon/cli.py: the installed command, run as a user would, from elsewhere."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from support.captures import SEED_CEILINGS
from support.clirun import COMMAND, vllm_triage
from support.localserver import replies, serving
from support.paths import CONFIGS, ROOT, SCENARIO_FIXTURES

CARD_SWAP = SCENARIO_FIXTURES / "tour-card-swap.yaml"


class TestHelp:
    def test_help_lists_the_commands(self, tmp_path: Path) -> None:
        """--help explains the tool and names every subcommand."""
        result = vllm_triage("--help", cwd=tmp_path)
        assert result.returncode == 0
        commands = ("demo", "run", "check", "record", "replay", "report", "ceiling", "check-config")
        for command in commands:
            assert command in result.stdout
        assert "VLLM_TRIAGE_" in result.stdout

    def test_no_command_is_usage_error(self, tmp_path: Path) -> None:
        """With no subcommand it prints the help and exits 2."""
        result = vllm_triage(cwd=tmp_path)
        assert result.returncode == 2 and "usage:" in result.stdout

    def test_bad_flag_value(self, tmp_path: Path) -> None:
        """A nonsense flag value is refused by name."""
        result = vllm_triage(
            "record", "http://127.0.0.1:1/metrics", "--out", "x", "--interval", "-1", cwd=tmp_path
        )
        assert result.returncode == 2 and "--interval" in result.stderr


class TestCeiling:
    def test_seed_table_from_any_directory(self, tmp_path: Path) -> None:
        """`ceiling --parameters-billion 8 --dtype float16` reproduces the seed's table."""
        result = vllm_triage(
            "ceiling",
            "--parameters-billion",
            "8",
            "--dtype",
            "float16",
            "--format",
            "json",
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        rows = {row["gpu"]: row for row in json.loads(result.stdout)}
        assert {
            gpu: round(rows[gpu]["decode_ceiling_tokens_per_s"]) for gpu in SEED_CEILINGS
        } == SEED_CEILINGS
        assert all(
            {"gpu", "memory_bandwidth_gb_s", "decode_ceiling_tokens_per_s"} <= r.keys()
            for r in rows.values()
        )

    def test_config_json_adds_kv_bytes(self, tmp_path: Path) -> None:
        """`ceiling --config-json` adds kv_bytes_per_token: 131072 for the 8B layout."""
        cfg = CONFIGS / "llama-3.1-8b.json"
        result = vllm_triage("ceiling", "--config-json", str(cfg), "--format", "json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert {row["kv_bytes_per_token"] for row in json.loads(result.stdout)} == {131072}


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
            timeout=300,
            env={"TMPDIR": str(tmp_path)},
        )
        assert result.returncode == 0, result.stdout + result.stderr
        out = result.stdout
        assert "derived metrics: http://127.0.0.1:" in out and "/metrics" in out
        assert re.search(r"status page: +http://127\.0\.0\.1:\d+/\n", out)
        assert "tour: as built: each phase's own cause fired first, nothing else" in out
        assert (
            "alerts fired: prefill_bound, decode_bound, queue_bound, kv_pressure; "
            "resolved: prefill_bound, decode_bound, queue_bound, kv_pressure"
        ) in out
        report = Path(out.splitlines()[-1])
        assert report.parent.parent == tmp_path and report.name == "tour-report.html"
        page = report.read_text(encoding="utf-8")
        for cause in ("prefill_bound", "decode_bound", "queue_bound", "kv_pressure"):
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

    def test_offline_tour_is_as_built(self, tmp_path: Path) -> None:
        """`demo --offline --scenario tour`: the whole tour, judged by the same check."""
        result = vllm_triage("demo", "--offline", "--scenario", "tour", cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "-> as built over 181 scrapes" in result.stdout
        assert "1/1 scenarios diagnosed as built." in result.stdout

    def test_offline_old_tour_is_not_as_built(self, tmp_path: Path) -> None:
        """The card-swapping tour of before (a scenario file): exit 1, saying what went
        differently, where the old demo said "every cause fired"."""
        result = vllm_triage("demo", "--offline", "--scenario", str(CARD_SWAP), cwd=tmp_path)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "NOT AS BUILT" in result.stdout
        assert "was prefill_bound at 275 s, not decode_bound" in result.stdout
        assert "0/1 scenarios diagnosed as built." in result.stdout

    def test_an_unknown_scenario_is_a_usage_error(self, tmp_path: Path) -> None:
        result = vllm_triage("demo", "--scenario", "tuor", cwd=tmp_path)
        assert result.returncode == 2
        assert "no scenario 'tuor'; there are:" in result.stderr and "tour" in result.stderr

    def test_keep_running_serves_until_ctrl_c(self, tmp_path: Path) -> None:
        """--keep-running: after its verdict the demo's URLs still answer; Ctrl-C stops it
        with the verdict's exit code."""
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
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                lines.append(line)
                if line.startswith("Still serving") or not line:
                    break
            text = "".join(lines)
            assert "kv_pressure: as built" in text, text
            url = re.search(r"(http://127\.0\.0\.1:\d+)/metrics", lines[-1])
            assert url, text
            time.sleep(1.0)  # the daemon keeps scraping the held last phase
            got = httpx.get(url.group(1) + "/api/v1/diagnoses", timeout=5).json()
            assert got["targets"][0]["target"] == "kv_pressure"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        assert "stopped." in out and "Traceback" not in err

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
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if "now playing" in proc.stdout.readline():
                    break
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, out + err
        assert "interrupted" in out
        assert "NOT AS BUILT" not in out and "Traceback" not in err

    def test_offline_only_options_need_offline(self, tmp_path: Path) -> None:
        result = vllm_triage("demo", "--record", "rec", cwd=tmp_path)
        assert result.returncode == 2
        assert "need --offline" in result.stderr

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
        assert "1/1 scenarios diagnosed as built" in demo.stdout
        replay = vllm_triage("replay", "rec/kv_pressure", "--format", "json", cwd=tmp_path)
        assert json.loads(replay.stdout.splitlines()[0])["diagnosis"] == "kv_pressure"


class TestRecord:
    def test_record_a_local_server(self, tmp_path: Path) -> None:
        """`record` saves scrapes of a server on 127.0.0.1 and stops after --duration."""
        body = b'vllm:num_requests_running{model_name="m"} 1.0\n'
        with serving(replies((200, body))) as srv:
            url = srv.url("/metrics")
            result = vllm_triage(
                "record",
                url,
                "--out",
                "rec",
                "--interval",
                "0.2",
                "--duration",
                "0.9",
                cwd=tmp_path,
                timeout=30,
            )
        files = sorted((tmp_path / "rec").glob("*.prom"))
        assert result.returncode == 0, result.stderr
        assert 3 <= len(files) <= 6 and len(srv.requests) == len(files)
        assert files[0].read_bytes() == body

    def test_record_dead_target_exits_1(self, tmp_path: Path) -> None:
        """Recording a target that never answers writes nothing, logs why, and exits 1."""
        with serving(replies((200, b""))) as srv:
            url = srv.url("/metrics")
        result = vllm_triage(
            "record",
            url,
            "--out",
            "rec",
            "--interval",
            "0.2",
            "--duration",
            "0.5",
            cwd=tmp_path,
            timeout=30,
        )
        assert result.returncode == 1
        assert "scrape_failed" in result.stderr

    def test_record_a_page_without_vllm_metrics_exits_1_with_a_hint(self, tmp_path: Path) -> None:
        """Pointed at a health check: the bodies are kept (the raw truth) but the command
        says none is vLLM's metrics, where they are, and exits 1."""
        with serving(replies((200, b"ok"))) as srv:
            url = srv.url("/metrics")
            healthz = url.replace("/metrics", "/healthz")
            result = vllm_triage(
                "record", healthz, "--out", "rec", "--interval", "0.2", "--duration", "0.5",
                cwd=tmp_path, timeout=30,
            )  # fmt: skip
        assert result.returncode == 1
        assert "holds vLLM metrics" in result.stderr
        assert f"vLLM serves its metrics at /metrics: try {url}" in result.stderr


class TestCheckConfig:
    def test_prints_effective_settings(self, tmp_path: Path) -> None:
        """check-config prints the merged settings and the resolved ceiling."""
        cfg = tmp_path / "t.yaml"
        cfg.write_text("hardware:\n  gpu: h100\nmodel:\n  parameters_billion: 8\n")
        result = vllm_triage("check-config", "--config", str(cfg), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["hardware"]["gpu"] == "h100"
        assert "209.4 tok/s per stream on NVIDIA H100 SXM" in result.stderr

    def test_the_example_daemon_config_is_valid(self, tmp_path: Path) -> None:
        """deploy/triage.example.yaml loads, and each target gets its own ceiling."""
        example = ROOT / "deploy" / "triage.example.yaml"
        result = vllm_triage("check-config", "--config", str(example), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        settings = json.loads(result.stdout)
        assert [t["name"] for t in settings["targets"]] == ["llama-8b", "qwen-32b"]
        assert settings["receivers"][0]["type"] == "alertmanager_webhook"
        assert "target qwen-32b: 62.2 tok/s per stream on 2x NVIDIA A100 80GB SXM" in result.stderr

    def test_secrets_print_masked(self, tmp_path: Path) -> None:
        cfg = tmp_path / "t.yaml"
        cfg.write_text(
            "targets: [{name: a, url: 'http://127.0.0.1:1/metrics', bearer_token: tok-123}]\n"
            "receivers: [{type: slack, url: 'https://hooks.example/T/B/sekrit',"
            " hmac_secret: hm-456}]\n"
        )
        result = vllm_triage("check-config", "--config", str(cfg), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        for secret in ("tok-123", "sekrit", "hm-456"):
            assert secret not in result.stdout + result.stderr
        assert "**********" in result.stdout

    def test_unknown_gpu(self, tmp_path: Path) -> None:
        """An unknown GPU name is a configuration error listing the known ones."""
        cfg = tmp_path / "t.yaml"
        cfg.write_text("hardware:\n  gpu: potato\nmodel:\n  parameters_billion: 8\n")
        result = vllm_triage("check-config", "--config", str(cfg), cwd=tmp_path)
        assert result.returncode == 2
        assert "potato" in result.stderr and "NVIDIA H100 SXM" in result.stderr


def closed_early(*args: str, cwd: Path) -> tuple[int, str]:
    """Run the command with its stdout a pipe whose reader has gone before the first
    line is written (what `| head -1` does once it has its line): exit code and stderr."""
    proc = subprocess.Popen(
        [str(COMMAND), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), err


class TestPipes:
    def test_ceiling_into_a_closed_pipe_is_quiet(self, tmp_path: Path) -> None:
        code, err = closed_early("ceiling", "--parameters-billion", "8", cwd=tmp_path)
        assert (code, err) == (0, "")

    def test_replay_into_a_closed_pipe_is_quiet(self, tmp_path: Path) -> None:
        made = vllm_triage(
            "simulate", "--scenario", "kv_pressure", "--record", "rec", "--duration", "120",
            cwd=tmp_path,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        for fmt in ("text", "json"):
            code, err = closed_early("replay", "rec", "--format", fmt, cwd=tmp_path)
            assert code == 0 and "Traceback" not in err and "BrokenPipe" not in err, err

    def test_head_reads_its_lines(self, tmp_path: Path) -> None:
        """Through a real shell pipe: `ceiling ... | head -2` prints two lines, exit 0."""
        done = subprocess.run(
            f"'{COMMAND}' ceiling --parameters-billion 8 | head -2; exit ${{PIPESTATUS[0]}}",
            shell=True,
            executable="/bin/bash",
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert len(done.stdout.splitlines()) == 2


class TestGlobalFlags:
    @pytest.mark.parametrize(
        "args",
        [
            ("--log-format", "json", "check-config"),
            ("check-config", "--log-format", "json"),
            ("check-config", "--log-level", "debug", "--log-format", "console"),
        ],
    )
    def test_before_or_after_the_command(self, tmp_path: Path, args: tuple[str, ...]) -> None:
        result = vllm_triage(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["window_seconds"] == 60

    def test_after_the_command_wins_over_before(self, tmp_path: Path) -> None:
        """`run --log-format console` once said "unrecognized arguments"; now it runs (and
        stops at the missing targets, a settings error: 2), logging as told."""
        result = vllm_triage("--log-format", "json", "run", "--log-format", "console", cwd=tmp_path)
        assert result.returncode == 2
        assert "unrecognized arguments" not in result.stderr
        assert "no targets" in result.stderr

    @pytest.mark.parametrize("command", ["run", "check", "demo", "replay", "ceiling"])
    def test_each_commands_help_lists_them(self, tmp_path: Path, command: str) -> None:
        result = vllm_triage(command, "--help", cwd=tmp_path)
        assert result.returncode == 0
        for flag in ("--log-level", "--log-format", "-V, --version"):
            assert flag in result.stdout


class TestVersion:
    @pytest.mark.parametrize("args", [("--version",), ("-V",), ("replay", "-V")])
    def test_version_names_the_commit(self, tmp_path: Path, args: tuple[str, ...]) -> None:
        """From this checkout (an editable install), the commit comes from git."""
        result = vllm_triage(*args, cwd=tmp_path)
        assert result.returncode == 0
        assert re.fullmatch(
            r"vllm-triage \d+\.\d+\.\d+ \(commit [0-9a-f]{12}(\+dirty)?\)\n", result.stdout
        ), result.stdout

    def test_a_wheel_built_from_a_clone_carries_its_commit(self, tmp_path: Path) -> None:
        """`pip install .` in a fresh clone: the wheel holds vllm_triage/_commit.txt (setup.py)."""
        repo = ROOT
        clone = tmp_path / "clone"
        git = ["git", "-c", "advice.detachedHead=false"]
        subprocess.run([*git, "clone", "-q", str(repo), str(clone)], check=True, timeout=120)
        head = subprocess.run(
            ["git", "-C", str(clone), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "-w",
                str(tmp_path),
                str(clone),
            ],
            check=True,
            timeout=300,
            capture_output=True,
        )
        [wheel] = tmp_path.glob("vllm_triage-*.whl")
        with zipfile.ZipFile(wheel) as z:
            assert z.read("vllm_triage/_commit.txt").decode().strip() == head
            names = z.namelist()
        # The import package is vllm_triage: nothing claims the top-level name `daemon`,
        # which python-daemon owns (installed beside it, one would shadow the other).
        assert {n.split("/")[0] for n in names if not n.startswith("vllm_triage-")} == {
            "vllm_triage"
        }
        # Every folder of the source tree ships (a wing missing from pyproject.toml's
        # package list works in an editable install and breaks the installed command).
        source = repo / "daemon"
        wings = {
            "vllm_triage/" + p.parent.relative_to(source).as_posix() + "/__init__.py"
            for p in source.rglob("__init__.py")
            if p.parent != source
        }
        assert wings <= set(names), sorted(wings - set(names))


class TestMisspeltVariables:
    def test_refused_with_a_did_you_mean_exit_2(self, tmp_path: Path) -> None:
        """`VLLM_TRIAGE_INTERVAL_SECOND=1 vllm-triage check-config` once exited 0 having
        changed nothing."""
        env = {**os.environ, "VLLM_TRIAGE_INTERVAL_SECOND": "1"}
        result = subprocess.run(
            [str(COMMAND), "check-config"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2
        assert (
            "VLLM_TRIAGE_INTERVAL_SECOND: unknown variable; "
            "did you mean VLLM_TRIAGE_INTERVAL_SECONDS?"
        ) in result.stderr
