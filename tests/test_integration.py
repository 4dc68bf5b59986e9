"""vllm-triage with the real components, all on 127.0.0.1 (Debian's `prometheus` and
`prometheus-alertmanager` packages; CI installs them):

- a real Prometheus scrapes two simulated vLLM servers and vllm-triage; vllm-triage's
  derived series appear in Prometheus; fleet mode against that Prometheus diagnoses
  both servers as the direct scrapes do;
- vllm-triage pushes into a real Alertmanager, which delivers to a local webhook
  receiver: the alert arrives with its diagnosis labels and annotations.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.settings import load_settings
from daemon.simulator import get_scenario

from harness import Receiver, free_port, metrics_url, running_daemon, simulated, wait_for

pytestmark = pytest.mark.prometheus

SPEED = 5.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: apt-get install prometheus prometheus-alertmanager")
    return path


@contextmanager
def process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextmanager
def prometheus(tmp_path: Path, targets: dict[str, list[str]]) -> Iterator[str]:
    """A Prometheus scraping ``targets`` ({job: [host:port]}) every second; its URL."""
    port = free_port()
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: {addrs!r}\n"
        for job, addrs in targets.items()
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n" + jobs
    )
    args = [
        binary("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    url = f"http://127.0.0.1:{port}"
    with process(args, tmp_path / "prometheus.log"):
        wait_for(lambda: _ok(url + "/-/ready"), timeout=30, every=0.2)
        yield url


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, promql: str) -> list[dict[str, Any]]:
    doc = httpx.get(url + "/api/v1/query", params={"query": promql}, timeout=5).json()
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


def host_port(server_url: str) -> str:
    return server_url.split("//", 1)[1].split("/", 1)[0]


def firing(states: list[Any]) -> dict[str, str | None]:
    """{target: the cause of its open incident, or None} for every target with a view."""
    out: dict[str, str | None] = {}
    for st in states:
        if st.view is not None:
            active = [a.cause for a in st.view.active]
            out[st.name] = active[0] if active else None
    return out


def test_prometheus_scrapes_triage_and_fleet_mode_diagnoses_the_fleet(tmp_path: Path) -> None:
    with (
        simulated(get_scenario("kv_pressure"), speed=SPEED) as kv,
        simulated(get_scenario("queue_bound"), speed=SPEED) as queue,
    ):
        sidecar_settings = load_settings(
            flags={
                "listen": "127.0.0.1:0",
                "interval_seconds": 1.0,
                "targets": [
                    {"name": "kv", "url": metrics_url(kv)},
                    {"name": "queue", "url": metrics_url(queue)},
                ],
            }
        )
        with running_daemon(sidecar_settings) as sidecar:
            vllm_targets = [host_port(metrics_url(kv)), host_port(metrics_url(queue))]
            with prometheus(
                tmp_path,
                {"vllm": vllm_targets, "vllm-triage": [host_port(sidecar.url)]},
            ) as prom:
                # The sidecar's own diagnoses, as Prometheus stores them.
                def stored() -> dict[str, str]:
                    rows = query(prom, "vllm_triage_diagnosis == 1")
                    return {r["metric"]["target"]: r["metric"]["diagnosis"] for r in rows}

                wait_for(
                    lambda: stored() == {"kv": "kv_pressure", "queue": "queue_bound"},
                    timeout=60,
                    every=1,
                )
                assert query(prom, 'up{job="vllm-triage"}')[0]["value"][1] == "1"
                # Fleet mode: the same diagnosis from Prometheus' copy of the series.
                fleet_settings = load_settings(
                    flags={
                        "listen": "127.0.0.1:0",
                        "interval_seconds": 1.0,
                        "window_seconds": 20,
                        "source": "prometheus",
                        "prometheus": {"url": prom, "selector": '{job="vllm"}'},
                    }
                )
                with running_daemon(fleet_settings) as fleet:
                    want = {
                        f"vllm/{vllm_targets[0]}": "kv_pressure",
                        f"vllm/{vllm_targets[1]}": "queue_bound",
                    }
                    wait_for(lambda: firing(fleet.target_states()) == want, timeout=60, every=0.5)
                    text = httpx.get(fleet.url + "/metrics", timeout=5).text
    assert 'vllm_triage_target_up{target="prometheus"} 1.0' in text
    for name, cause in want.items():
        assert f'diagnosis="{cause}",model_name="{MODEL}",target="{name}"}} 1.0' in text


def test_alerts_reach_a_receiver_through_a_real_alertmanager(tmp_path: Path) -> None:
    am_port = free_port()
    with Receiver() as rx:
        config = tmp_path / "alertmanager.yml"
        config.write_text(
            "route:\n  receiver: hook\n  group_by: [alertname, target, model_name]\n"
            "  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n"
            f"receivers:\n  - name: hook\n    webhook_configs:\n      - url: {rx.url}\n"
        )
        args = [
            binary("prometheus-alertmanager"),
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",
        ]
        am = f"http://127.0.0.1:{am_port}"
        with (
            process(args, tmp_path / "alertmanager.log"),
            simulated(get_scenario("kv_pressure"), speed=10.0) as kv,
        ):
            wait_for(lambda: _ok(am + "/-/ready"), timeout=30, every=0.2)
            settings = load_settings(
                flags={
                    "listen": "127.0.0.1:0",
                    "interval_seconds": 0.5,
                    "targets": [{"name": "kv", "url": metrics_url(kv)}],
                    "receivers": [{"type": "alertmanager", "name": "am", "url": am}],
                }
            )
            with running_daemon(settings):
                body = wait_for(rx.bodies, timeout=60, every=0.5)[0]
    alert = body["alerts"][0]
    assert body["receiver"] == "hook" and body["version"] == "4"
    assert alert["status"] == "firing"
    assert alert["labels"]["alertname"] == "VllmKvPressure"
    assert alert["labels"]["diagnosis"] == "kv_pressure"
    assert alert["labels"]["target"] == "kv"
    assert alert["labels"]["model_name"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert "KV" in alert["annotations"]["summary"]
    assert "kv_usage_max=" in alert["annotations"]["evidence"]
    assert alert["annotations"]["remediation"].startswith("- ")
