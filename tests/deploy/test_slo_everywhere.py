"""One SLO, rendered everywhere: the daemon judges by ``slo.*`` and ``thresholds.*``; the
PromQL rules and the Grafana dashboard are rendered from the same settings
(daemon/vllm_triage/render/), the bundled files are what the defaults render, the daemon exports its
SLOs for the dashboard to draw, and the simulated compose stack shows the SLO it judges by.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.commands.render import objectives_of, origin
from vllm_triage.config.load import load_settings
from vllm_triage.config.rulebook import slo_of
from vllm_triage.render import templates
from vllm_triage.render.templates import Objectives, dashboard, number, prometheusrule, rules
from vllm_triage.serve.exporter import build_registry

from support.clirun import HANG_S
from support.harness import refused_port, running_daemon
from support.paths import PACKAGE, ROOT

RULES = ROOT / "rules" / "prometheus" / "vllm-triage.rules.yaml"
PROMETHEUSRULE = ROOT / "deploy" / "kubernetes" / "prometheusrule.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "vllm-triage.json"
COMPOSE = ROOT / "deploy" / "compose"
SIMULATED = COMPOSE / "triage.simulated.yaml"
SIMULATED_RULES = COMPOSE / "rules.simulated" / "vllm-triage.rules.yaml"
ASSETS = PACKAGE / "render" / "assets"

#: Every number the rendered files take from the settings, none of them a default.
CUSTOM = Objectives(
    ttft_p99_seconds=1.25,
    itl_p99_seconds=0.035,
    waiting_requests=3,
    queue_share_of_ttft=0.4,
    prefill_dominant_share=0.6,
    itl_spike_ratio=6,
    near_ceiling_ratio=0.8,
    roofline_impossible_ratio=1.5,
    stall_after_seconds=45,
    open_after=5,
    origin="custom.yaml",
)


def defaults() -> Objectives:
    return objectives_of(load_settings(), origin(None))


def simulated() -> Objectives:
    return objectives_of(load_settings(SIMULATED), origin(str(SIMULATED)))


def groups(text: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load(text)["groups"]
    return found


def exprs(text: str) -> dict[str, str]:
    return {r.get("record") or r["alert"]: r["expr"] for g in groups(text) for r in g["rules"]}


def panel(board: dict[str, Any], metric: str) -> dict[str, Any]:
    [found] = [
        p
        for p in board["panels"]
        if any(metric in t["expr"] for t in p["targets"]) and p["title"].startswith(("TTFT", "ITL"))
    ]
    return found


class TestTheBundledFilesAreTheDefaultsRender:
    def test_rules(self) -> None:
        assert RULES.read_text(encoding="utf-8") == rules(defaults())

    def test_prometheusrule(self) -> None:
        assert PROMETHEUSRULE.read_text(encoding="utf-8") == prometheusrule(defaults())

    def test_dashboard(self) -> None:
        assert DASHBOARD.read_text(encoding="utf-8") == dashboard(defaults())


class TestRules:
    def test_every_threshold_is_the_settings(self) -> None:
        e = exprs(rules(CUSTOM))
        prefill = e["model:vllm_triage_prefill_bound:active"]
        assert prefill.count("model:vllm_ttft_seconds:p99_1m > 1.25") == 2
        assert "model:vllm_itl_seconds:p99_1m > 0.035" in prefill
        assert "model:vllm_itl_seconds:p50_1m >= 6" in prefill
        assert "model:vllm_queue_time_ttft:ratio_1m >= 0.4" in prefill
        assert prefill.count("model:vllm_prefill_time:ratio_1m > 0.6") == 2
        assert "model:vllm_itl_seconds:p99_1m > 0.035" in e["model:vllm_triage_decode_bound:active"]
        queue = e["model:vllm_triage_queue_bound:active"]
        assert "model:vllm_requests_waiting:avg_1m >= 3" in queue
        assert "model:vllm_prefill_time:ratio_1m > 0.6" in queue
        kv = e["model:vllm_triage_kv_pressure:active"]
        assert "model:vllm_ttft_seconds:p99_1m > 1.25" in kv
        assert "model:vllm_requests_waiting:avg_1m >= 3" in kv

    def test_no_default_number_is_left_in_a_comparison(self) -> None:
        """Each comparison against a signal is the settings' number: none of the
        defaults' survives (the KV usage cut-off, a PromQL stand-in for the daemon's
        headroom, and the notification backlog are not settings)."""
        text = rules(CUSTOM)
        found = re.findall(r"(model:\w+:\w+) (>=|>) ([0-9.]+)", text)
        assert found
        fixed = {("model:vllm_kv_cache_usage:max_1m", ">=", "0.9")}
        zero = {(m, op, v) for m, op, v in found if v == "0"}  # "> 0": present, nonzero
        custom = {"1.25", "0.035", "3", "0.4", "0.6", "6"}
        assert {f for f in found if f[2] not in custom} == fixed | zero

    def test_alerts_wait_open_after_evaluations(self) -> None:
        fors = {
            r["alert"]: r.get("for")
            for g in groups(rules(CUSTOM))
            for r in g["rules"]
            if "alert" in r and "diagnosis" in r.get("labels", {})
        }
        assert fors.pop("VllmEngineStalled") == "30s"  # its own timing: the header says why
        assert set(fors.values()) == {f"{5 * templates.RULE_INTERVAL_SECONDS}s"}
        assert groups(rules(CUSTOM))[0]["interval"] == f"{templates.RULE_INTERVAL_SECONDS}s"

    def test_the_header_says_what_it_judges_by(self) -> None:
        head = rules(CUSTOM).split("groups:")[0]
        assert head.startswith("# GENERATED by `vllm-triage render rules` from custom.yaml:")
        assert "TTFT p99 > 1.25 s, ITL p99 > 0.035 s, mean requests waiting >= 3" in head
        assert "stall_after_seconds of 45" in head

    def test_only_the_numbers_differ_from_the_defaults(self) -> None:
        """Same groups, same rules, same names, in the same order."""
        mine, default = groups(rules(CUSTOM)), groups(rules(defaults()))
        names = [[r.get("record") or r["alert"] for r in g["rules"]] for g in mine]
        assert names == [[r.get("record") or r["alert"] for r in g["rules"]] for g in default]
        strip = re.compile(r"\d+(\.\d+)?")
        assert [strip.sub("N", json.dumps(g)) for g in mine] == [
            strip.sub("N", json.dumps(g)) for g in default
        ]

    def test_the_prometheusrule_carries_the_same_groups(self) -> None:
        manifest = yaml.safe_load(prometheusrule(CUSTOM))
        assert manifest["kind"] == "PrometheusRule"
        assert manifest["spec"]["groups"] == groups(rules(CUSTOM))
        assert "custom.yaml" in prometheusrule(CUSTOM).splitlines()[0]


class TestDashboard:
    def test_thresholds_are_the_settings(self) -> None:
        board = json.loads(dashboard(CUSTOM))
        [stall] = [p for p in board["panels"] if "vllm_triage_no_progress_seconds" in json.dumps(p)]
        steps = [s["value"] for s in stall["fieldConfig"]["defaults"]["thresholds"]["steps"]]
        assert steps == [None, 45]
        [roof] = [p for p in board["panels"] if "decode_roofline_ratio" in json.dumps(p["targets"])]
        steps = [s["value"] for s in roof["fieldConfig"]["defaults"]["thresholds"]["steps"]]
        assert steps == [None, 0.8, 1.5]

    def test_the_slo_lines_come_from_the_daemon_not_the_file(self) -> None:
        """The SLOs change nothing in the dashboard: its lines read the gauge."""
        base = dashboard(defaults())
        other = dashboard(
            Objectives(
                ttft_p99_seconds=9,
                itl_p99_seconds=0.009,
                waiting_requests=9,
                queue_share_of_ttft=0.9,
                prefill_dominant_share=0.9,
                itl_spike_ratio=9,
                near_ceiling_ratio=defaults().near_ceiling_ratio,
                roofline_impossible_ratio=defaults().roofline_impossible_ratio,
                stall_after_seconds=defaults().stall_after_seconds,
                open_after=9,
                origin="elsewhere.yaml",
            )
        )
        assert other == base
        board = json.loads(base)
        for metric, slo in (
            ("vllm_triage_ttft_p99", "ttft_p99"),
            ("vllm_triage_itl_p99", "itl_p99"),
        ):
            p = panel(board, metric)
            assert any(f'vllm_triage_slo_seconds{{slo="{slo}"}}' in t["expr"] for t in p["targets"])
            assert not re.search(r"SLO[^a-z]*[<>]|\d+(\.\d+)? ?s\b", p["title"]), p["title"]


class TestTheDaemonExportsItsSlo:
    def samples(self, config: Path | None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        settings = load_settings(config)
        registry = build_registry(
            lambda: [], lambda: [], slo=slo_of(settings.slo), process_metrics=False
        )
        out = {}
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def test_the_gauges_are_the_settings(self) -> None:
        got = self.samples(SIMULATED)
        assert got[("vllm_triage_slo_seconds", (("slo", "itl_p99"),))] == 0.024
        assert got[("vllm_triage_slo_seconds", (("slo", "ttft_p99"),))] == 2.0
        assert got[("vllm_triage_slo_waiting_requests", ())] == 1.0

    def test_the_running_daemon_serves_its_settings(self) -> None:
        """Wired by the assembly: `run` with an ITL SLO of 24 ms says so at /metrics."""
        settings = load_settings(
            flags={
                "listen": "127.0.0.1:0",
                "state_dir": None,
                "slo": {"itl_p99_seconds": 0.024},
                "targets": [{"name": "t", "url": f"http://127.0.0.1:{refused_port()}/metrics"}],
            }
        )
        with running_daemon(settings) as daemon:
            text = httpx.get(daemon.url + "/metrics", timeout=5).text
        assert 'vllm_triage_slo_seconds{slo="itl_p99"} 0.024' in text
        assert 'vllm_triage_slo_seconds{slo="ttft_p99"} 2.0' in text

    def test_none_without_slo(self) -> None:
        registry = build_registry(lambda: [], lambda: [], process_metrics=False)
        text = generate_latest(registry).decode()
        assert "vllm_triage_slo_seconds" not in text
        assert "vllm_triage_slo_waiting_requests" not in text


class TestTheSimulatedStack:
    """compose.simulated.yaml's daemon judges ITL p99 at 24 ms: its Prometheus and its
    Grafana must too, not at the defaults' 100 ms."""

    def stack(self) -> dict[str, Any]:
        found: dict[str, Any] = yaml.safe_load(
            (COMPOSE / "compose.simulated.yaml").read_text(encoding="utf-8")
        )
        return found

    def mounted(self, service: str, target: str) -> Path:
        for volume in self.stack()["services"][service]["volumes"]:
            source, where, *_ = volume.split(":")
            if where == target:
                return (COMPOSE / source).resolve()
        raise AssertionError(f"{service} mounts nothing at {target}")

    def test_the_daemon_judges_at_24_ms(self) -> None:
        assert load_settings(SIMULATED).slo.itl_p99_seconds == 0.024

    def test_its_prometheus_loads_the_rules_rendered_from_its_settings(self) -> None:
        folder = self.mounted("prometheus", "/etc/prometheus/rules")
        assert folder == SIMULATED_RULES.parent.resolve()
        assert SIMULATED_RULES.read_text(encoding="utf-8") == rules(simulated())
        decode = exprs(SIMULATED_RULES.read_text(encoding="utf-8"))
        assert (
            "model:vllm_itl_seconds:p99_1m > 0.024"
            in decode["model:vllm_triage_decode_bound:active"]
        )

    def test_its_grafana_draws_the_daemons_slo(self) -> None:
        """The dashboard it mounts is what its settings render, and its ITL line is the
        daemon's gauge, which says 0.024 (above): no 0.1 drawn anywhere for ITL."""
        folder = self.mounted("grafana", "/var/lib/grafana/dashboards")
        text = (folder / "vllm-triage.json").read_text(encoding="utf-8")
        assert text == dashboard(simulated())
        itl = panel(json.loads(text), "vllm_triage_itl_p99")
        assert any('vllm_triage_slo_seconds{slo="itl_p99"}' in t["expr"] for t in itl["targets"])
        assert "0.1" not in json.dumps(itl["fieldConfig"]) + itl["title"]


