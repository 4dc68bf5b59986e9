"""``vllm-triage record URL --out DIR``: save each scrape's raw body for ``replay``."""

from __future__ import annotations

import argparse
import sys

from vllm_triage.commands.argtypes import (
    add_runtime,
    http_url,
    metrics_url,
    positive_float,
    positive_int,
    seconds,
)
from vllm_triage.core.counts import counted


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "record",
        help="save a target's /metrics, one file per scrape, for replay",
        description=(
            "Scrape URL every --interval seconds and write each raw body to "
            "DIR/<unix_time_ms>.prom. A first scrape that cannot connect ends it at "
            "once (exit 1); later, a failed scrape is logged and skipped and the "
            "recording goes on. Without --duration it runs until Ctrl-C. Exit 1 if nothing "
            "usable was recorded (every scrape failed, or no body held vLLM metrics). A "
            "recording of an incident (a slow server, a stalled engine) can be diagnosed "
            "again later, exactly, with `replay` or `report`."
        ),
    )
    p.add_argument(
        "url",
        type=http_url,
        help="the vLLM server's metrics URL, e.g. http://127.0.0.1:8000/metrics",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write into (created)")
    p.add_argument(
        "--interval",
        type=seconds,
        default=5.0,
        metavar="S",
        help="seconds between scrapes (default 5)",
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        default=None,
        metavar="S",
        help="stop after S seconds (default: until Ctrl-C)",
    )
    p.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        metavar="S",
        help="per-scrape timeout (default: the interval, at most 10 s)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=16 * 1024 * 1024,
        metavar="N",
        help="refuse bodies larger than this (default 16 MiB)",
    )
    add_runtime(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vllm_triage.errors import ScrapeError
    from vllm_triage.recording.record import record

    try:
        stats = record(
            metrics_url(args.url, args.runtime),
            args.out,
            runtime=args.runtime,
            interval=args.interval,
            duration=args.duration,
            timeout=args.timeout,
            max_body_bytes=args.max_body_bytes,
        )
    except ScrapeError as exc:
        what = "cannot connect" if exc.reason == "connect" else "refused"
        print(f"vllm-triage record: error: {what}, nothing recorded: {exc}", file=sys.stderr)
        return 1
    if stats.written > stats.unparseable:
        return 0
    if stats.written:
        why = f"none of the {stats.written} bodies written to {args.out} holds vLLM metrics"
    else:
        which = "the" if stats.failed == 1 else "all"
        why = f"nothing recorded: {which} {counted(stats.failed, 'scrape')} failed"
    print(f"vllm-triage record: error: {why}: {stats.last_error}", file=sys.stderr)
    return 1
