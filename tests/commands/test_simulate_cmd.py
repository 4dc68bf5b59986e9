"""`vllm-triage simulate` (tests for daemon/vllm_triage/commands/simulate.py and
daemon/vllm_triage/simulator/serve.py).

Run as a user would: the installed command in a subprocess, from a temporary directory,
with the default rules. The point of the recordings is that the daemon diagnoses each
scenario as the cause its physics produces, under either generation of vLLM's names.
"""

from __future__ import annotations

import itertools
import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.simulator import get_scenario
from vllm_triage.simulator.serve import CONTENT_TYPE, LiveSimulation

from support.clirun import HANG_S, spawn, stderr_lines, vllm_triage, wait_for_event
from support.harness import free_port
from support.parsing import parse_snapshot
from support.paths import BUNDLED_SCENARIOS

START_MS = 1_767_225_600_000  # the default --start, 2026-01-01T00:00:00Z
CAUSES = ("prefill_bound", "decode_bound", "queue_bound", "kv_pressure", "stalled")


def events(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def simulate_record(cwd: Path, scenario: str, *args: str) -> subprocess.CompletedProcess[str]:
    return vllm_triage("simulate", "--scenario", scenario, "--record", "rec", *args, cwd=cwd)


class TestRecordThenReplay:
    @pytest.mark.parametrize("naming", ["v1", "v0"])
    @pytest.mark.parametrize("scenario", ["healthy", *CAUSES])
    def test_only_the_scenarios_own_cause_fires(
        self, tmp_path: Path, scenario: str, naming: str
    ) -> None:
        """Ten simulated minutes, replayed with the default rules: the cause, nothing else."""
        made = simulate_record(tmp_path, scenario, "--duration", "600", "--naming", naming)
        assert made.returncode == 0, made.stderr
        assert f"wrote 121 scrapes of {scenario}" in made.stderr
        replayed = vllm_triage("replay", "rec", "--format", "json", cwd=tmp_path)
        assert replayed.returncode == 0, replayed.stderr
        fired = [e for e in events(replayed.stdout) if e["event"] == "firing"]
        if scenario == "healthy":
            assert replayed.stdout == ""
        else:
            assert fired, replayed.stderr
            assert {e["diagnosis"] for e in fired} == {scenario}
        if scenario == "stalled":
            # hung from 240 s to 540 s: fires at stall_after_seconds (30 s), resolves after
            at = [
                (e["event"], round(float(str(e["at"])) - START_MS / 1000))
                for e in events(replayed.stdout)
            ]
            assert at == [("firing", 270), ("resolved", 550)]


class TestRecord:
    def test_files_are_named_by_scrape_time_and_reproducible(self, tmp_path: Path) -> None:
        made = simulate_record(tmp_path, "queue_bound", "--duration", "30", "--interval", "10")
        assert made.returncode == 0, made.stderr
        names = sorted(p.name for p in (tmp_path / "rec").iterdir())
        assert names == [f"{START_MS + 10_000 * i}.prom" for i in range(4)]
        again = vllm_triage(
            "simulate", "--scenario", "queue_bound", "--record", "again", "--duration", "30",
            "--interval", "10", "--start", "1800000000.5", cwd=tmp_path,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        later = sorted(p.name for p in (tmp_path / "again").iterdir())
        assert later[0] == "1800000000500.prom"
        last = (tmp_path / "rec" / names[-1]).read_text()
        assert "vllm:num_requests_waiting" in last
        assert last == (tmp_path / "again" / later[-1]).read_text().replace(
            "1.8000000005e+09", "1.7672256e+09"
        )  # only the _created times differ

    def test_past_the_last_phase_the_load_goes_on(self, tmp_path: Path) -> None:
        """A recording longer than the scenario holds its last phase: still queue-bound."""
        path = tmp_path / "short.yaml"
        source = BUNDLED_SCENARIOS / "queue_bound.yaml"
        path.write_text(source.read_text().replace("duration_seconds: 600", "duration_seconds: 30"))
        made = vllm_triage(
            "simulate", "--scenario", str(path), "--record", "rec", "--duration", "120",
            "--interval", "60", cwd=tmp_path,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        last = sorted((tmp_path / "rec").iterdir())[-1].read_text()
        snapshot = parse_snapshot(last, 0.0)
        (series,) = snapshot.models.values()
        assert series.waiting is not None and series.waiting > 50

    def test_an_existing_recording_is_not_mixed_into(self, tmp_path: Path) -> None:
        (tmp_path / "rec").mkdir()
        (tmp_path / "rec" / "1.prom").write_text("x")
        made = simulate_record(tmp_path, "healthy", "--duration", "10")
        assert made.returncode == 1
        assert "already holds a recording" in made.stderr

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (("--scenario", "nope", "--record", "r", "--duration", "5"), "there are: decode_bound"),
            (("--scenario", "healthy", "--record", "r"), "--record needs --duration"),
            (("--scenario", "healthy", "--port", "0", "--start", "5"), "--start is only for"),
            (
                ("--scenario", "healthy", "--record", "r", "--duration", "5", "--speed", "2"),
                "--speed is only for --port",
            ),
            (("--scenario", "healthy"), "one of the arguments --record --port is required"),
            (("--scenario", "healthy", "--record", "r", "--port", "1"), "not allowed with"),
            (("--scenario", "healthy", "--port", "70000"), "must be 0 to 65535"),
        ],
        ids=[
            "unknown-scenario",
            "record-without-duration",
            "start-without-port",
            "speed-without-port",
            "neither-record-nor-port",
            "record-and-port",
            "port-out-of-range",
        ],
    )
    def test_command_line_errors_exit_2(
        self, tmp_path: Path, args: tuple[str, ...], message: str
    ) -> None:
        result = vllm_triage("simulate", *args, cwd=tmp_path)
        assert result.returncode == 2
        assert message in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / "r").exists()