class TestEveryStackAgrees:
    """Wherever a daemon's settings ship beside rules, the rules judge by those settings
    (the header may differ: it names the file the numbers came from)."""

    def test_the_gpu_compose_stack(self, tmp_path: Path) -> None:
        stack = yaml.safe_load((COMPOSE / "compose.yaml").read_text(encoding="utf-8"))
        [rules_dir] = [
            v.split(":")[0] for v in stack["services"]["prometheus"]["volumes"]
            if v.split(":")[1] == "/etc/prometheus/rules"
        ]  # fmt: skip
        mounted = (COMPOSE / rules_dir / "vllm-triage.rules.yaml").read_text(encoding="utf-8")
        settings = objectives_of(load_settings(COMPOSE / "triage.yaml"), "x")
        assert groups(mounted) == groups(rules(settings))

    def test_the_kubernetes_sidecar(self, tmp_path: Path) -> None:
        configmap = yaml.safe_load(
            (ROOT / "deploy" / "kubernetes" / "configmap.yaml").read_text(encoding="utf-8")
        )
        path = tmp_path / "triage.yaml"
        path.write_text(configmap["data"]["triage.yaml"], encoding="utf-8")
        manifest = yaml.safe_load(PROMETHEUSRULE.read_text(encoding="utf-8"))
        assert manifest["spec"]["groups"] == groups(rules(objectives_of(load_settings(path), "x")))


