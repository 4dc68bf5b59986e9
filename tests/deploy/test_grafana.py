"""Tests for deploy/grafana/: the dashboard JSON and its provisioning files.

No Grafana runs here, so the dashboard is held to what can be checked offline: its structure (ids,
titles, layout, datasource), that every query is valid PromQL (promtool parses each one as a
recording rule; marked ``prometheus``, as it needs Debian's promtool), and that every metric a query
reads is one vllm-triage exports (rendered from a real evaluation), one vLLM exports
(daemon/vllm_triage/core/names.py) or one of our recording rules."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.assemble import build_evaluator, build_rulebook
from vllm_triage.config.load import load_settings
from vllm_triage.config.rulebook import slo_of
from vllm_triage.config.schema import ReceiverSettings
from vllm_triage.core.model import CAUSES
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.demo.offline import START_AT, scenario_facts
from vllm_triage.notify.delivery import Delivery
from vllm_triage.notify.receivers import build_receiver
from vllm_triage.rules import runtime_table
from vllm_triage.serve.exporter import build_registry
from vllm_triage.simulator import get_scenario
from vllm_triage.state import ProbeStats, TargetState, View

from support.clirun import HANG_S
from support.parsing import SAMPLES
from support.paths import ROOT
from support.scenarios import recorded

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
DASHBOARD = DASHBOARDS / "vllm-triage.json"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yaml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "vllm-triage.yaml"
RULES = ROOT / "rules" / "prometheus" / "vllm-triage.rules.yaml"
DEFAULTS = ROOT / "rules" / "defaults.yaml"

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_COLUMNS = 24
#: The labels the dashboard's variables filter on.
FILTERED = ("target", "model_name")

#: Grafana's built-in variables, replaced by what they could be at query time.
BUILTINS = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "1m"}
#: A metric-like name: ours, vLLM's (``vllm:``, ``ray_vllm:``) or a recording rule
#: (``level:metric:operations``), as a whole token (not the tail of a longer name, a
#: duration or a variable).
METRIC = re.compile(r"(?<![\w:.$])(?:vllm_triage_\w+|[A-Za-z_]\w*:[\w:]*)(?![\w:])")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


# --- Reading the dashboard ---------------------------------------------------------------


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


@pytest.fixture(scope="module")
def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = dashboard["panels"]
    assert found, "the dashboard has no panels"
    return found


def queries(panels: list[dict[str, Any]]) -> Iterator[tuple[int, int, str]]:
    """(panel id, query number from 1, expr) for every query of every panel."""
    for panel in panels:
        for n, target in enumerate(panel.get("targets", []), start=1):
            yield panel["id"], n, target.get("expr", "")


def variable_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """Each query variable's selector, from ``label_values(selector, label)``."""
    out = {}
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\s*\)\s*", query)
        assert m, f"variable {var['name']}: not label_values(selector, label): {query!r}"
        out[var["name"]] = m.group(1)
    return out


def substitute(expr: str) -> str:
    """``expr`` as Grafana would send it: built-ins as durations, every template
    variable (``$name``, ``${name}``, ``${name:format}``) as the match-all ``.*``."""
    for name, value in BUILTINS.items():
        expr = re.sub(re.escape(name) + r"(?!\w)", value, expr)
        expr = expr.replace("${" + name[1:] + "}", value)
    expr = re.sub(r"\$\{[^}]*\}", ".*", expr)
    return re.sub(r"\$\w+", ".*", expr)


@dataclasses.dataclass(frozen=True)
class Selector:
    name: str
    #: label -> (operator, value), as written (variables not substituted)
    matchers: dict[str, tuple[str, str]]


