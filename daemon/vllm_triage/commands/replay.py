"""``vllm-triage replay DIR``: run the diagnosis over a recording, print the transitions."""

from __future__ import annotations

import argparse
import sys

from vllm_triage.commands.argtypes import add_runtime


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="run the diagnosis over a recording and print every incident transition",
        description=(
            "Run the diagnosis core over a recording made by `record`, in file-name order, "
            "using the file names as scrape times, and print every incident transition "
            "(firing, resolved: prefill_bound, decode_bound, queue_bound, kv_pressure, "
            "stalled). Unreadable files are reported on stderr and skipped."
        ),
    )
    p.add_argument("directory", metavar="DIR", help="a folder of <unix_time_ms>.prom files")
    p.add_argument(
        "--config", metavar="FILE", help="YAML settings (SLOs, hardware, model, thresholds)"
    )
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text for people, json for one object per line (default text)",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 if any file could not be used")
    add_runtime(p)
    p.set_defaults(func=run)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def run(args: argparse.Namespace) -> int:
    from vllm_triage.assemble import build_evaluator
    from vllm_triage.config.load import load_settings
    from vllm_triage.core.evaluate import Evaluation
    from vllm_triage.core.report import transition_json, transition_text
    from vllm_triage.recording.replay import replay

    evaluator = build_evaluator(load_settings(args.config))
    files = skipped = transitions = 0
    for item in replay(args.directory, evaluator, runtime=args.runtime):
        files += 1
        if not isinstance(item, Evaluation):
            skipped += 1
            print(f"skipped {item.path.name}: {item.reason}", file=sys.stderr)
            continue
        for t in item.transitions:
            transitions += 1
            print(transition_json(t) if args.format == "json" else transition_text(t), flush=True)
    if args.format == "text":
        print(
            f"replayed {_count(files, 'file')} ({skipped} skipped): "
            f"{_count(transitions, 'transition')}",
            file=sys.stderr,
        )
    return 1 if args.strict and skipped else 0
