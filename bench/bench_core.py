"""Benchmark: one payload -> Snapshot -> signals -> diagnosis, against a bare
prometheus_client parse of the same bytes, measured side by side in one run.

Run with ``make bench``. Each figure is the best of several repeats (the least disturbed
by other work on a shared machine); the ratio is what the goal is about (>= 4x), since
both sides run on the same machine in the same minute.
"""

from __future__ import annotations

import gc
import itertools
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_triage.assemble import build_evaluator
from vllm_triage.config.load import load_settings
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.rules import runtime_table

from payloads import many_models, one_model

GOAL = 4.0


def best_seconds(fns: list[Callable[[], object]], number: int, repeat: int = 7) -> list[float]:
    """Best time per call of each function, their repeats interleaved, so that a burst of
    load on the machine hits all of them alike rather than one."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            gc.collect()
            best[i] = min(best[i], timeit.timeit(fn, number=number) / number)
    return best


def measure(name: str, text: str, number: int) -> tuple[str, float, float, float, float]:
    settings = load_settings()
    clock = itertools.count(start=1_700_000_000, step=5)

    # Warm: one parser and one evaluator per target, as the daemon keeps them, with a
    # full 60 s window behind each evaluation.
    parser = SnapshotParser(runtime_table())
    evaluator = build_evaluator(settings)
    for _ in range(13):
        evaluator.step(parser.parse(text, float(next(clock))))

    def ours_warm() -> None:
        evaluator.step(parser.parse(text, float(next(clock))))

    # Cold: a new parser each time (no label-set memo), same evaluator.
    def ours_cold() -> None:
        evaluator.step(SnapshotParser(runtime_table()).parse(text, float(next(clock))))

    def reference() -> None:
        for family in text_string_to_metric_families(text):
            for _ in family.samples:
                pass

    ref, warm, cold = best_seconds([reference, ours_warm, ours_cold], number)
    return name, len(text) / 1024, ref, warm, cold


def main() -> int:
    rows = [
        measure("1 model (vLLM 0.19.1 capture)", one_model(), number=50),
        measure("8 models (same families x 8)", many_models(8), number=10),
    ]
    print(
        f"{'payload':32} {'KiB':>6} {'prometheus_client':>18} {'ours (warm)':>12} "
        f"{'ours (cold)':>12} {'ratio warm':>10} {'ratio cold':>10}"
    )
    ok = True
    for name, kib, ref, warm, cold in rows:
        print(
            f"{name:32} {kib:6.0f} {ref * 1e3:15.2f} ms {warm * 1e3:9.2f} ms "
            f"{cold * 1e3:9.2f} ms {ref / warm:9.1f}x {ref / cold:9.1f}x"
        )
        ok = ok and ref / cold >= GOAL
    print(
        f"goal: parse + evaluate at least {GOAL:g}x faster than the bare parse "
        f"(cold, the stricter figure): {'met' if ok else 'NOT met'}"
    )
    print(f"python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