def selectors(expr: str) -> list[Selector]:
    """Every metric-like name in ``expr`` with the label matchers written after it.

    String literals are blanked first (same length), so a label value such as
    ``"vllm_triage_x"`` is not taken for a name, and a brace in one cannot end a selector.
    """
    masked = STRING.sub(lambda m: m.group()[0] + " " * (len(m.group()) - 2) + m.group()[-1], expr)
    found = []
    for m in METRIC.finditer(masked):
        matchers: dict[str, tuple[str, str]] = {}
        brace = re.match(r"\s*\{", masked[m.end() :])
        if brace:
            start = m.end() + brace.end()
            end = masked.index("}", start)
            body = expr[start:end]
            pos = 0
            while pos < len(body) and body[pos:].strip():
                mm = MATCHER.match(body, pos)
                assert mm, f"cannot read the matchers {body!r} in {expr!r}"
                matchers[mm.group(1)] = (mm.group(2), mm.group(3))
                pos = mm.end()
        found.append(Selector(m.group(), matchers))
    return found


def names_in(expr: str) -> set[str]:
    return {s.name for s in selectors(expr)}


# --- What exists to be queried -----------------------------------------------------------


def watched(scenario: str) -> TargetState:
    """A target's state as the watcher leaves it after a simulated minute of
    ``scenario`` every 5 s, with the scenario's hardware known (so that the decode
    ceiling is exported), plus a couple of failed scrapes."""
    sc = get_scenario(scenario)
    settings = load_settings(None, scenario_facts(sc) or None)
    rulebook = build_rulebook(settings)
    evaluator = build_evaluator(settings, rulebook)
    parser = SnapshotParser(runtime_table())
    state = TargetState(scenario, f"http://127.0.0.1:1/{scenario}", rulebook.ceiling)
    for at, body in recorded(sc, start_at=START_AT, interval_s=5.0, duration_s=60.0):
        evaluation = evaluator.step(parser.parse(body, at))
        state.scrapes += 1
        state.up, state.last_scrape_at, state.last_success_at = True, at, at
        state.last_duration_s = 0.01
        state.view = View(
            evaluation=evaluation,
            states={m: evaluator.incidents.state(m) for m in evaluation.diagnoses},
            active=tuple(evaluator.incidents.active()),
        )
        for t in evaluation.transitions:
            if t.event == "firing":
                state.incidents_opened[(t.model_name, t.cause)] += 1
    state.failures.update({"timeout": 1, "connect": 2})
    state.skipped_ticks, state.series_problems = 1, 1
    return state


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """vllm-triage's exposed names (sample names, ``_total`` included, and family
    names) -> the label names their samples carry, from a populated exporter."""
    state = watched("kv_pressure")
    assert state.view is not None and state.view.active, "expected an open incident"
    assert state.incidents_opened, "expected an incident opened"
    # A target with its probe enabled: one timed out, the last one answered.
    state.probe = ProbeStats(url="http://127.0.0.1:1/v1/completions", probes=3, last_seconds=0.05)
    state.probe.failures["timeout"] += 1
    # A server decoding (its steps carry no prefill): the decode rate and its ratio to the
    # ceiling, which the KV-pressure load's mixed steps do not give.
    decoding = watched("decode_bound")

    async def main() -> str:
        async with httpx.AsyncClient() as client:
            receiver = ReceiverSettings(type="alertmanager_webhook", url="http://127.0.0.1:9/h")
            deliveries = [Delivery(build_receiver("ops", receiver, "http://x:9468"), client)]
            slo = slo_of(load_settings().slo)
            registry = build_registry(lambda: [state, decoding], lambda: deliveries, slo=slo)
            return generate_latest(registry).decode("utf-8")

    text = asyncio.run(main())
    out: dict[str, set[str]] = defaultdict(set)
    for family in text_string_to_metric_families(text):
        out[family.name]
        for sample in family.samples:
            out[sample.name] |= set(sample.labels)
            out[family.name] |= set(sample.labels)
    return dict(out)


@cache
def rule_names() -> frozenset[str]:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return frozenset(
        rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule
    )


def vllm_names() -> set[str]:
    """vLLM's sample names: gauges, counters, histograms' _bucket/_sum/_count forms."""
    return set(SAMPLES)


