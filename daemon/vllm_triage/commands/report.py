"""``vllm-triage report DIR --out report.html``: a post-mortem page from a recording."""

from __future__ import annotations

import argparse
import sys

from vllm_triage.core.counts import counted


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="write a post-mortem report (one HTML file) from a recording",
        description=(
            "Run the diagnosis over a recording made by `record` or `simulate --record`, as "
            "`replay` does, and write one self-contained HTML file: each incident (its cause: "
            "prefill_bound, decode_bound, queue_bound, kv_pressure or stalled; "
            "its start, duration, confidence, the evidence that decided it, contributing causes, "
            "what to change) and aligned charts of TTFT, ITL, requests running and waiting, "
            "KV cache, preemptions, prefill share and the decode rate against the hardware, "
            "with the incidents shaded by cause. It opens offline: no network fetches."
        ),
    )
    p.add_argument("directory", metavar="DIR", help="a folder of <unix_time_ms>.prom files")
    p.add_argument(
        "--config", metavar="FILE", help="YAML settings (SLOs, hardware, model, thresholds)"
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        default="report.html",
        help="where to write the HTML file (default report.html)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vllm_triage.assemble import report_parts
    from vllm_triage.config.load import load_settings
    from vllm_triage.recording.reportfile import write_report

    parts = report_parts(load_settings(args.config))
    try:
        written = write_report(args.directory, parts, args.out)
    except OSError as exc:
        print(
            f"vllm-triage report: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr
        )
        return 1
    print(
        f"wrote {written.path} ({written.size_bytes / 1e6:.2f} MB): "
        f"{counted(written.incidents, 'incident')} over "
        f"{counted(written.evaluations, 'evaluation')}, "
        f"{counted(written.skipped, 'file')} not usable",
        file=sys.stderr,
    )
    print(written.path)
    return 0
