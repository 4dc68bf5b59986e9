"""Benchmark: the daemon's peak resident memory under the largest scrape its bounds allow,
for the sidecar's memory limit (deploy/kubernetes/sidecar-patch.yaml, docs/deploy.md).

What can grow, and what bounds it (defaults, rules/defaults.yaml and
daemon/vllm_triage/config/schema.py):

- one scrape body: ``max_body_bytes`` (16 MiB), held while it is parsed;
- the window per target: ``window_seconds / interval_seconds`` snapshots (60 / 5 = 12) of
  at most ``max_models_per_target`` (100) models;
- each receiver's queue: ``queue_size`` (1000) notifications;
- the state store: SQLite's page cache (2 MB by default) and one file.

Measured here: ``vllm-triage run`` (a subprocess, one target, its state in a temporary
folder) scrapes a body just under ``max_body_bytes`` on 127.0.0.1: the vLLM 0.19.1
capture's families for as many model names as fit (more than ``max_models_per_target``,
so the extra ones are parsed and dropped), every ``INTERVAL_S`` with ``window_seconds``
long enough to hold 12 of them (the default window's count); its peak RSS (``VmHWM``) is
read once 13 scrapes are done. The delivery queue's share is measured apart:
``queue_size`` webhook notifications of a real firing alert, with tracemalloc.

Run with ``.venv/bin/python bench/bench_peak_rss.py`` (one to four minutes).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_triage.config.load import load_settings
from vllm_triage.core.alerts import firing_alert
from vllm_triage.core.model import Diagnosis, Reason, Transition
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.notify.receivers import build_receiver
from vllm_triage.rules import runtime_table
from vllm_triage.store import Notification

from payloads import many_models

COMMAND = Path(sys.executable).parent / "vllm-triage"
INTERVAL_S = 2.0
SNAPSHOTS = 12  # window_seconds / interval_seconds at the defaults (60 / 5)
#: Stop once the window holds SNAPSHOTS scrapes, or after this long.
RUN_S = 240.0


def largest_body(limit: int, max_lines: int, name_length: int) -> bytes:
    """As many models as fit under ``limit`` bytes and ``max_lines`` lines, their names as
    long as a label value may be: the largest scrape the parser accepts."""

    def size(n: int) -> tuple[int, int]:
        text = many_models(n, name_length=name_length)
        return len(text.encode()), text.count("\n") + 1

    one, two = size(1), size(2)
    per_bytes, per_lines = two[0] - one[0], two[1] - one[1]
    n = max(1, min((limit - one[0]) // per_bytes, (max_lines - one[1]) // per_lines))
    body = many_models(n, name_length=name_length).encode()
    while len(body) > limit or body.count(b"\n") + 1 > max_lines:
        n -= 1
        body = many_models(n, name_length=name_length).encode()
    return body


def serve(body: bytes) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def vm_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_counts(listen: str) -> dict[str, float]:
    """The daemon's own scrape counters, from its /metrics."""
    text = httpx.get(f"http://{listen}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("vllm_triage_scrapes_total", "vllm_triage_scrape_skipped_total"):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
            if sample.name == "vllm_triage_scrape_failures_total":
                out["failures"] = out.get("failures", 0.0) + sample.value
    return out


def daemon_peak(url: str, folder: Path) -> tuple[float, float, dict[str, float]]:
    """(peak RSS MB, RSS MB at the end, scrape counts) of the daemon watching ``url``."""
    listen = f"127.0.0.1:{free_port()}"
    cfg = {
        "listen": listen,
        "interval_seconds": INTERVAL_S,
        # Long enough to keep every scrape of the run: the window fills up to SNAPSHOTS
        # whatever a parse of the largest body costs on this machine.
        "window_seconds": RUN_S,
        "scrape_timeout_seconds": INTERVAL_S,
        "state_dir": str(folder / "state"),
        "targets": [{"name": "big", "url": url}],
        "receivers": [{"type": "alertmanager_webhook", "url": "http://127.0.0.1:9/hook"}],
    }
    path = folder / "triage.json"
    path.write_text(json.dumps(cfg))
    log = (folder / "daemon.log").open("w")
    proc = subprocess.Popen(
        [str(COMMAND), "run", "--config", str(path)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + RUN_S
        counts: dict[str, float] = {}
        while time.monotonic() < deadline:
            time.sleep(5)
            counts = scrape_counts(listen)
            if counts.get("vllm_triage_scrapes_total", 0) >= SNAPSHOTS + 1:
                break
        peak, now = vm_kib(proc.pid, "VmHWM"), vm_kib(proc.pid, "VmRSS")
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    return peak / 1024, now / 1024, counts


def queue_mb(queue_size: int) -> tuple[float, int]:
    """Memory of ``queue_size`` queued webhook notifications of one real firing alert."""
    d = Diagnosis(
        model_name="meta-llama/Llama-3.1-8B-Instruct",
        at=1.8e9,
        breaches=("ttft_p99", "waiting"),
        cause="queue_bound",
        confidence=0.9,
        summary="requests waited 80% of their TTFT while the KV cache had room " * 2,
        evidence={f"signal_{i}": 1.2345 for i in range(30)},
        remediation=("Raise --max-num-seqs.", "Add replicas.", "Check the queue first."),
    )
    t = Transition("firing", Reason.OPENED, d.model_name, "queue_bound", d.at, d.at, d)
    alert = firing_alert(t, target="vllm", severity="warning", external_url="http://x:9468")
    settings = load_settings(
        flags={"receivers": [{"type": "alertmanager_webhook", "url": "http://127.0.0.1:9/h"}]}
    )
    receiver = build_receiver("r", settings.receivers[0], "http://x:9468")
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept: list[Notification] = [receiver.encode([alert], 1.8e9)[0] for _ in range(queue_size)]
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / 1e6, len(kept[0].body)


def run_shape(name: str, body: bytes, settings_bytes: int, max_lines: int) -> float:
    """One daemon watching ``body``; prints what it measured, returns the peak RSS (MB)."""
    models = body.count(b"vllm:num_requests_running{") or 0
    lines = body.count(b"\n") + 1
    server, url = serve(body)
    try:
        httpx.get(url, timeout=10).raise_for_status()
        with tempfile.TemporaryDirectory() as folder:
            peak, end, counts = daemon_peak(url, Path(folder))
    finally:
        server.shutdown()
    began = time.perf_counter()
    SnapshotParser(runtime_table()).parse_bytes(body, 0.0)
    parse_s = time.perf_counter() - began
    print(
        f"{name}: {len(body) / 2**20:.1f} MiB (max_body_bytes {settings_bytes / 2**20:.0f} "
        f"MiB), {lines} lines (max_lines_per_scrape {max_lines}), {models} models; every "
        f"{INTERVAL_S:g} s until {SNAPSHOTS} snapshots are in the window"
    )
    print(
        f"  scrapes {counts.get('vllm_triage_scrapes_total', 0):.0f}, skipped "
        f"{counts.get('vllm_triage_scrape_skipped_total', 0):.0f}, failed "
        f"{counts.get('failures', 0):.0f}; one parse of the body: {parse_s:.2f} s of CPU"
    )
    print(f"  daemon peak RSS (VmHWM): {peak:.0f} MB; RSS at the end: {end:.0f} MB")
    return peak


def main() -> None:
    settings = load_settings()
    limit, lines = settings.max_body_bytes - 1024, settings.max_lines_per_scrape - 10
    # The two largest scrapes the bounds allow: every byte (the longest label values),
    # or every line (short names, so the most models and series per byte).
    peaks = [
        run_shape(
            "most bytes",
            largest_body(limit, lines, settings.max_label_value_length),
            settings.max_body_bytes,
            settings.max_lines_per_scrape,
        ),
        run_shape(
            "most lines",
            largest_body(limit, lines, 0),
            settings.max_body_bytes,
            settings.max_lines_per_scrape,
        ),
    ]
    q_mb, body_bytes = queue_mb(1000)
    print(f"worst daemon peak RSS: {max(peaks):.0f} MB")
    print(
        f"a full delivery queue (queue_size 1000, webhook bodies of {body_bytes} bytes): "
        f"{q_mb:.1f} MB per receiver"
    )


if __name__ == "__main__":
    main()