class TestTemplates:
    def test_numbers_read_back(self) -> None:
        assert [number(x) for x in (2.0, 0.1, 0.024, 1e-5, 45, 1.25)] == [
            "2", "0.1", "0.024", "1e-05", "45", "1.25",
        ]  # fmt: skip
        for x in (2.0, 0.1, 0.024, 1e-5, 1.0 / 3):
            assert float(number(x)) == x and json.loads(number(x)) == x

    def test_a_missing_value_or_an_unused_one_is_refused(self) -> None:
        with pytest.raises(KeyError):
            templates.fill("a @{x} b", {})
        with pytest.raises(ValueError, match="does not use"):
            templates.fill("a @{x} b", {"x": "1", "y": "2"})
        with pytest.raises(ValueError, match="neither"):
            templates.fill("mail me @ home", {})
        assert templates.fill("a @{x} @@ b", {"x": "1"}) == "a 1 @ b"

    def test_the_templates_hold_no_slo_of_their_own(self) -> None:
        """The rules template compares latencies only with placeholders."""
        text = (ASSETS / templates.RULES_TEMPLATE).read_text(encoding="utf-8")
        assert not re.search(r"_seconds:p99_1m > \d", text)
        assert not re.search(r"waiting:avg_1m >= \d", text)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool not found: install Debian's prometheus package")
    return subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=HANG_S, check=False, cwd=cwd
    )


