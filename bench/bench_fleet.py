"""Benchmark: fleet mode's cost per server, against a real Prometheus on 127.0.0.1.

    python bench/bench_fleet.py [--quick] [--servers 500,1000,2000,4000,8000]

A fleet of simulated vLLM servers (the bundled scenarios' recordings, each server one of
them, with its own ``namespace``/``pod``/``instance`` labels), and DCGM-shaped series for
each server's GPU (``tests/support/fleet_sim.py``), sampled every 15 s for two minutes, are
backfilled into a Prometheus TSDB (``promtool tsdb create-blocks-from openmetrics``); the
servers carry a ``slice`` label so one Prometheus holds every fleet size and a selector
picks N servers. Debian's ``prometheus`` serves the blocks, pinned to core 1; fleet mode
(``PrometheusSource``, as ``vllm-triage run`` builds it) runs pinned to core 0 in its own
process, a warm-up tick then three measured ticks on the 15 s grid, and one rendering of
its ``/metrics`` (what Prometheus scraping the daemon costs it).

Reported per N: the fleet's CPU per tick (queries, parsing, signals, diagnosis) plus one
``/metrics`` rendering, as a share of a core at a 15 s step and as servers per core;
the query wall time per tick (Prometheus evaluating the queries, on its core); rows and
bytes returned per tick; Prometheus' CPU per tick; and the fleet process' resident
memory (now and peak). Sustained: every server judged each tick, under 90 % of the core,
ticks shorter than the step. Goals: >= 2,000 servers per core, < 200 MB at 2,000.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

STEP = 15.0
WINDOW = 60.0
SAMPLES = 9  # two minutes every 15 s: one window plus the ticks after it
SLICE = 250  # servers per slice label value
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: Each scenario's card as DCGM names it, and a memory activity for its GPU.
SCENARIOS = {
    "healthy": ("NVIDIA H100 80GB HBM3", 0.3),
    "prefill_bound": ("NVIDIA L40S", 0.4),
    "decode_bound": ("NVIDIA A10G", 0.75),
    "queue_bound": ("NVIDIA H100 80GB HBM3", 0.35),
    "kv_pressure": ("NVIDIA A100-SXM4-80GB", 0.5),
}


def rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def series_of(scenario: str, t0: float) -> dict[str, list[tuple[str, list[str]]]]:
    """{name: [(labels, values at each sample)]} of one scenario, the series the fleet
    reads, sampled SAMPLES times STEP apart from t0."""
    from vllm_triage.core.names import SAMPLES as READ
    from vllm_triage.simulator import get_scenario, record

    from support.fleet_sim import relabel

    out: dict[str, dict[str, list[str]]] = {}
    for _, body in record(
        get_scenario(scenario), start_at=t0, interval_s=STEP, duration_s=STEP * (SAMPLES - 1)
    ):
        for line in relabel(body, "", lambda n: n in READ).splitlines():
            name, _, rest = line.partition("{")
            labels, _, value = rest.rpartition("} ")
            out.setdefault(name, {}).setdefault(labels, []).append(value)
    return {name: list(series.items()) for name, series in out.items()}


def write_openmetrics(path: Path, n: int, t0: float) -> None:
    """N servers' series and their GPUs', every family contiguous, with timestamps."""
    names = list(SCENARIOS)
    per = {s: series_of(s, t0) for s in names}
    stamps = [f"{t0 + STEP * k:.3f}" for k in range(SAMPLES)]
    families = sorted({f for s in per.values() for f in s})
    servers = [
        (
            names[i % len(names)],
            f'job="vllm",namespace="llm",pod="vllm-{i}",instance="10.{i // 65536}.'
            f'{i // 256 % 256}.{i % 256}:8000",slice="{i // SLICE}"',
        )
        for i in range(n)
    ]
    with path.open("w", encoding="utf-8") as f:
        for family in families:
            f.write(f"# TYPE {family} unknown\n")
            for scenario, own in servers:
                for labels, values in per[scenario].get(family, []):
                    prefix = f"{family}{{{own},{labels}}} " if labels else f"{family}{{{own}}} "
                    f.writelines(
                        f"{prefix}{v} {ts}\n" for v, ts in zip(values, stamps, strict=False)
                    )
        for family in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_DRAM_ACTIVE"):
            f.write(f"# TYPE {family} unknown\n")
            for i, (scenario, _) in enumerate(servers):
                card, dram = SCENARIOS[scenario]
                value = dram if family.endswith("DRAM_ACTIVE") else 71234
                labels = (
                    f'gpu="{i % 8}",UUID="GPU-{i:08x}",modelName="{card}",Hostname="node-{i // 8}",'
                    f'namespace="llm",pod="vllm-{i}",container="vllm",slice="{i // SLICE}"'
                )
                f.writelines(f"{family}{{{labels}}} {value} {ts}\n" for ts in stamps)
        f.write("# EOF\n")


def _measure(n: int, url: str, end: float, out: Any) -> None:
    """Fleet mode over ``n`` servers, pinned to core 0: what a tick costs."""
    os.sched_setaffinity(0, {0})
    import httpx
    from prometheus_client import generate_latest

    from vllm_triage.assemble import build_fleet
    from vllm_triage.config.load import load_settings
    from vllm_triage.logs import configure
    from vllm_triage.serve.exporter import build_registry

    configure("error", json=True)
    slices = "|".join(str(k) for k in range((n + SLICE - 1) // SLICE))
    settings = load_settings(
        flags={
            "source": "prometheus",
            "interval_seconds": STEP,
            "window_seconds": WINDOW,
            "prometheus": {
                "url": url,
                "selector": f'{{job="vllm", slice=~"{slices}"}}',
                "identity_labels": ["namespace", "pod"],
                "timeout_seconds": 60,
                "dcgm": {"selector": f'{{slice=~"{slices}"}}'},
                "models": {MODEL: {"parameters_billion": 8.03, "dtype": "bfloat16"}},
            },
        }
    )
    now = [end - 3 * STEP]
    rows: list[dict[str, float]] = []

    async def main() -> None:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=16)) as client:
            source = build_fleet(settings, client=client, notifier=None, clock=lambda: now[0])
            query = source.query
            spans: list[tuple[float, float]] = []

            async def timed(q: Any, at: float) -> bytes:
                began = time.monotonic()
                body = await query(q, at)
                spans.append((began, time.monotonic()))
                return body

            source.query = timed
            await source.tick()  # warm-up: discovers the servers, builds the rulebooks
            for k in (2, 1, 0):
                now[0] = end - k * STEP
                spans.clear()
                cpu0, wall0 = time.process_time(), time.monotonic()
                await source.tick()
                cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
                judged = sum(1 for w in source.targets.values() if w.state.up)
                rows.append(
                    {
                        "cpu": cpu,
                        "wall": wall,
                        "query": max(e for _, e in spans) - min(b for b, _ in spans),
                        "rows": source.last_rows,
                        "bytes": source.last_bytes,
                        "judged": judged,
                    }
                )
            registry = build_registry(source.states, lambda: [], process_metrics=False)
            cpu0 = time.process_time()
            text = generate_latest(registry)
            render = time.process_time() - cpu0
            firing = sum(len(w.evaluator.incidents.active()) for w in source.targets.values())
            out.put(
                {
                    "servers": n,
                    "ticks": rows,
                    "render_cpu": render,
                    "metrics_bytes": len(text),
                    "rss": rss_mb(),
                    "peak": rss_mb("VmHWM"),
                    "firing": firing,
                    "ok": source.api.state.up,
                    "error": source.api.state.last_error,
                }
            )

    asyncio.run(main())


def bench(counts: list[int]) -> list[dict[str, Any]]:
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    if promtool is None or prometheus is None:
        print("  needs Debian's prometheus package (promtool, prometheus): not run")
        return []
    sys.path.insert(0, str(ROOT / "tests"))
    from support.harness import free_port, wait_for

    end = time.time() - 3600
    end -= end % STEP
    t0 = end - STEP * (SAMPLES - 1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        folder = Path(tmp)
        started = time.monotonic()
        write_openmetrics(folder / "fleet.om", max(counts), t0)
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", "fleet.om", "data"],
            cwd=folder,
            check=True,
            capture_output=True,
        )
        (folder / "fleet.om").unlink()
        print(f"  ({max(counts)} servers backfilled in {time.monotonic() - started:.0f} s)")
        (folder / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                "--storage.tsdb.retention.time=10y",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(folder / "prometheus.log").open("wb"),
        )
        os.sched_setaffinity(prom.pid, {1})  # Prometheus on the other core
        try:
            import httpx

            def ready() -> bool:
                try:
                    return httpx.get(url + "/-/ready", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(ready, timeout=120, every=0.5)
            ctx = mp.get_context("spawn")
            for n in counts:
                out = ctx.Queue()
                cpu0 = proc_cpu_s(prom.pid)
                proc = ctx.Process(target=_measure, args=(n, url, end, out))
                proc.start()
                row = out.get(timeout=900)
                proc.join(timeout=60)
                row["prom_cpu"] = (proc_cpu_s(prom.pid) - cpu0) / 4  # four ticks
                rows.append(row)
                report(row)
                if not row["sustained"]:
                    break
        finally:
            prom.terminate()
            prom.wait(timeout=30)
    return rows


def report(row: dict[str, Any]) -> None:
    ticks = row["ticks"]
    n = row["servers"]
    cpu = max(t["cpu"] for t in ticks) + row["render_cpu"]
    share = cpu / STEP
    row["per_core"] = n / share if share > 0 else float("inf")
    row["sustained"] = (
        row["ok"]
        and all(t["judged"] == n for t in ticks)
        and share < 0.9
        and max(t["wall"] for t in ticks) < STEP
    )
    t = ticks[-1]
    print(
        f"  {n:5d} servers: CPU {cpu:.2f} s a tick ({share:.0%} of a core at {STEP:g} s, "
        f"{row['per_core']:,.0f} servers per core; /metrics {row['render_cpu']:.2f} s of it), "
        f"queries {max(x['query'] for x in ticks):.2f} s, "
        f"tick {max(x['wall'] for x in ticks):.2f} s, "
        f"{t['rows'] / n:.0f} rows ({t['bytes'] / n / 1024:.1f} KiB) per server, "
        f"Prometheus CPU {row['prom_cpu']:.2f} s a tick, "
        f"RSS {row['rss']:.0f} MB (peak {row['peak']:.0f} MB), {row['firing']} firing: "
        f"{'sustained' if row['sustained'] else 'NOT sustained'}"
        + ("" if row["ok"] else f" ({row['error'][:120]})"),
        flush=True,
    )


def main(argv: list[str]) -> int:
    counts = [250, 500, 1000] if "--quick" in argv else [500, 1000, 2000, 4000, 8000]
    if "--servers" in argv:
        counts = [int(x) for x in argv[argv.index("--servers") + 1].split(",")]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(
        f"fleet mode against a real Prometheus, {STEP:g} s step, {WINDOW:g} s window "
        "(goals: >= 2,000 servers per core, < 200 MB RSS at 2,000):"
    )
    bench(counts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