# --- Self-checks of the helpers ----------------------------------------------------------


class TestHelpers:
    def test_names_in_finds_every_kind_of_name_and_nothing_else(self) -> None:
        expr = (
            'histogram_quantile(0.99, sum by (le) (rate(vllm:ttft_bucket{model_name=~"$m"}'
            '[$__rate_interval]))) / on (target) vllm_triage_x{diagnosis="vllm_triage_y"}'
            " or model:vllm_triage_kv_pressure:active[5m:30s] or ray_vllm:a_total"
        )
        assert names_in(expr) == {
            "vllm:ttft_bucket",
            "vllm_triage_x",
            "model:vllm_triage_kv_pressure:active",
            "ray_vllm:a_total",
        }

    def test_selectors_read_matchers(self) -> None:
        [sel] = selectors('rate(vllm_triage_a_total{target=~"$target", reason!="x}"}[1m])')
        assert sel == Selector(
            "vllm_triage_a_total", {"target": ("=~", "$target"), "reason": ("!=", "x}")}
        )

    def test_substitute(self) -> None:
        expr = (
            'increase(x{a=~"$target",b=~"${model_name}",c="${v:regex}"}[$__range])'
            " [$__rate_interval] $__interval"
        )
        assert substitute(expr) == 'increase(x{a=~".*",b=~".*",c=".*"}[1h]) [1m] 1m'


# --- The dashboard's structure -----------------------------------------------------------


class TestStructure:
    def test_schema_and_uid(self, dashboard: dict[str, Any]) -> None:
        assert dashboard["schemaVersion"] == 39
        assert dashboard["title"]
        uid = dashboard["uid"]
        assert isinstance(uid, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,40}", uid), uid

    def test_uid_unique_among_the_provisioned_dashboards(self) -> None:
        uids = [load_dashboard(p)["uid"] for p in sorted(DASHBOARDS.glob("*.json"))]
        assert DASHBOARD in DASHBOARDS.glob("*.json")
        assert len(uids) == len(set(uids)), uids

    def test_panel_ids_unique(self, panels: list[dict[str, Any]]) -> None:
        ids = [p.get("id") for p in panels]
        assert all(isinstance(i, int) and i > 0 for i in ids), ids
        assert len(ids) == len(set(ids)), ids

    def test_every_panel_has_a_title_and_a_query(self, panels: list[dict[str, Any]]) -> None:
        for p in panels:
            assert isinstance(p.get("title"), str) and p["title"].strip(), p.get("id")
            assert p.get("type") in ("timeseries", "state-timeline", "stat"), p["title"]
            exprs = [t.get("expr", "") for t in p.get("targets", [])]
            assert exprs and all(isinstance(e, str) and e.strip() for e in exprs), p["title"]
            refs = [t.get("refId") for t in p["targets"]]
            assert len(refs) == len(set(refs)) and all(refs), p["title"]

    def test_grid_fits_24_columns_without_overlap(self, panels: list[dict[str, Any]]) -> None:
        boxes = []
        for p in panels:
            g = p["gridPos"]
            x, y, w, h = g["x"], g["y"], g["w"], g["h"]
            assert all(isinstance(v, int) for v in (x, y, w, h)), p["title"]
            assert x >= 0 and y >= 0 and w >= 1 and h >= 1, p["title"]
            assert x + w <= GRID_COLUMNS, p["title"]
            boxes.append((p["title"], x, y, w, h))
        for i, (a, ax, ay, aw, ah) in enumerate(boxes):
            for b, bx, by, bw, bh in boxes[i + 1 :]:
                apart = ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay
                assert apart, f"{a!r} overlaps {b!r}"

    def test_every_query_uses_the_datasource_variable(self, panels: list[dict[str, Any]]) -> None:
        for p in panels:
            assert p.get("datasource") == DATASOURCE, p["title"]
            for t in p["targets"]:
                assert t.get("datasource") == DATASOURCE, (p["title"], t["refId"])

    def test_variables(self, dashboard: dict[str, Any]) -> None:
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        ds = variables["datasource"]
        assert ds["type"] == "datasource" and ds["query"] == "prometheus"
        assert variable_queries(dashboard) == {
            "target": "vllm_triage_diagnosis",
            "model_name": 'vllm_triage_diagnosis{target=~"$target"}',
        }
        for name in FILTERED:
            v = variables[name]
            assert v["datasource"] == DATASOURCE, name
            assert v["multi"] is True and v["includeAll"] is True, name
        names = list(variables)
        assert names.index("datasource") < names.index("target") < names.index("model_name")


