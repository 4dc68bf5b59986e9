"""Benchmark: fleet mode's cost per server, on Prometheus and VictoriaMetrics side by side,
and one replica's cost at 10,000 and 20,000 servers over 1, 2 and 4 shards.

    python bench/bench_fleet.py [--quick] [--servers 250,500,1000,2000]
                                [--replay 10000,20000] [--shards 1,2,4]

(``--replay 0``: the backends only.)

**Backends** (``--servers``): a fleet of simulated vLLM servers (the bundled scenarios'
recordings, each server one of them, with its own ``namespace``/``pod``/``instance``
labels and the shard bucket ``vllm-triage render relabel``'s rule gives its pod), and
DCGM-shaped series for each server's GPU (``tests/support/fleet_sim.py``), sampled every
15 s for two minutes. The same samples go into Debian's Prometheus (promtool's blocks) and
Debian's VictoriaMetrics (its import API); the servers carry a ``slice`` label so one
backend holds every size and a selector picks N servers. The backend runs pinned to core
1, fleet mode (``PrometheusSource``, as ``vllm-triage run`` builds it, with
``shard.buckets`` 256 and ``max_servers`` set to N) pinned to core 0 in its own process:
a warm-up tick, three measured ticks on the 15 s grid, one ``/metrics`` answer per tick
(Prometheus scraping the daemon: OpenMetrics, gzip, as Prometheus asks). Printed per N
and backend: the backend's CPU per server and tick, the daemon's CPU per server and
tick, bytes per server and tick (decoded JSON), and the daemon's resident memory. The
backend's CPU is only measured at sizes one core of this machine serves.

**One replica at scale** (``--replay``, ``--shards``): a local query API replays the
Prometheus answers recorded at the smallest size (each scenario's rows, per query),
served for N servers in 256 buckets, so that the daemon's side can be measured past what
one Prometheus core answers (``bench/fleet_replay.py``). For each N and shard count c,
replica 0 of c (``shard: {index: 0, count: c, buckets: 256}``, ``max_servers`` N/c and a
fifth) is measured as above: CPU a tick (and its share of a core at 15 s), resident
memory (and peak), bytes a tick decoded and as sent (gzip), and that against one replica's.

Goals: one replica sustains 10,000 servers on a 15 s step under 400 MB and under half a
core; over four shards each replica reads about a quarter of the bytes one would.
Sustained: every server of the shard judged each tick, under the CPU goal, ticks shorter
than the step.
"""

from __future__ import annotations

import asyncio
import functools
import math
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

STEP = 15.0
WINDOW = 60.0
SAMPLES = 9  # two minutes every 15 s: one window plus the ticks after it
SLICE = 50  # servers per slice label value: sizes are multiples of it
BUCKETS = 256
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: Each scenario's card as DCGM names it, and a memory activity for its GPU.
SCENARIOS = {
    "healthy": ("NVIDIA H100 80GB HBM3", 0.3),
    "prefill_bound": ("NVIDIA L40S", 0.4),
    "decode_bound": ("NVIDIA A10G", 0.75),
    "queue_bound": ("NVIDIA H100 80GB HBM3", 0.35),
    "kv_pressure": ("NVIDIA A100-SXM4-80GB", 0.5),
}
CPU_GOAL = 0.5  # of a core, one replica
#: What Prometheus (2.42) asks a target for.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


MEMORY_GOAL_MB = 400


def noop(*_: object) -> None:
    """A WSGI start_response that keeps nothing."""


def rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def proc_cpu_s(pid: int) -> float:
    """User and system CPU of a process and its threads so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def series_of(scenario: str, t0: float) -> dict[str, list[tuple[str, list[str]]]]:
    """{name: [(labels, values at each sample)]} of one scenario, the series the fleet
    reads, sampled SAMPLES times STEP apart from t0."""
    from vllm_triage.fleet.queries import SAMPLES as READ
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


def samples(n: int, t0: float) -> Iterator[tuple[str, str, str, float]]:
    """Every sample of N servers and their GPUs, family by family: (name, labels, value,
    time). Each series carries its pod's shard bucket, as the relabel rule gives it."""
    from fleet_replay import SHARD_LABEL, hashmod

    names = list(SCENARIOS)
    per = {s: series_of(s, t0) for s in names}
    stamps = [t0 + STEP * k for k in range(SAMPLES)]
    families = sorted({f for s in per.values() for f in s})
    servers = []
    for i in range(n):
        bucket = hashmod(f"llm/vllm-{i}", BUCKETS)
        own = (
            f'job="vllm",namespace="llm",pod="vllm-{i}",instance="10.{i // 65536}.'
            f'{i // 256 % 256}.{i % 256}:8000",slice="{i // SLICE}",{SHARD_LABEL}="{bucket}"'
        )
        servers.append((names[i % len(names)], own, bucket))
    for family in families:
        for scenario, own, _ in servers:
            for labels, values in per[scenario].get(family, []):
                both = f"{own},{labels}" if labels else own
                for v, ts in zip(values, stamps, strict=False):
                    yield family, both, v, ts
    for family in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_DRAM_ACTIVE"):
        for i, (scenario, _, bucket) in enumerate(servers):
            card, dram = SCENARIOS[scenario]
            value = str(dram) if family.endswith("DRAM_ACTIVE") else "71234"
            labels = (
                f'gpu="{i % 8}",UUID="GPU-{i:08x}",modelName="{card}",Hostname="node-{i // 8}",'
                f'namespace="llm",pod="vllm-{i}",container="vllm",slice="{i // SLICE}",'
                f'{SHARD_LABEL}="{bucket}"'
            )
            for ts in stamps:
                yield family, labels, value, ts