class TestUserScenario:
    GOOD = """\
name: my-small-card
model_name: acme/tiny
server:
  gpu: rtx 4090
  num_gpu_blocks: 4096
  max_num_batched_tokens: 2048
  max_model_len: 8192
phases:
  - duration_seconds: 60
    workload: {arrival_rate_per_s: 2, prompt_tokens: 500, output_tokens: 100}
"""

    def test_a_users_file_records(self, tmp_path: Path) -> None:
        (tmp_path / "mine.yaml").write_text(self.GOOD)
        made = simulate_record(tmp_path, "./mine.yaml", "--duration", "60", "--naming", "v0")
        assert made.returncode == 0, made.stderr
        assert "wrote 13 scrapes of my-small-card" in made.stderr
        last = sorted((tmp_path / "rec").iterdir())[-1].read_text()
        assert 'vllm:gpu_cache_usage_perc{model_name="acme/tiny"}' in last
        assert parse_snapshot(last, 0.0).models["acme/tiny"].generation_tokens

    @pytest.mark.parametrize(
        ("old", "new", "key"),
        [
            (
                "  max_model_len: 8192",
                "  max_model_len: 8192\n  max_num_seq: 8",
                "server.max_num_seq",
            ),
            ("arrival_rate_per_s: 2", "arrival_rate_per_s: -2", "arrival_rate_per_s"),
        ],
    )
    def test_a_bad_file_exits_2_naming_the_key(
        self, tmp_path: Path, old: str, new: str, key: str
    ) -> None:
        (tmp_path / "bad.yaml").write_text(self.GOOD.replace(old, new))
        result = simulate_record(tmp_path, "bad.yaml", "--duration", "10")
        assert result.returncode == 2
        assert "bad.yaml" in result.stderr and key in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "rec").exists()


