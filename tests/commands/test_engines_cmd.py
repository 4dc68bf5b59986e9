"""Every engine through the commands a user runs: ``check``, ``record``, ``replay`` and
``run`` read each engine's simulated dialect (SGLang, LMDeploy, TensorRT-LLM, vLLM's Rust
frontend) and each engine's own fixture, name the engine, and give the cause its physics
says; a named engine that the scrape contradicts is one clear line."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from vllm_triage.commands.check import check
from vllm_triage.config.load import load_settings
from vllm_triage.errors import ConfigError
from vllm_triage.serve.exporter import build_registry
from vllm_triage.simulator import get_scenario

from support.clirun import HANG_S, vllm_triage
from support.clock import FakeClock
from support.harness import running_daemon, simulated_on, wait_for
from support.localserver import replies, serving
from support.paths import RUNTIME_FIXTURES
from support.scenarios import write_recording

#: Each dialect, and the engine as the words show it.
SHOWN = {
    "sglang": "SGLang",
    "lmdeploy": "LMDeploy",
    "trtllm": "TensorRT-LLM",
    "vllm-rust": "vLLM (Rust frontend)",
}
#: Each engine's fixture: made by its own metrics code (tests/fixtures/runtimes/SOURCES.md).
FIXTURES = {
    "sglang": RUNTIME_FIXTURES / "sglang" / "sglang-0.5.23.txt",
    "lmdeploy": RUNTIME_FIXTURES / "lmdeploy" / "lmdeploy-0.18.0.txt",
    "trtllm": RUNTIME_FIXTURES / "trtllm" / "trtllm-serve.txt",
    "vllm-rust": RUNTIME_FIXTURES / "vllm-rust" / "vllm-0.34.0-rust-frontend.txt",
}
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class TestCheck:
    @pytest.mark.parametrize("engine", list(SHOWN))
    def test_each_dialect_gives_its_cause_and_names_the_engine(self, engine: str) -> None:
        """A queue-bound server in each engine's dialect: the same verdict, and the
        engine the scrape showed."""
        clock = FakeClock()
        scenario = get_scenario("queue_bound")
        with simulated_on(clock, scenario, speed=10.0, naming=engine) as url:  # type: ignore[arg-type]
            clock.sleep(1.0)
            result = check(
                url, window=6, scrapes=4, timeout=5, config=None, sleep=clock.sleep, clock=clock
            )
        assert result["runtime"] == SHOWN[engine]
        assert result["verdict"] == "incident", result
        assert result["models"][0]["cause"] == "queue_bound"

    @pytest.mark.parametrize("engine", list(FIXTURES))
    def test_each_engines_own_bytes_are_read(self, engine: str, tmp_path: Path) -> None:
        """The engine's fixture served as it is: recognised, its model read, and judged as
        what it is: a server whose series do not move while requests are outstanding
        (the fixtures have requests running) is a hung engine."""
        body = FIXTURES[engine].read_bytes()
        ctype = (
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
            if engine == "vllm-rust"
            else "text/plain; version=0.0.4; charset=utf-8"
        )
        # A stall is judged after stall_after_seconds of no progress: 2 s here, not 30.
        config = tmp_path / "fast.yaml"
        config.write_text("thresholds:\n  stall_after_seconds: 2\n", encoding="utf-8")
        with serving(replies((200, body), content_type=ctype)) as srv:
            result = vllm_triage(
                "check",
                srv.url("/metrics"),
                "--window",
                "0.3",
                "--config",
                str(config),
                "--format",
                "json",
                cwd=tmp_path,
            )
        assert result.returncode == 1, result.stderr
        report = json.loads(result.stdout)
        assert report["runtime"] == SHOWN[engine]
        assert [m["cause"] for m in report["models"]] == ["stalled"], report

    def test_a_named_engine_the_scrape_contradicts_is_one_clear_line(self, tmp_path: Path) -> None:
        body = FIXTURES["sglang"].read_bytes()
        with serving(replies((200, body))) as srv:
            result = vllm_triage(
                "check",
                srv.url("/metrics"),
                "--runtime",
                "lmdeploy",
                "--window",
                "0.3",
                cwd=tmp_path,
            )
        assert result.returncode == 3
        assert "the target's settings name the runtime LMDeploy, but its metrics are SGLang" in (
            result.stdout + result.stderr
        )

    def test_trtllm_named_gets_its_metrics_path(self, tmp_path: Path) -> None:
        """trtllm-serve's Prometheus text is at /prometheus/metrics (its /metrics is JSON):
        named, a URL without a path gets that path."""
        body = FIXTURES["trtllm"].read_bytes()
        config = tmp_path / "fast.yaml"
        config.write_text("thresholds:\n  stall_after_seconds: 2\n", encoding="utf-8")
        with serving(replies((200, body))) as srv:
            base = srv.url("/")
            result = vllm_triage(
                "check",
                base,
                "--engine",
                "trtllm",
                "--config",
                str(config),
                "--window",
                "0.3",
                "--format",
                "json",
                cwd=tmp_path,
            )
            paths = {r.path for r in srv.requests}
        assert paths == {"/prometheus/metrics"}, paths
        assert json.loads(result.stdout)["runtime"] == "TensorRT-LLM"

    def test_an_unknown_engine_is_a_usage_error(self, tmp_path: Path) -> None:
        result = vllm_triage(
            "check", "http://127.0.0.1:1/metrics", "--runtime", "tgi", cwd=tmp_path
        )
        assert result.returncode == 2
        assert "not an engine vllm-triage reads: 'tgi'" in result.stderr


class TestReplay:
    @pytest.mark.parametrize("engine", list(SHOWN))
    @pytest.mark.parametrize("scenario", ["kv_pressure", "prefill_bound"])
    def test_each_dialects_recording_fires_its_cause(
        self, engine: str, scenario: str, tmp_path: Path
    ) -> None:
        rec = write_recording(tmp_path / "rec", scenario, naming=engine)  # type: ignore[arg-type]
        result = vllm_triage("replay", str(rec), "--format", "json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        first = json.loads(result.stdout.splitlines()[0])
        assert (first["event"], first["diagnosis"]) == ("firing", scenario)

    def test_a_recording_of_the_fixtures_reads_every_engine(self, tmp_path: Path) -> None:
        """A recording of each engine's own bytes (two scrapes) replays without a skipped
        file, and an SGLang recording replayed as LMDeploy's says it is not."""
        for engine, path in FIXTURES.items():
            rec = tmp_path / engine
            rec.mkdir()
            for ms in (1_767_225_600_000, 1_767_225_605_000):
                shutil.copy(path, rec / f"{ms}.prom")
            result = vllm_triage("replay", str(rec), "--strict", cwd=tmp_path)
            assert result.returncode == 0, (engine, result.stderr)
            assert "replayed 2 files (0 skipped)" in result.stdout + result.stderr
        wrong = vllm_triage(
            "replay", str(tmp_path / "sglang"), "--runtime", "lmdeploy", cwd=tmp_path
        )
        assert "but its metrics are SGLang" in wrong.stdout + wrong.stderr