def write_data(folder: Path, n: int, t0: float) -> None:
    """N servers' samples as OpenMetrics (promtool) and as VictoriaMetrics' import text."""
    family = ""
    with (
        (folder / "fleet.om").open("w", encoding="utf-8") as om,
        (folder / "fleet.vm").open("w", encoding="utf-8") as vm,
    ):
        for name, labels, value, ts in samples(n, t0):
            if name != family:
                om.write(f"# TYPE {name} unknown\n")
                family = name
            om.write(f"{name}{{{labels}}} {value} {ts:.3f}\n")
            vm.write(f"{name}{{{labels}}} {value} {round(ts * 1000)}\n")
        om.write("# EOF\n")


def fleet_flags(
    url: str, kind: str, n: int, *, selector: str, dcgm: str, **shard: int
) -> dict[str, Any]:
    return {
        "source": "prometheus",
        "interval_seconds": STEP,
        "window_seconds": WINDOW,
        "prometheus": {
            "url": url,
            "backend": kind,
            "selector": selector,
            "identity_labels": ["namespace", "pod"],
            "timeout_seconds": 60,
            "max_servers": n,
            "shard": {"buckets": BUCKETS, **shard},
            "dcgm": {"selector": dcgm},
            "models": {MODEL: {"parameters_billion": 8.03, "dtype": "bfloat16"}},
        },
    }


def _measure(flags: dict[str, Any], end: float, out: Any, record: bool, sent_url: str) -> None:
    """Fleet mode with ``flags``, pinned to core 0: a warm-up tick, three measured ticks,
    a /metrics rendering after each. With ``record``, the last tick's answers too."""
    os.sched_setaffinity(0, {0})
    import httpx

    from vllm_triage.assemble import build_fleet
    from vllm_triage.config.load import load_settings
    from vllm_triage.fleet.answers import query_answer
    from vllm_triage.logs import configure
    from vllm_triage.serve.exporter import build_registry
    from vllm_triage.serve.exposition import metrics_app

    configure("error", json=True)
    settings = load_settings(flags=flags)
    now = [end - 3 * STEP]
    ticks: list[dict[str, float]] = []
    answers: dict[str, list[bytes]] = {}

    def sent() -> int:
        return int(httpx.get(sent_url, timeout=30).text) if sent_url else 0

    async def main() -> None:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=16)) as client:
            source = build_fleet(settings, client=client, notifier=None, clock=lambda: now[0])
            query = source.query

            async def keep(q: Any, at: float) -> bytes:
                body = await query(q, at)
                if record and now[0] == end:
                    answers.setdefault(q.key, []).append(body)
                return body

            source.query = keep  # type: ignore[method-assign]
            registry = build_registry(source.states, lambda: [], process_metrics=False)
            app = metrics_app(registry)

            def scraped() -> None:
                """/metrics as Prometheus asks for it (OpenMetrics, gzip)."""
                app({"HTTP_ACCEPT": PROMETHEUS_ACCEPT, "HTTP_ACCEPT_ENCODING": "gzip"}, noop)

            await source.tick()  # warm-up: discovers the servers, builds the rulebooks
            scraped()
            for k in (2, 1, 0):
                now[0] = end - k * STEP
                wire0 = sent()
                cpu0, wall0 = time.process_time(), time.monotonic()
                await source.tick()
                wall = time.monotonic() - wall0
                tick_cpu = time.process_time() - cpu0
                scraped()
                ticks.append(
                    {
                        "cpu": time.process_time() - cpu0,
                        "render": time.process_time() - cpu0 - tick_cpu,
                        "wall": wall,
                        "bytes": source.last_bytes,
                        "wire": sent() - wire0,
                        "judged": sum(1 for w in source.targets.values() if w.state.up),
                        "pieces": len(source.pieces),
                    }
                )
            row: dict[str, Any] = {
                "ticks": ticks,
                "rss": rss_mb(),
                "peak": rss_mb("VmHWM"),
                "ok": source.api.state.up,
                "error": source.api.state.last_error,
                "owned": source.owned,
            }
            if record:
                row["templates"] = templates(answers, query_answer)
                row["present"] = sorted(source.present or ())
            out.put(row)

    asyncio.run(main())