# --- The queries -------------------------------------------------------------------------


def promtool() -> str:
    path = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(path).exists():
        pytest.fail("promtool not found: install Debian's prometheus package")
    return path


def check_rules(tmp_path: Path, rules: list[dict[str, str]]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "grafana.rules.yaml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "grafana-dashboard", "rules": rules}]}),
        encoding="utf-8",
    )
    return subprocess.run(
        [promtool(), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )


@pytest.mark.prometheus
class TestPromQL:
    def test_every_query_parses(
        self, tmp_path: Path, dashboard: dict[str, Any], panels: list[dict[str, Any]]
    ) -> None:
        """promtool reads every panel query (and each variable's selector) as a rule."""
        rules = []
        for pid, n, expr in queries(panels):
            query = substitute(expr)
            assert "$" not in query, f"panel {pid} query {n}: unsubstituted {query!r}"
            rules.append({"record": f"grafana:panel_{pid}_{n}", "expr": query})
        for name, selector in variable_queries(dashboard).items():
            rules.append({"record": f"grafana:variable_{name}", "expr": substitute(selector)})
        result = check_rules(tmp_path, rules)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"{len(rules)} rules found" in result.stdout, result.stdout

    def test_promtool_rejects_a_broken_query(self, tmp_path: Path) -> None:
        """The check above can fail: an unclosed range is refused."""
        result = check_rules(tmp_path, [{"record": "grafana:broken", "expr": "rate(x[1m)"}])
        assert result.returncode != 0, result.stdout


class TestMetricNames:
    def test_every_name_is_exported_by_someone(
        self, exported: dict[str, set[str]], dashboard: dict[str, Any], panels: list[dict[str, Any]]
    ) -> None:
        known = set(exported) | vllm_names() | rule_names()
        exprs = [(f"panel {pid} query {n}", e) for pid, n, e in queries(panels)]
        exprs += [(f"variable {k}", e) for k, e in variable_queries(dashboard).items()]
        unknown = {(where, name) for where, e in exprs for name in names_in(e) - known}
        assert not unknown, sorted(unknown)
        assert all(names_in(e) for _, e in exprs), "a query reads no metric at all"

    def test_the_exporter_fixture_is_populated(self, exported: dict[str, set[str]]) -> None:
        """Names are checked against real samples, counters with their _total."""
        for name in (
            "vllm_triage_diagnosis",
            "vllm_triage_incidents_opened_total",
            "vllm_triage_scrape_failures_total",
            "vllm_triage_notifications_sent_total",
            "vllm_triage_decode_ceiling_ratio",
            "vllm_triage_decode_roofline_ratio",
            "vllm_triage_decode_step_bytes",
        ):
            assert exported.get(name), name

    def test_key_metrics_are_on_the_dashboard(self, panels: list[dict[str, Any]]) -> None:
        used: dict[str, list[str]] = {
            name: []
            for name in (
                "vllm_triage_decode_ceiling_ratio",
                "vllm_triage_decode_roofline_ratio",
                "vllm_triage_decode_step_bytes",
                "vllm_triage_diagnosis",
            )
        }
        for p in panels:
            for t in p["targets"]:
                for name in names_in(t["expr"]) & set(used):
                    used[name].append(p["type"])
        assert all(used.values()), used
        assert "state-timeline" in used["vllm_triage_diagnosis"]
        assert "stat" in used["vllm_triage_diagnosis"]

    def test_filtered_by_the_variables(
        self, exported: dict[str, set[str]], panels: list[dict[str, Any]]
    ) -> None:
        """Each series is filtered by $target and $model_name where it has those labels;
        vLLM's own series (no ``target`` label) by $model_name only."""
        raw = vllm_names()
        for pid, n, expr in queries(panels):
            for sel in selectors(expr):
                if sel.name in raw:
                    wanted = {"model_name"}
                    assert "target" not in sel.matchers, (pid, n, sel)
                elif sel.name in exported:
                    wanted = exported[sel.name] & set(FILTERED)
                else:
                    continue
                for label in wanted:
                    assert sel.matchers.get(label) == ("=~", f"${label}"), (pid, n, sel, label)


# --- Units and SLO lines -----------------------------------------------------------------


def panel_names(panel: dict[str, Any]) -> set[str]:
    return set().union(*(names_in(t["expr"]) for t in panel["targets"]))


class TestDisplay:
    @pytest.mark.parametrize(
        ("metric", "slo"),
        [
            ("vllm_triage_ttft_p99_seconds", "ttft_p99"),
            ("vllm_triage_itl_p99_seconds", "itl_p99"),
        ],
    )
    def test_slo_lines_are_the_daemons_gauge(
        self, panels: list[dict[str, Any]], metric: str, slo: str
    ) -> None:
        """Every panel showing a p99 draws its SLO from the daemon's own gauge (of the
        daemons watching the chosen targets), as a red dashed series: not a number typed
        into the panel, which a daemon with another SLO would contradict. No static
        threshold line beside it, and no number in the title."""
        shown = [p for p in panels if metric in panel_names(p)]
        assert shown, f"no panel shows {metric}"
        for p in shown:
            [line] = [t for t in p["targets"] if "vllm_triage_slo_seconds" in t["expr"]]
            [sel] = [s for s in selectors(line["expr"]) if s.name == "vllm_triage_slo_seconds"]
            assert sel.matchers == {"slo": ("=", slo)}, p["title"]
            [up] = [s for s in selectors(line["expr"]) if s.name == "vllm_triage_target_up"]
            assert up.matchers == {"target": ("=~", "$target")}, p["title"]
            [override] = [
                o
                for o in p["fieldConfig"]["overrides"]
                if o["matcher"] == {"id": "byName", "options": line["legendFormat"]}
            ]
            props = {x["id"]: x["value"] for x in override["properties"]}
            assert props["color"] == {"mode": "fixed", "fixedColor": "red"}, p["title"]
            assert props["custom.lineStyle"]["fill"] == "dash", p["title"]
            defaults = p["fieldConfig"]["defaults"]
            assert defaults["custom"]["thresholdsStyle"]["mode"] == "off", p["title"]
            assert [x["value"] for x in defaults["thresholds"]["steps"]] == [None]
            assert not re.search(
                r"\d", p["title"].replace("p99", "").replace("p50", "").replace("p90", "")
            ), p["title"]

    def test_units_follow_the_metric_names(self, panels: list[dict[str, Any]]) -> None:
        """Seconds in s; ratios and vLLM's fractions in percentunit; tokens/s in short;
        other per-second rates (requests, scrapes, notifications) in reqps."""
        for p in panels:
            unit = p["fieldConfig"]["defaults"].get("unit")
            assert unit, p["title"]
            names = panel_names(p)
            exprs = " ".join(t["expr"] for t in p["targets"])
            if "histogram_quantile" in exprs or (
                names and all(n.endswith("_seconds") for n in names)
            ):
                assert unit == "s", p["title"]
            elif names and all(n.endswith(("_ratio", "_perc")) for n in names):
                assert unit == "percentunit", p["title"]
            elif any(n.endswith("tokens_per_second") for n in names):
                assert unit == "short", p["title"]  # Grafana has no tokens/s unit
            elif re.search(r"\brate\(", exprs) or all(n.endswith("_per_second") for n in names):
                assert unit == "reqps", p["title"]  # requests, scrapes or alerts per second

    def test_decode_ceiling_ratio_range(self, panels: list[dict[str, Any]]) -> None:
        [p] = [p for p in panels if panel_names(p) == {"vllm_triage_decode_ceiling_ratio"}]
        defaults = p["fieldConfig"]["defaults"]
        assert (defaults.get("min"), defaults.get("max")) == (0, 1.2)

    def test_decode_roofline_panel_marks_the_verdicts(self, panels: list[dict[str, Any]]) -> None:
        """The roofline ratio is drawn against the shipped near_ceiling_ratio (hardware
        limit) and roofline_impossible_ratio (settings wrong) lines."""
        [p] = [p for p in panels if panel_names(p) == {"vllm_triage_decode_roofline_ratio"}]
        defaults = p["fieldConfig"]["defaults"]
        th = yaml.safe_load(DEFAULTS.read_text(encoding="utf-8"))["thresholds"]
        steps = [s["value"] for s in defaults["thresholds"]["steps"]]
        assert th["near_ceiling_ratio"] in steps and th["roofline_impossible_ratio"] in steps
        assert defaults["custom"]["thresholdsStyle"]["mode"] != "off"

    def test_decode_step_bytes_are_stacked_by_part(self, panels: list[dict[str, Any]]) -> None:
        [p] = [p for p in panels if panel_names(p) == {"vllm_triage_decode_step_bytes"}]
        assert p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
        assert "{{part}}" in p["targets"][0]["legendFormat"]


# --- Provisioning ------------------------------------------------------------------------


class TestProvisioning:
    def test_datasource(self) -> None:
        config = yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))
        assert config["apiVersion"] == 1
        [ds] = config["datasources"]
        assert ds["type"] == "prometheus" and ds["name"] == "Prometheus"
        assert ds["uid"] == "prometheus" and ds["url"] == "http://prometheus:9090"
        assert ds["isDefault"] is True

    def test_dashboard_provider(self) -> None:
        config = yaml.safe_load(PROVIDERS.read_text(encoding="utf-8"))
        assert config["apiVersion"] == 1
        [provider] = config["providers"]
        assert provider["type"] == "file" and provider["name"]
        path = provider["options"]["path"]
        assert path == "/var/lib/grafana/dashboards"
        assert Path(path).name == DASHBOARDS.name  # the folder this repository mounts there


class TestStalled:
    def test_the_stall_panel_draws_stall_after_seconds(self, panels: list[dict[str, Any]]) -> None:
        """The time without progress is shown against the shipped stall_after_seconds."""
        after = float(
            yaml.safe_load(DEFAULTS.read_text(encoding="utf-8"))["thresholds"][
                "stall_after_seconds"
            ]
        )
        [p] = [p for p in panels if panel_names(p) == {"vllm_triage_no_progress_seconds"}]
        defaults = p["fieldConfig"]["defaults"]
        assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
        assert after in [s["value"] for s in defaults["thresholds"]["steps"]]

    def test_the_current_diagnosis_names_every_cause(self, panels: list[dict[str, Any]]) -> None:
        """Each cause the daemon exports has a code in the stat panel's query and a name in
        its value mappings: a new cause cannot show as a bare number."""
        [stat] = [
            p for p in panels if p["type"] == "stat" and "vllm_triage_diagnosis" in panel_names(p)
        ]
        names = {
            m["text"] for m in stat["fieldConfig"]["defaults"]["mappings"][0]["options"].values()
        }
        assert names == {"healthy", *CAUSES}
        expr = stat["targets"][0]["expr"]
        assert all(f'diagnosis="{c}"' in expr for c in CAUSES)
