"""Debian's Prometheus and Alertmanager (and VictoriaMetrics) as the tests run them: each
started on 127.0.0.1 on a free port, waited for until ready, and stopped after (the
`prometheus` tier)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.clirun import stop
from support.harness import free_port, wait_for


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: apt-get install prometheus prometheus-alertmanager victoria-metrics"
        )
    return path


@contextmanager
def process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    try:
        yield proc
    finally:
        stop(proc)


def ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def alertmanager(tmp_path: Path, config: str) -> Iterator[str]:
    """A real Alertmanager with ``config`` (YAML text), alone (no cluster); its URL."""
    port = free_port()
    path = tmp_path / "alertmanager.yml"
    path.write_text(config, encoding="utf-8")
    args = [
        binary("prometheus-alertmanager"),
        f"--config.file={path}",
        f"--storage.path={tmp_path / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    url = f"http://127.0.0.1:{port}"
    with process(args, tmp_path / "alertmanager.log"):
        wait_for(lambda: ok(url + "/-/ready"), timeout=30, every=0.2)
        yield url


@contextmanager
def prometheus(
    tmp_path: Path,
    targets: dict[str, list[str]],
    *,
    labels: dict[str, dict[str, str]] | None = None,
    honor_labels: tuple[str, ...] = (),
    rules: Path | None = None,
    alertmanager: str | None = None,
    metric_relabel: dict[str, list[dict[str, Any]]] | None = None,
) -> Iterator[str]:
    """A Prometheus scraping ``targets`` ({job: [host:port]}) every second; its URL.
    ``labels`` adds target labels ({host:port: {label: value}}), as a Kubernetes service
    discovery would; jobs in ``honor_labels`` keep the labels their targets expose;
    ``rules`` are evaluated and their alerts sent to ``alertmanager``; ``metric_relabel``
    gives jobs their ``metric_relabel_configs`` ({job: [rule]})."""
    port = free_port()
    jobs = ""
    for job, addrs in targets.items():
        jobs += f"  - job_name: {job}\n"
        if job in honor_labels:
            jobs += "    honor_labels: true\n"
        relabels = (metric_relabel or {}).get(job)
        if relabels:
            jobs += f"    metric_relabel_configs: {json.dumps(relabels)}\n"
        jobs += "    static_configs:\n"
        for addr in addrs:
            extra = (labels or {}).get(addr, {})
            jobs += f"      - targets: [{addr!r}]\n        labels: {extra!r}\n"
    text = "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
    if rules is not None:
        text += f"rule_files: [{str(rules)!r}]\n"
    if alertmanager is not None:
        where = alertmanager.split("//", 1)[1]
        text += "alerting:\n  alertmanagers:\n    - static_configs:\n"
        text += f"        - targets: [{where!r}]\n"
    config = tmp_path / "prometheus.yml"
    config.write_text(text + "scrape_configs:\n" + jobs)
    args = [
        binary("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    url = f"http://127.0.0.1:{port}"
    with process(args, tmp_path / "prometheus.log"):
        wait_for(lambda: ok(url + "/-/ready"), timeout=30, every=0.2)
        yield url
