"""``vllm-triage render rules|dashboard|relabel`` (daemon/vllm_triage/commands/render.py), run as
a user runs it: the defaults give the bundled files byte for byte, a settings file gives its own
numbers (fleet mode's shard rule: its buckets, label and the DCGM join's two sides), and bad
settings or an unwritable output are one clear line and exit 2. A real Prometheus loads the
shard rule in tests/system/test_integration.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from support.clirun import vllm_triage
from support.paths import ROOT

RULES = ROOT / "rules" / "prometheus" / "vllm-triage.rules.yaml"
PROMETHEUSRULE = ROOT / "deploy" / "kubernetes" / "prometheusrule.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "vllm-triage.json"

CUSTOM = """\
slo:
  ttft_p99_seconds: 1.5
  itl_p99_seconds: 0.05
"""


def exprs(text: str) -> dict[str, str]:
    groups = yaml.safe_load(text)["groups"]
    return {r.get("record") or r["alert"]: r["expr"] for g in groups for r in g["rules"]}


class TestDefaults:
    def test_rules_are_the_bundled_file(self, tmp_path: Path) -> None:
        result = vllm_triage("render", "rules", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout == RULES.read_text(encoding="utf-8")

    def test_prometheusrule_is_the_bundled_manifest(self, tmp_path: Path) -> None:
        result = vllm_triage("render", "rules", "--format", "prometheusrule", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout == PROMETHEUSRULE.read_text(encoding="utf-8")

    def test_dashboard_is_the_bundled_file(self, tmp_path: Path) -> None:
        result = vllm_triage("render", "dashboard", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout == DASHBOARD.read_text(encoding="utf-8")


ENGINES = ("sglang", "lmdeploy", "trtllm")


class TestEngines:
    """``--engine NAME`` (or ``--runtime``): the same records, causes and alerts over the
    engine's own series, as its spec in rules/runtimes/ names them."""

    @pytest.mark.parametrize("engine", ENGINES)
    def test_rules_are_the_bundled_file(self, engine: str, tmp_path: Path) -> None:
        result = vllm_triage("render", "rules", "--engine", engine, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        bundled = ROOT / "rules" / "prometheus" / f"{engine}-triage.rules.yaml"
        assert result.stdout == bundled.read_text(encoding="utf-8")

    def test_sglang_reads_its_own_series(self, tmp_path: Path) -> None:
        result = vllm_triage("render", "rules", "--runtime", "sglang", cwd=tmp_path)
        e = exprs(result.stdout)
        # KV pressure from the KV pool only, not token_usage (the max of every pool).
        assert "sglang:full_token_usage" in e["model:sglang_kv_cache_usage:max_1m"]
        assert "sglang:token_usage" not in result.stdout
        # The queue total, not its priority breakdown; tokens as the engine computes them.
        assert 'sglang:num_queue_reqs{priority=""}' in e["model:sglang_requests_waiting:avg_1m"]
        assert 'realtime_tokens_total{mode="decode"}' in e["model:sglang_generation_tokens:rate1m"]
        # Ranks summed, copies of one scheduler read once.
        assert "sum without (dp_rank" in e["model:sglang_ttft_seconds:mean_1m"]
        assert (
            "max without (tp_rank, pp_rank, moe_ep_rank, pid)"
            in e["model:sglang_ttft_seconds:mean_1m"]
        )
        assert e["model:sglang_triage_stalled:active"] == (
            "max without (dp_rank) (engine:sglang_triage_stalled:active)"
        )
        # No prefill time on SGLang: no prefill share record (the causes find none).
        assert "model:sglang_prefill_time:ratio_1m" not in e
        alerts = {
            r["alert"]: r
            for g in yaml.safe_load(result.stdout)["groups"]
            for r in g["rules"]
            if "alert" in r
        }
        kv = alerts["SglangKvPressure"]
        assert kv["labels"]["runtime"] == "sglang"
        assert "--mem-fraction-static" in kv["annotations"]["remediation"]
        assert "sleep_state" not in result.stdout

    def test_trtllm_progress_is_never_its_token_counters(self, tmp_path: Path) -> None:
        """TensorRT-LLM counts tokens when a request finishes: its stall watch reads the
        iteration latency, completions and the scheduler's gauges; its ITL is each
        request's mean, so no spike test is written."""
        result = vllm_triage("render", "rules", "--engine", "trtllm", cwd=tmp_path)
        e = exprs(result.stdout)
        progress = e["engine:trtllm_engine_progress:changes1m"]
        assert "trtllm_iteration_latency_seconds" in progress
        assert "trtllm_num_requests_completed_total" in progress
        assert "tokens_total" not in progress
        assert "p50_1m" not in e["model:trtllm_triage_prefill_bound:active"]
        assert "model:trtllm_preemptions:rate1m" not in e

    def test_prometheusrule_is_named_for_the_engine(self, tmp_path: Path) -> None:
        result = vllm_triage(
            "render", "rules", "--engine", "lmdeploy", "--format", "prometheusrule", cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
        doc = yaml.safe_load(result.stdout)
        assert doc["metadata"]["name"] == "vllm-triage-lmdeploy"
        assert doc["spec"]["groups"][0]["name"] == "lmdeploy-triage-signals"

    @pytest.mark.parametrize("engine", ENGINES)
    def test_dashboard_draws_the_engines_series(self, engine: str, tmp_path: Path) -> None:
        result = vllm_triage("render", "dashboard", "--engine", engine, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        board = json.loads(result.stdout)
        assert board["uid"] == f"vllm-triage-{engine}"
        exprs_ = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
        prefix = {"sglang": "sglang:", "lmdeploy": "lmdeploy:", "trtllm": "trtllm_"}[engine]
        assert any(prefix in x for x in exprs_)
        assert not any("vllm:" in x for x in exprs_)

    def test_vllm_is_the_default(self, tmp_path: Path) -> None:
        result = vllm_triage("render", "rules", "--engine", "vllm", cwd=tmp_path)
        assert result.stdout == RULES.read_text(encoding="utf-8")

    def test_an_unknown_engine_is_refused(self, tmp_path: Path) -> None:
        result = vllm_triage("render", "rules", "--engine", "tgi", cwd=tmp_path)
        assert result.returncode == 2
        assert "not an engine vllm-triage reads: 'tgi'" in result.stderr


class TestWithSettings:
    def test_rules_judge_by_the_files_slo(self, tmp_path: Path) -> None:
        config = tmp_path / "triage.yaml"
        config.write_text(CUSTOM, encoding="utf-8")
        out = tmp_path / "out.rules.yaml"
        result = vllm_triage(
            "render", "rules", "--config", str(config), "--output", str(out), cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout == ""
        assert f"wrote {out}" in result.stderr
        text = out.read_text(encoding="utf-8")
        assert text.startswith(
            "# GENERATED by `vllm-triage render rules` from rules/defaults.yaml, triage.yaml:"
        )
        e = exprs(text)
        assert "model:vllm_ttft_seconds:p99_1m > 1.5" in e["model:vllm_triage_prefill_bound:active"]
        assert "model:vllm_itl_seconds:p99_1m > 0.05" in e["model:vllm_triage_decode_bound:active"]
        assert "> 2)" not in e["model:vllm_triage_prefill_bound:active"]
        assert "> 0.1)" not in e["model:vllm_triage_decode_bound:active"]

    def test_an_environment_variable_counts_and_is_named(self, tmp_path: Path) -> None:
        result = vllm_triage(
            "render", "rules", cwd=tmp_path, env={"VLLM_TRIAGE_SLO__ITL_P99_SECONDS": "0.03"}
        )
        assert result.returncode == 0, result.stderr
        first = result.stdout.splitlines()[0]
        assert "VLLM_TRIAGE_SLO__ITL_P99_SECONDS" in first
        decode = exprs(result.stdout)["model:vllm_triage_decode_bound:active"]
        assert "model:vllm_itl_seconds:p99_1m > 0.03" in decode

    def test_the_output_is_replaced_whole(self, tmp_path: Path) -> None:
        out = tmp_path / "vllm-triage.json"
        out.write_text("x" * 500_000, encoding="utf-8")
        result = vllm_triage("render", "dashboard", "--output", str(out), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert out.read_text(encoding="utf-8") == DASHBOARD.read_text(encoding="utf-8")
        json.loads(out.read_text(encoding="utf-8"))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["vllm-triage.json"]  # no temp left


class TestRelabel:
    def test_the_default_rule_hashes_the_pod_into_256_buckets(self, tmp_path: Path) -> None:
        result = vllm_triage("render", "relabel", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        doc = yaml.safe_load(result.stdout)
        rule = {
            "source_labels": ["namespace", "pod"],
            "separator": "/",
            "modulus": 256,
            "target_label": "vllm_triage_shard",
            "action": "hashmod",
        }
        assert doc == {
            "vllm": {"metric_relabel_configs": [rule]},
            "dcgm": {"metric_relabel_configs": [rule]},
        }
        assert "prometheus.shard.buckets: 256" in result.stdout

    def test_the_settings_buckets_label_and_dcgm_join(self, tmp_path: Path) -> None:
        config = tmp_path / "triage.yaml"
        config.write_text(
            "source: prometheus\nprometheus:\n  url: http://prometheus:9090\n"
            "  shard: {count: 4, buckets: 64, label: bucket}\n"
            "  dcgm: {join: {namespace: exported_namespace, pod: exported_pod}}\n",
            encoding="utf-8",
        )
        result = vllm_triage("render", "relabel", "--config", str(config), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        doc = yaml.safe_load(result.stdout)
        vllm, dcgm = (doc[k]["metric_relabel_configs"][0] for k in ("vllm", "dcgm"))
        assert vllm["source_labels"] == ["namespace", "pod"]
        assert dcgm["source_labels"] == ["exported_namespace", "exported_pod"]
        assert vllm["modulus"] == dcgm["modulus"] == 64
        assert vllm["target_label"] == dcgm["target_label"] == "bucket"

    def test_format_is_refused(self, tmp_path: Path) -> None:
        result = vllm_triage("render", "relabel", "--format", "prometheusrule", cwd=tmp_path)
        assert result.returncode == 2
        assert "--format is for `render rules`" in result.stderr


class TestErrors:
    def test_bad_settings_exit_2_with_the_key(self, tmp_path: Path) -> None:
        config = tmp_path / "triage.yaml"
        config.write_text("slo:\n  itl_p99_seconds: -1\n", encoding="utf-8")
        out = tmp_path / "rules.yaml"
        result = vllm_triage(
            "render", "rules", "--config", str(config), "--output", str(out), cwd=tmp_path
        )
        assert result.returncode == 2
        assert "configuration error" in result.stderr
        assert "slo.itl_p99_seconds" in result.stderr
        assert "Traceback" not in result.stderr
        assert not out.exists()

    def test_a_missing_settings_file_exits_2(self, tmp_path: Path) -> None:
        result = vllm_triage("render", "dashboard", "--config", "nope.yaml", cwd=tmp_path)
        assert result.returncode == 2
        assert "nope.yaml" in result.stderr and "Traceback" not in result.stderr
        assert result.stdout == ""

    def test_an_unwritable_output_exits_2(self, tmp_path: Path) -> None:
        out = tmp_path / "no" / "such" / "dir" / "rules.yaml"
        result = vllm_triage("render", "rules", "--output", str(out), cwd=tmp_path)
        assert result.returncode == 2
        assert result.stderr.startswith(f"vllm-triage render: cannot write {out}")
        assert "Traceback" not in result.stderr

    def test_format_is_for_rules_only(self, tmp_path: Path) -> None:
        result = vllm_triage("render", "dashboard", "--format", "prometheusrule", cwd=tmp_path)
        assert result.returncode == 2
        assert "--format is for `render rules`" in result.stderr

    def test_what_to_render_is_required(self, tmp_path: Path) -> None:
        result = vllm_triage("render", cwd=tmp_path)
        assert result.returncode == 2
        assert "rules" in result.stderr and "dashboard" in result.stderr


def test_listed_in_the_help(tmp_path: Path) -> None:
    result = vllm_triage("--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "render" in result.stdout
    assert "vllm-triage render rules --config triage.yaml" in result.stdout