def counters(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample that may only grow: counters and histograms' buckets, counts and sums."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.type in ("counter", "histogram"):
            for s in family.samples:
                if not s.name.endswith("_created"):
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class TestServe:
    def test_tour_serves_metrics_that_move_forward_and_stops_on_sigterm(
        self, tmp_path: Path
    ) -> None:
        port = free_port()
        proc = spawn(
            tmp_path, "simulate", "--scenario", "tour", "--port", str(port), "--speed", "60"
        )
        try:
            started = wait_for_event(proc, "simulate_serving", HANG_S)
            assert (started["port"], started["scenario"], started["speed"]) == (port, "tour", 60.0)
            base = f"http://127.0.0.1:{port}"
            bodies: list[str] = []
            # 7 requests in all, ~2 s; each may wait for a busy machine to simulate.
            with httpx.Client(timeout=HANG_S) as client:
                for _ in range(4):
                    resp = client.get(f"{base}/metrics")
                    assert resp.status_code == 200
                    assert resp.headers["content-type"] == CONTENT_TYPE
                    bodies.append(resp.text)
                    time.sleep(0.5)
                assert client.get(f"{base}/health").status_code == 200
                assert client.get(f"{base}/nope").status_code == 404
                refused = client.post(f"{base}/metrics")
                assert refused.status_code == 405 and refused.headers["allow"] == "GET"
            snapshots = [parse_snapshot(b, float(i)) for i, b in enumerate(bodies)]
            tokens = [
                s.models["meta-llama/Llama-3.1-8B-Instruct"].generation_tokens or 0.0
                for s in snapshots
            ]
            assert tokens[-1] > tokens[0]  # ~2 s x 60 = 2 simulated minutes apart
            for before, after in itertools.pairwise(bodies):
                old, new = counters(before), counters(after)
                assert old.keys() <= new.keys()
                assert all(new[k] >= v for k, v in old.items()), "a counter went back"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=HANG_S) == 0
            rest = "".join(stderr_lines(proc, time.monotonic() + HANG_S))
            assert '"simulate_stopped"' in rest and '"signal"' in rest
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)

    def test_duration_ends_the_run_by_itself(self, tmp_path: Path) -> None:
        proc = spawn(
            tmp_path, "simulate", "--scenario", "healthy", "--port", "0", "--speed", "600",
            "--duration", "60", "--naming", "v0",
        )  # fmt: skip
        try:
            started = wait_for_event(proc, "simulate_serving", HANG_S)
            assert started["port"] != 0  # the port the OS chose is reported
            assert proc.wait(timeout=HANG_S) == 0
            rest = "".join(stderr_lines(proc, time.monotonic() + 5))
            assert '"duration"' in rest
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)

    def test_a_port_in_use_is_one_line_and_exit_2_as_in_run(self, tmp_path: Path) -> None:
        """A busy port is a settings problem: exit 2 in `simulate` as in `run`
        (tests/commands/test_run_cmd.py)."""
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            result = vllm_triage(
                "simulate", "--scenario", "healthy", "--port", str(port), cwd=tmp_path
            )
        assert result.returncode == 2
        assert result.stderr.strip() == (
            f"vllm-triage simulate: error: cannot listen on 127.0.0.1:{port}: "
            "Address already in use"
        )


class TestLiveSimulation:
    """The clock arithmetic, with a fake clock (no network)."""

    def test_virtual_time_is_wall_time_times_speed_and_never_goes_back(self) -> None:
        now = [100.0]
        live = LiveSimulation(
            get_scenario("healthy"), speed=60.0, naming="v1", clock=lambda: now[0], wall=lambda: 5.0
        )
        now[0] = 102.0
        assert live.advance() == 120.0
        now[0] = 101.0  # a clock that steps back does not take the simulation with it
        assert live.advance() == 120.0
        assert live.created_at == 5.0
        body = live.metrics().decode()
        assert "vllm:generation_tokens_created" in body and live.scrapes == 1

    def test_until_caps_the_time_and_marks_the_end(self) -> None:
        now = [0.0]
        live = LiveSimulation(
            get_scenario("healthy"), speed=1.0, naming="v1", until_s=30.0, clock=lambda: now[0]
        )
        now[0] = 10.0
        live.advance()
        assert not live.finished
        now[0] = 1e6  # far past the end: capped, not simulated
        assert live.advance() == 30.0 and live.finished