def templates(answers: dict[str, list[bytes]], read: Any) -> dict[int, dict[str, list[Any]]]:
    """Each scenario's rows per query, from the answers' first server of each scenario
    (pod ``vllm-i`` plays scenario ``i % 5``)."""
    out: dict[int, dict[str, list[Any]]] = {}
    for key, bodies in answers.items():
        for body in bodies:
            for row in read(key, body).rows:
                pod = row["metric"].get("pod", "")
                index = int(pod.removeprefix("vllm-")) if pod.startswith("vllm-") else -1
                if 0 <= index < len(SCENARIOS):
                    out.setdefault(index, {}).setdefault(key, []).append(
                        (row["metric"], row["value"][1])
                    )
    return out


def query_keys(flags: dict[str, Any], present: list[str]) -> dict[str, str]:
    """Each query these settings send, without its shard matcher -> its key."""
    import httpx
    from fleet_replay import piece_of

    from vllm_triage.assemble import build_fleet
    from vllm_triage.config.load import load_settings

    source = build_fleet(load_settings(flags=flags), client=httpx.AsyncClient(), notifier=None)
    return {piece_of(q.promql)[0]: q.key for q in source.plan.queries(frozenset(present))}


def run_measure(
    flags: dict[str, Any], end: float, *, record: bool = False, sent_url: str = ""
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(flags, end, out, record, sent_url))
    proc.start()
    row: dict[str, Any] = out.get(timeout=1800)
    proc.join(timeout=60)
    return row


