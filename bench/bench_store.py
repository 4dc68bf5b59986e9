"""Benchmark: what durable alert state costs per write (daemon/vllm_triage/store.py).

Every incident transition and every delivery outcome is written through to the SQLite
file on the event loop's thread, so a write must cost little next to an evaluation
(about 1 ms, bench/bench_core.py). Measured, each as the median and 99th percentile of
many single operations, in a temporary folder on the machine's disk:

- ``enqueue + remove``: one notification queued and then delivered (two commits);
- ``incident count``: one evaluation that changed only a pending or resolving count;
- ``transition``: one firing as the daemon writes it, in one transaction: the incident's
  state, the active alert, the log entry and the queued notification;
- the same through the real ``Notifier`` with one receiver, against no store at all.

``synchronous=NORMAL`` is what the store uses (a kill loses nothing; a power cut may
lose the last commits); ``FULL`` (an fsync per commit) is shown for comparison.

Run with ``make bench`` or ``.venv/bin/python bench/bench_store.py``.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import structlog

from vllm_triage.assemble import build_notifier
from vllm_triage.config.load import load_settings
from vllm_triage.core.alerts import firing_alert
from vllm_triage.core.dedup import LastSent
from vllm_triage.core.incidents import State, TrackRecord
from vllm_triage.core.model import Diagnosis, Reason, Transition
from vllm_triage.notify.notifier import Notifier
from vllm_triage.store import Notification, StateStore

N = 2000
T0 = 1_800_000_000.0


def transition(i: int) -> Transition:
    d = Diagnosis(
        model_name=f"model-{i}",
        at=T0 + i,
        breaches=("ttft_p99", "waiting"),
        cause="queue_bound",
        confidence=0.9,
        summary="requests wait while the KV cache has room",
        evidence={"waiting_mean": 12.0, "queue_share_of_ttft": 0.8},
        remediation=("raise --max-num-seqs",),
    )
    return Transition("firing", Reason.OPENED, d.model_name, "queue_bound", d.at, d.at, d)


def timed(op: Callable[[int], object], n: int = N) -> tuple[float, float]:
    """Median and p99 of one call, in microseconds."""
    costs = []
    for i in range(n):
        began = time.perf_counter()
        op(i)
        costs.append((time.perf_counter() - began) * 1e6)
    costs.sort()
    return statistics.median(costs), costs[int(0.99 * (len(costs) - 1))]


def bench(synchronous: str) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        store = StateStore.open(Path(folder))
        assert store is not None
        store._conn.execute(f"PRAGMA synchronous = {synchronous}")
        body = b"x" * 1500  # a webhook payload is 1-2 KB
        out["enqueue + remove"] = timed(
            lambda i: store.remove(store.enqueue("pager", Notification(body, f"n{i}")))
        )

        def count(i: int) -> None:
            record = TrackRecord(
                model_name="m", state=State.RESOLVING, run=i % 3, cause="kv_pressure", started_at=T0
            )
            store.save_incidents("target", (record,))

        out["incident count"] = timed(count)

        def one_transition(i: int) -> None:
            t = transition(i)
            alert = firing_alert(t, target="target", severity="warning", external_url="http://x")
            record = TrackRecord(
                model_name=t.model_name,
                state=State.FIRING,
                run=0,
                cause="queue_bound",
                started_at=t.at,
            )
            with store.batch():
                store.save_incidents(f"target-{i}", (record,))
                store.put_alert(alert)
                store.put_log("pager", alert.key, LastSent("firing", t.at))
                store.enqueue("pager", Notification(body, "firing"))

        out["transition"] = timed(one_transition)
        store.close()
    return out


def bench_notifier() -> dict[str, tuple[float, float]]:
    settings = load_settings(
        flags={"receivers": [{"type": "alertmanager_webhook", "url": "http://127.0.0.1:9/h"}]}
    )
    client = httpx.AsyncClient()
    out: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for label, store in (("no store", None), ("store", StateStore.open(Path(folder)))):
            n = build_notifier(settings, client, "http://x", store)

            def notify(i: int, n: Notifier = n, store: StateStore | None = store) -> None:
                if store is None:
                    n.notify("target", [transition(i)], now=T0 + i)
                else:
                    with store.batch():
                        n.notify("target", [transition(i)], now=T0 + i)

            out[f"Notifier.notify, firing, {label}"] = timed(notify, n=N // 2)
            if store is not None:
                store.close()
    asyncio.run(client.aclose())
    return out


def main() -> None:
    # The store's "opened" lines are not the point here.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print(f"State store: microseconds per operation, {N} each (median / p99)")
    print("| operation | synchronous=NORMAL (used) | synchronous=FULL |")
    print("|---|---|---|")
    normal, full = bench("NORMAL"), bench("FULL")
    for name in normal:
        (m1, p1), (m2, p2) = normal[name], full[name]
        print(f"| {name} | {m1:.0f} / {p1:.0f} | {m2:.0f} / {p2:.0f} |")
    for name, (m, p) in bench_notifier().items():
        print(f"| {name} | {m:.0f} / {p:.0f} | |")


if __name__ == "__main__":
    main()
