"""rules/prometheus/: the diagnosis in PromQL, checked and unit-tested with promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_triage.rules import read_bundled

from support.clirun import HANG_S
from support.rule_tests import DIALECTS, NAMINGS, RULES_DIR, TESTS_DIR, path_for, render

RULES = RULES_DIR / "vllm-triage.rules.yaml"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool not found: install Debian's prometheus package")
    return subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=HANG_S, check=False, cwd=cwd
    )


def exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return {r.get("record") or r["alert"]: r["expr"] for g in groups for r in g["rules"]}


class TestGenerated:
    @pytest.mark.parametrize("naming", (*NAMINGS, *DIALECTS))
    def test_committed_tests_are_what_the_simulator_gives(self, naming: str) -> None:
        """rules/prometheus/tests/scenarios-*.yaml are current: `python tests/support/rule_tests.py`
        regenerates them byte for byte (the simulator is deterministic)."""
        assert path_for(naming).read_text(encoding="utf-8") == render(naming)

    def test_thresholds_are_the_defaults(self) -> None:
        """The PromQL uses rules/defaults.yaml's SLOs, not numbers of its own."""
        d = read_bundled("defaults.yaml")
        e = exprs()
        slo, th = d["slo"], d["thresholds"]
        assert (
            f"model:vllm_ttft_seconds:p99_1m > {slo['ttft_p99_seconds']:g}"
            in e["model:vllm_triage_prefill_bound:active"]
        )
        assert (
            f"model:vllm_itl_seconds:p99_1m > {slo['itl_p99_seconds']:g}"
            in e["model:vllm_triage_decode_bound:active"]
        )
        assert (
            f"model:vllm_requests_waiting:avg_1m >= {slo['waiting_requests']:g}"
            in e["model:vllm_triage_queue_bound:active"]
        )
        prefill = e["model:vllm_triage_prefill_bound:active"]
        assert f">= {th['itl_spike_ratio']:g}" in prefill
        assert f"model:vllm_prefill_time:ratio_1m > {th['prefill_dominant_share']:g}" in prefill
        assert f"model:vllm_queue_time_ttft:ratio_1m >= {th['queue_share_of_ttft']:g}" in prefill


@pytest.mark.prometheus
class TestPromtool:
    def test_check_rules(self) -> None:
        result = promtool("check", "rules", str(RULES))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS: 34 rules found" in result.stdout

    @pytest.mark.parametrize("engine", ("sglang", "lmdeploy", "trtllm"))
    def test_check_each_engines_rules(self, engine: str) -> None:
        """Every engine's rules are valid; SGLang, LMDeploy and TensorRT-LLM have no
        sleep mode, so one rule fewer than vLLM's."""
        result = promtool("check", "rules", str(RULES_DIR / f"{engine}-triage.rules.yaml"))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS: 33 rules found" in result.stdout

    def test_each_scenario_fires_exactly_its_alert(self) -> None:
        """promtool test rules over every committed test file: each simulated scenario,
        under both namings and in every engine's dialect, fires its own alert and no
        other; healthy fires none."""
        files = sorted(str(p) for p in TESTS_DIR.glob("*.test.yaml"))
        assert len(files) == 7
        result = promtool("test", "rules", *files)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.count("SUCCESS") == 7

    def test_the_tests_catch_a_wrong_rule(self, tmp_path: Path) -> None:
        """The scenario tests can fail: with KV pressure's usage cut-off raised out of
        reach, the kv_pressure scenario no longer fires its alert and promtool says so."""
        broken = RULES.read_text(encoding="utf-8").replace(
            "(model:vllm_kv_cache_usage:max_1m >= 0.9)", "(model:vllm_kv_cache_usage:max_1m >= 1.5)"
        )
        assert broken != RULES.read_text(encoding="utf-8")
        (tmp_path / "vllm-triage.rules.yaml").write_text(broken, encoding="utf-8")
        (tmp_path / "tests").mkdir()
        shutil.copy(path_for("v1"), tmp_path / "tests" / "scenarios-v1.test.yaml")
        result = promtool("test", "rules", "tests/scenarios-v1.test.yaml", cwd=tmp_path)
        assert result.returncode != 0
        assert 'exp: {alertname="VllmKvPressure"}' in result.stdout + result.stderr
