"""The simulator against real Prometheus tools (Debian's `prometheus` package): promtool
lints what it serves, and a Prometheus server on 127.0.0.1 scrapes it.

Needs /usr/bin/promtool and /usr/bin/prometheus (`apt-get install prometheus`); CI installs
them. Run with `.venv/bin/pytest -m prometheus`.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from vllm_triage.simulator import Simulation, get_scenario

from support.clirun import spawn, stop, wait_for_event
from support.harness import free_port

pytestmark = pytest.mark.prometheus

#: vLLM's own naming habit that promtool flags: every family is named `vllm:...`, and
#: colons are reserved for recording rules by Prometheus' naming conventions.
COLON_WARNING = "metric names should not contain ':'"
#: vLLM names a histogram ``vllm:iteration_tokens_total``; the simulator copies the name.
VLLM_TOTAL_HISTOGRAM = 'vllm:iteration_tokens_total non-counter metrics should not have "_total"'


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: install Debian's prometheus package (apt-get install prometheus)"
        )
    return path


@pytest.mark.parametrize("naming", ["v1", "v0"])
def test_promtool_finds_only_vllms_colons(naming: str) -> None:
    """promtool check metrics on the simulated payload warns only about vLLM's colons
    (and, V1, the ``_total`` vLLM gives its iteration-tokens histogram)."""
    sim = Simulation(get_scenario("tour"))
    sim.advance_to(300.0)
    text = sim.render(created_at=1_767_225_600.0, naming=naming)  # type: ignore[arg-type]
    result = subprocess.run(
        [tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert findings, "expected promtool to flag vLLM's colons"
    allowed = (COLON_WARNING, VLLM_TOTAL_HISTOGRAM)
    assert all(any(a in line for a in allowed) for line in findings), findings
    assert result.returncode in (0, 3)  # 3: lint warnings only, no parse error


def test_prometheus_scrapes_the_simulator(tmp_path: Path) -> None:
    """A real Prometheus scrapes `vllm-triage simulate` and stores vLLM's series."""
    sim_port, prom_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: vllm\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{sim_port}']\n"
    )
    simulator = spawn(
        tmp_path, "simulate", "--scenario", "tour", "--port", str(sim_port), "--speed", "30"
    )
    prometheus = None
    try:
        wait_for_event(simulator, "simulate_serving", 15)
        prometheus = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "prometheus.log").open("wb"),
        )
        api = f"http://127.0.0.1:{prom_port}/api/v1/query"
        deadline = time.monotonic() + 60
        up = tokens = None
        while time.monotonic() < deadline and not (up == "1" and tokens):
            time.sleep(1)
            try:
                up_r = httpx.get(api, params={"query": 'up{job="vllm"}'}, timeout=5).json()
                tok_r = httpx.get(
                    api,
                    params={"query": 'increase({__name__="vllm:generation_tokens_total"}[10s])'},
                    timeout=5,
                ).json()
            except httpx.HTTPError:
                continue
            if up_r["data"]["result"]:
                up = up_r["data"]["result"][0]["value"][1]
            if tok_r["data"]["result"]:
                tokens = float(tok_r["data"]["result"][0]["value"][1]) > 0
        log = (tmp_path / "prometheus.log").read_text(errors="replace")[-2000:]
        assert up == "1", f"Prometheus never saw the target up:\n{log}"
        assert tokens, f"no generation tokens stored:\n{log}"
    finally:
        for proc in (prometheus, simulator):
            if proc is not None:
                stop(proc)
