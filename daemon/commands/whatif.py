"""``vllm-triage whatif DIR --change KEY=VALUE``: a recording's window replayed by the
simulator calibrated to it, on the server as it was and as changed."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from vllm_triage.commands.argtypes import positive_float
from vllm_triage.core.predict import CHANGE_KEYS

DESCRIPTION = """\
Calibrate the simulator to one window of a recording (made by `record`) and run that
window's load on the server as changed. The window is the one at --at seconds from the
recording's start (default: the window of the first firing, else the last). From it:
the arrivals interval by interval, the prompt and output lengths, the queue it began
with, the KV pool, the card and model (from --config, as the diagnosis used them), and
the per-step overhead (the measured decode step minus the floor, fitted until the
replay's step matches). `before` is what the recording measured; with no --change,
`after` is the calibrated model's own replay, so its calibration error shows."""

EPILOG = (
    "change keys:\n"
    + "\n".join(f"  {k:<24}{v}" for k, v in CHANGE_KEYS.items())
    + """

examples:
  vllm-triage whatif rec/ --config triage.yaml
  vllm-triage whatif rec/ --config triage.yaml --change kv_cache_dtype=fp8
  vllm-triage whatif rec/ --change replicas=2 --change max_num_seqs=512 --format json

Exit codes: 0 done; 1 the recording has no usable window; 2 a bad change or setting."""
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "whatif",
        help="predict a change's effect: the simulator calibrated to a recording's window",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("directory", metavar="DIR", help="a folder of <unix_time_ms>.prom files")
    p.add_argument(
        "--change",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a change to the server or its load (repeatable; keys below)",
    )
    p.add_argument(
        "--at",
        type=positive_float,
        metavar="SECONDS",
        help="the window ending this many seconds after the recording's first scrape",
    )
    p.add_argument(
        "--config", metavar="FILE", help="YAML settings (SLOs, hardware, model, thresholds)"
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def _finite(v: float | None) -> float | None:
    return float(f"{v:.6g}") if v is not None and math.isfinite(v) else None


def result_dict(r: Any) -> dict[str, Any]:
    return {
        "at": round(r.obs.offset_seconds, 3),
        "model_name": r.obs.model,
        "cause": r.obs.cause,
        "window_seconds": round(r.obs.span_seconds, 3),
        "changes": dict(r.changes),
        "before": {k: _finite(v) for k, v in r.before.items()},
        "after": {k: _finite(v) for k, v in r.after.items()},
        "calibration": {
            "replay": {k: _finite(v) for k, v in r.replay.items()},
            "error": {
                k: _finite(r.replay[k] / v - 1)
                for k, v in r.before.items()
                if v and r.replay.get(k) is not None
            },
            "step_overhead_seconds": _finite(r.overhead_s),
            "rounds": r.rounds,
        },
        "notes": list(r.notes),
    }


def _shown(key: str, v: float | None) -> str:
    if v is None:
        return "-"
    if key.endswith("_seconds"):
        return f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s"
    if key == "kv_usage_mean":
        return f"{v:.1%}"
    return f"{v:.3g}"


def result_text(r: Any) -> str:
    d = result_dict(r)
    changes = ", ".join(f"{k}={v}" for k, v in d["changes"].items()) or "none (calibration)"
    lines = [
        f"window ending {d['at']:g} s into the recording ({d['window_seconds']:g} s, "
        f"{d['model_name']}, {d['cause'] or 'nothing'} diagnosed); changes: {changes}",
        f"{'':<30}{'before':>12}{'replay':>12}{'after':>12}",
    ]
    for key in d["before"]:
        lines.append(
            f"{key:<30}{_shown(key, d['before'][key]):>12}"
            f"{_shown(key, d['calibration']['replay'][key]):>12}{_shown(key, d['after'][key]):>12}"
        )
    lines.append(
        "per-step overhead fitted: "
        f"{_shown('s_seconds', d['calibration']['step_overhead_seconds'])}"
        f" ({d['calibration']['rounds']} rounds)"
    )
    lines.extend(f"note: {n}" for n in d["notes"])
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from vllm_triage.assemble import build_evaluator
    from vllm_triage.config.load import load_settings
    from vllm_triage.whatif.calibrate import whatif
    from vllm_triage.whatif.changes import parse_changes
    from vllm_triage.whatif.window import read_window

    changes = parse_changes(args.change)
    settings = load_settings(args.config)
    obs = read_window(args.directory, build_evaluator(settings), args.at)
    result = whatif(obs, lambda: build_evaluator(settings), changes)
    if args.format == "json":
        print(json.dumps(result_dict(result), allow_nan=False))
    else:
        print(result_text(result))
    return 0