#: A server whose ITL p99 holds at 50 ms (the signal as its recording rule gives it):
#: healthy by the defaults' 100 ms, decode-bound by a 24 ms SLO.
ITL_50MS_TEST = {
    "rule_files": ["vllm-triage.rules.yaml"],
    "evaluation_interval": "15s",
    "tests": [
        {
            "interval": "15s",
            "input_series": [
                {
                    "series": 'model:vllm_itl_seconds:p99_1m{instance="a:8000",model_name="m"}',
                    "values": "0.05x20",
                }
            ],
            "promql_expr_test": [
                {
                    "expr": "model:vllm_triage_decode_bound:active",
                    "eval_time": "2m",
                    "exp_samples": "EXPECTED",
                }
            ],
        }
    ],
}


@pytest.mark.prometheus
class TestPromtool:
    def test_custom_rules_pass_promtool(self, tmp_path: Path) -> None:
        (tmp_path / "custom.rules.yaml").write_text(rules(CUSTOM), encoding="utf-8")
        result = promtool("check", "rules", "custom.rules.yaml", cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS: 34 rules found" in result.stdout

    @pytest.mark.parametrize(("which", "fires"), [("defaults", False), ("simulated", True)])
    def test_the_rendered_slo_is_what_fires(self, tmp_path: Path, which: str, fires: bool) -> None:
        objectives = defaults() if which == "defaults" else simulated()
        (tmp_path / "vllm-triage.rules.yaml").write_text(rules(objectives), encoding="utf-8")
        test = json.loads(json.dumps(ITL_50MS_TEST))
        labels = {"instance": "a:8000", "model_name": "m"}
        samples = [{"labels": labels_text(labels), "value": 0.05}] if fires else []
        test["tests"][0]["promql_expr_test"][0]["exp_samples"] = samples
        (tmp_path / "itl.test.yaml").write_text(yaml.safe_dump(test), encoding="utf-8")
        result = promtool("test", "rules", "itl.test.yaml", cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr


def labels_text(labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"model:vllm_triage_decode_bound:active{{{inner}}}"