def ready(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def start_backend(kind: str, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    from support.harness import free_port, wait_for

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (folder / f"{kind}.log").open("wb")
    if kind == "prometheus":
        (folder / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
        args = [
            "prometheus",
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            "--storage.tsdb.retention.time=10y",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        health = url + "/-/ready"
    else:
        args = [
            "victoria-metrics",
            f"-storageDataPath={folder / 'vm-data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y",
        ]
        health = url + "/health"
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    os.sched_setaffinity(proc.pid, {1})  # the backend on the other core
    wait_for(lambda: ready(health), timeout=300, every=0.5)
    if kind == "victoriametrics":
        import httpx

        with (folder / "fleet.vm").open("rb") as data:
            answer = httpx.post(url + "/api/v1/import/prometheus", content=data, timeout=3600)
        if answer.status_code != 204:
            raise RuntimeError(f"VictoriaMetrics refused the import: {answer.text[:200]}")
        httpx.get(url + "/internal/force_flush", timeout=600)
    return proc, url


def backends(counts: list[int]) -> dict[str, Any] | None:
    """Every size on Prometheus and on VictoriaMetrics; the smallest size's answers on
    Prometheus, recorded for the replay."""
    missing = [b for b in ("promtool", "prometheus", "victoria-metrics") if shutil.which(b) is None]
    if missing:
        needs = ", ".join(missing)
        print(f"  needs Debian's prometheus and victoria-metrics packages ({needs}): not run")
        return None
    end = time.time() - 3600
    end -= end % STEP
    t0 = end - STEP * (SAMPLES - 1)
    recording: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        folder = Path(tmp)
        started = time.monotonic()
        write_data(folder, max(counts), t0)
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", "fleet.om", "data"],
            cwd=folder,
            check=True,
            capture_output=True,
        )
        (folder / "fleet.om").unlink()
        took = time.monotonic() - started
        print(f"  ({max(counts)} servers written and backfilled in {took:.0f} s)")
        print(
            f"  {'servers':>7} {'backend':>16} {'backend CPU':>12} {'daemon CPU':>11} "
            f"{'bytes':>10} {'daemon RSS':>11}   (per server and tick; RSS whole)"
        )
        for kind in ("prometheus", "victoriametrics"):
            proc, url = start_backend(kind, folder)
            try:
                for n in counts:
                    slices = "|".join(str(k) for k in range((n + SLICE - 1) // SLICE))
                    flags = fleet_flags(
                        url,
                        kind,
                        n,
                        selector=f'{{job="vllm", slice=~"{slices}"}}',
                        dcgm=f'{{slice=~"{slices}"}}',
                    )
                    cpu0 = proc_cpu_s(proc.pid)
                    record = kind == "prometheus" and n == min(counts)
                    row = run_measure(flags, end, record=record)
                    backend_cpu = (proc_cpu_s(proc.pid) - cpu0) / 4  # four ticks
                    report_backend(kind, n, row, backend_cpu)
                    if record:
                        recording = row
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    return recording


def report_backend(kind: str, n: int, row: dict[str, Any], backend_cpu: float) -> None:
    t = row["ticks"][-1]
    cpu = max(x["cpu"] for x in row["ticks"])
    judged = all(x["judged"] == n for x in row["ticks"]) and row["ok"]
    print(
        f"  {n:7,d} {kind:>16} {backend_cpu / n * 1000:9.2f} ms {cpu / n * 1000:8.2f} ms "
        f"{t['bytes'] / n / 1024:6.1f} KiB {row['rss']:7.0f} MB"
        + ("" if judged else f"   NOT all judged ({row['error'][:100]})"),
        flush=True,
    )


def replay(recording: dict[str, Any], sizes: list[int], shards: list[int]) -> None:
    """One replica of ``count`` at each size, against the replayed answers."""
    from fleet_replay import Replay, serve

    from support.harness import free_port, wait_for

    end = time.time() - 3600
    end -= end % STEP
    print(
        f"  {'servers':>7} {'shards':>6} {'judged':>7} {'CPU a tick':>11} {'of a core':>9} "
        f"{'/metrics':>8} {'tick':>6} {'RSS (peak)':>13} {'bytes a tick':>13} {'sent':>9} "
        f"{'vs 1 shard':>10}"
    )
    for n in sizes:
        ctx = mp.get_context("spawn")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        started = ctx.Event()
        flags = fleet_flags(url, "prometheus", n, selector='{job="vllm"}', dcgm="")
        keys = query_keys(flags, recording["present"])
        server = ctx.Process(
            target=serve,
            args=(Replay(recording["templates"], keys, recording["present"], n, BUCKETS), port),
            kwargs={"ready": started},
            daemon=True,
        )
        server.start()
        if server.pid is not None:
            os.sched_setaffinity(server.pid, {1})
        try:
            if not started.wait(timeout=600):
                raise RuntimeError("the replay server did not start")
            wait_for(functools.partial(ready, url + "/sent"), timeout=60, every=0.2)
            whole: float | None = None
            for count in shards:
                cap = math.ceil(n / count * 1.2)
                flags = fleet_flags(
                    url, "prometheus", cap, selector='{job="vllm"}', dcgm="", index=0, count=count
                )
                row = run_measure(flags, end, sent_url=url + "/sent")
                whole = report_replay(n, count, row, whole)
        finally:
            server.kill()
            server.join(timeout=30)


def report_replay(n: int, count: int, row: dict[str, Any], whole: float | None) -> float:
    ticks = row["ticks"]
    cpu = max(x["cpu"] for x in ticks)
    share = cpu / STEP
    t = ticks[-1]
    whole = whole if whole else max(1, t["bytes"])
    sustained = (
        row["ok"]
        and all(x["judged"] == row["owned"] for x in ticks)
        and share < CPU_GOAL
        and max(x["wall"] for x in ticks) < STEP
        and row["peak"] < MEMORY_GOAL_MB
    )
    print(
        f"  {n:7,d} {count:6d} {row['owned']:7,d} {cpu:9.2f} s {share:8.0%} "
        f"{t['render']:6.2f} s {max(x['wall'] for x in ticks):5.1f}s "
        f"{row['rss']:5.0f} ({row['peak']:4.0f}) MB {t['bytes'] / 2**20:9.1f} MiB "
        f"{t['wire'] / 2**20:6.1f} MiB {t['bytes'] / whole:9.2f}x   "
        f"{t['pieces']} pieces: "
        + ("sustained" if sustained else "NOT sustained")
        + ("" if row["ok"] else f" ({row['error'][:100]})"),
        flush=True,
    )
    return whole


def main(argv: list[str]) -> int:
    def listed(flag: str, default: list[int]) -> list[int]:
        """A comma-separated list of sizes (0: none)."""
        if flag in argv:
            return [int(x) for x in argv[argv.index(flag) + 1].split(",") if int(x)]
        return default

    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    quick = "--quick" in argv
    counts = listed("--servers", [250, 500] if quick else [250, 500, 1000, 2000])
    sizes = listed("--replay", [10000] if quick else [10000, 20000])
    shards = listed("--shards", [1, 4] if quick else [1, 2, 4])
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(
        f"fleet mode on Prometheus and VictoriaMetrics, {STEP:g} s step, {WINDOW:g} s window, "
        f"shard buckets {BUCKETS}, max_servers = the servers measured:"
    )
    recording = backends(counts)
    if recording is None or not sizes:
        return 0
    print(
        f"one replica against answers recorded from Prometheus at {min(counts)} servers, "
        f"replayed (goals: under {CPU_GOAL:.0%} of a core and {MEMORY_GOAL_MB} MB at 10,000; "
        "a quarter of the bytes over 4 shards):"
    )
    replay(recording, sizes, shards)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
