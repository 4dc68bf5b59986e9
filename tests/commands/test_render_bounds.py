"""``vllm-triage render`` never writes a file Prometheus would refuse, nor one whose YAML
a file name wrote (daemon/vllm_triage/render/templates.py).

Before: ``incident.open_after: 1000000000`` rendered ``for: 15000000000s`` with exit 0
(Prometheus refuses the whole file: "duration out of range"), and a ``--config`` file
whose name held a newline was copied raw into the header comment, the rest of the name
read as YAML."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_triage.render.templates import MAX_FOR_SECONDS, RULE_INTERVAL_SECONDS

from support.clirun import vllm_triage
from support.paths import ROOT

RULES = ROOT / "rules" / "prometheus" / "vllm-triage.rules.yaml"
LONGEST = MAX_FOR_SECONDS // RULE_INTERVAL_SECONDS


def settings(tmp_path: Path, open_after: int, name: str = "triage.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"incident:\n  open_after: {open_after}\n  change_cause_after: {open_after}\n")
    return path


def fors(text: str) -> set[str]:
    groups = yaml.safe_load(text)["groups"]
    return {str(r["for"]) for g in groups for r in g["rules"] if "for" in r and "alert" in r}


@pytest.mark.parametrize("open_after", [LONGEST + 1, 10**9, 10**30])
def test_a_for_prometheus_would_refuse_is_refused(tmp_path: Path, open_after: int) -> None:
    out = tmp_path / "rules.yaml"
    result = vllm_triage(
        "render",
        "rules",
        "--config",
        str(settings(tmp_path, open_after)),
        "--output",
        str(out),
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert "incident.open_after" in result.stderr and "292 years" in result.stderr
    assert not out.exists() and "Traceback" not in result.stderr


@pytest.mark.prometheus
def test_the_longest_for_renders_and_promtool_reads_it(tmp_path: Path) -> None:
    result = vllm_triage(
        "render", "rules", "--config", str(settings(tmp_path, LONGEST)), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert f"{LONGEST * RULE_INTERVAL_SECONDS}s" in fors(result.stdout)
    path = tmp_path / "rules.yaml"
    path.write_text(result.stdout)
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool not found: install Debian's prometheus package")
    checked = subprocess.run(
        [binary, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("fmt", ["rules", "prometheusrule"])
def test_a_file_name_with_a_newline_stays_in_its_comment(tmp_path: Path, fmt: str) -> None:
    name = "a\ngroups: []\nx: \u2028y.yaml"
    config = tmp_path / name
    config.write_text("slo:\n  ttft_p99_seconds: 3\n")
    result = vllm_triage("render", "rules", "--config", str(config), "--format", fmt, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("# GENERATED") and "a\\ngroups: []\\nx: \\u2028y.yaml" in first
    doc = yaml.safe_load(result.stdout)
    groups = doc["groups"] if fmt == "rules" else doc["spec"]["groups"]
    assert "x" not in doc and len(groups) == len(yaml.safe_load(RULES.read_text())["groups"])