class TestSimulate:
    @pytest.mark.parametrize("engine", list(SHOWN))
    def test_simulate_engine_records_what_replay_reads_as_that_engine(
        self, engine: str, tmp_path: Path
    ) -> None:
        """``simulate --engine NAME --record`` then ``replay``: the scenario's cause,
        judged from the engine's own names (the replay names it in the evidence's
        limits where it has any)."""
        made = vllm_triage(
            "simulate",
            "--scenario",
            "queue_bound",
            "--engine",
            engine,
            "--record",
            "rec",
            "--duration",
            "240",
            cwd=tmp_path,
        )
        assert made.returncode == 0, made.stderr
        body = next(iter(sorted((tmp_path / "rec").glob("*.prom")))).read_text(encoding="utf-8")
        prefix = {"sglang": "sglang:", "lmdeploy": "lmdeploy:", "trtllm": "trtllm_"}
        assert prefix.get(engine, "vllm:") in body
        replayed = vllm_triage("replay", "rec", "--format", "json", cwd=tmp_path)
        fired = [json.loads(line) for line in replayed.stdout.splitlines() if line.strip()]
        assert {e["diagnosis"] for e in fired if e["event"] == "firing"} == {"queue_bound"}


class TestWhatif:
    def test_another_engines_recording_says_what_the_replay_is(self, tmp_path: Path) -> None:
        """whatif replays a recording of any engine through the simulator's scheduler, and
        says so: the change keys stand for the engine's own settings."""
        rec = write_recording(tmp_path / "rec", "queue_bound", duration=240, naming="sglang")
        result = vllm_triage("whatif", str(rec), "--change", "max_num_seqs=64", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "note: a recording of SGLang: replayed through the simulator's" in result.stdout
        assert "queue_bound diagnosed" in result.stdout


class TestRecord:
    def test_record_names_the_engine_and_keeps_its_bytes(self, tmp_path: Path) -> None:
        body = FIXTURES["lmdeploy"].read_bytes()
        with serving(replies((200, body))) as srv:
            result = vllm_triage(
                "record",
                srv.url("/metrics"),
                "--runtime",
                "lmdeploy",
                "--out",
                "rec",
                "--interval",
                "0.2",
                "--duration",
                "0.5",
                # The per-scrape timeout apart from the 0.2 s interval (by default the
                # same), as the record command's own tests: a busy host is slower than that.
                "--timeout",
                "30",
                cwd=tmp_path,
            )
        assert result.returncode == 0, result.stderr
        files = sorted((tmp_path / "rec").glob("*.prom"))
        assert files and files[0].read_bytes() == body


class TestRun:
    @pytest.mark.parametrize("engine", list(SHOWN))
    def test_the_daemon_judges_each_engine_and_labels_it(self, engine: str) -> None:
        """The daemon against a KV-pressured server in each engine's dialect (its clock and
        the server's 25x real time): the incident opens on kv_pressure, the target says
        its engine once, and every gauge of it carries ``runtime``."""
        start = time.time()

        def clock() -> float:
            return start + 25.0 * (time.time() - start)

        name = engine.split("-", maxsplit=1)[0]
        scenario = get_scenario("kv_pressure")
        with simulated_on(clock, scenario, speed=1.0, naming=engine) as url:  # type: ignore[arg-type]
            settings = load_settings(
                flags={
                    "listen": "127.0.0.1:0",
                    "interval_seconds": 0.2,
                    "state_dir": None,
                    "targets": [{"name": "t", "url": url, "runtime": name}],
                }
            )
            with capture_logs() as logs, running_daemon(settings, clock=clock) as d:
                (scraper,) = d.scrapers
                st = scraper.target.state

                def fired() -> bool:
                    return st.view is not None and any(
                        a.cause == "kv_pressure" for a in st.view.active
                    )

                wait_for(fired, timeout=HANG_S)
                metrics = generate_latest(build_registry(lambda: [st], list)).decode()
        assert st.runtime == name
        detected = [e for e in logs if e["event"] == "runtime_detected"]
        assert [e["runtime"] for e in detected] == [SHOWN[engine]]
        assert (
            f'vllm_triage_diagnosis{{diagnosis="kv_pressure",model_name="{MODEL}",'
            f'runtime="{name}",target="t"}} 1.0'
        ) in metrics

    @pytest.mark.parametrize("engine", list(FIXTURES))
    def test_the_daemon_judges_each_engines_own_bytes(self, engine: str) -> None:
        """The daemon scraping an engine's fixture, unchanged scrape after scrape: the
        engine is said, and the bytes judged as what they show (requests outstanding,
        nothing moving: stalled, after a 1 s stall_after_seconds here)."""
        body = FIXTURES[engine].read_bytes()
        with serving(replies((200, body))) as server:
            settings = load_settings(
                flags={
                    "listen": "127.0.0.1:0",
                    "interval_seconds": 0.2,
                    "state_dir": None,
                    "thresholds": {"stall_after_seconds": 1},
                    "targets": [{"name": "t", "url": server.url("/metrics")}],
                }
            )
            with running_daemon(settings) as d:
                (scraper,) = d.scrapers
                st = scraper.target.state

                def stalled() -> bool:
                    return st.view is not None and any(a.cause == "stalled" for a in st.view.active)

                wait_for(stalled, timeout=HANG_S)
        assert st.runtime == engine.split("-", maxsplit=1)[0]

    def test_an_unknown_runtime_in_the_settings_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="'tgi' is not an engine vllm-triage reads"):
            load_settings(flags={"targets": [{"url": "http://a:8000", "runtime": "tgi"}]})

    def test_engine_is_taken_for_runtime_and_names_the_path(self) -> None:
        """``engine: trtllm`` (the word many users reach for) is the runtime key; a URL
        without a path gets trtllm-serve's /prometheus/metrics; both keys are an error."""
        s = load_settings(flags={"targets": [{"url": "http://a:8000", "engine": "trtllm"}]})
        (target,) = s.targets
        assert target.runtime == "trtllm"
        assert str(target.url) == "http://a:8000/prometheus/metrics"
        with pytest.raises(ConfigError, match="not both runtime and engine"):
            load_settings(
                flags={"targets": [{"url": "http://a:8000", "engine": "vllm", "runtime": "vllm"}]}
            )
