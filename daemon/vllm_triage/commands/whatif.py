"""``vllm-triage whatif DIR --change KEY=VALUE``: a recording's window replayed by the
simulator calibrated to it, on the server as it was and as changed."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vllm_triage.commands.argtypes import http_url, positive_float, seconds, seconds_at_most
from vllm_triage.core.counts import counted
from vllm_triage.core.predict import CHANGE_KEYS
from vllm_triage.core.shown import one_line
from vllm_triage.errors import ConfigError, RecordingError, ScrapeError
from vllm_triage.whatif.budget import MAX_WINDOW_SECONDS

window_seconds = seconds_at_most(MAX_WINDOW_SECONDS)

DESCRIPTION = """\
Calibrate the simulator to one window of a recording (made by `record`) and run that
window's load on the server as changed. The window is the settings' window ending --at
seconds from the recording's start; by default, the first whole window of the first
incident (where the incident ended before a whole window, the longest stretch of it;
with no incident, the last window). A metric whose calibrated replay
misses what was measured by more than 20 % is said, and its `after` marked (!); each
change gets one line (why:) saying which term it moves and what the load made of it. From it:
the arrivals interval by interval, the prompt and output lengths, the queue it began
with, the KV pool, the card and model (from --config, as the diagnosis used them), and
the per-step overhead (the measured decode step minus the floor, fitted until the
replay's step matches). `before` is what the recording measured; with no --change,
`after` is the calibrated model's own replay, so its calibration error shows.
--target URL instead watches a live server for --window seconds (scraping every
--interval) and calibrates to that window."""

EPILOG = (
    "change keys:\n"
    + "\n".join(f"  {k:<24}{v}" for k, v in CHANGE_KEYS.items())
    + """

examples:
  vllm-triage whatif rec/ --config triage.yaml
  vllm-triage whatif rec/ --config triage.yaml --change kv_cache_dtype=fp8
  vllm-triage whatif rec/ --change replicas=2 --change max_num_seqs=512 --format json
  vllm-triage whatif --target http://127.0.0.1:8000/metrics --change kv_cache_dtype=fp8

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
    p.add_argument(
        "directory", metavar="DIR", nargs="?", help="a folder of <unix_time_ms>.prom files"
    )
    p.add_argument(
        "--target",
        type=http_url,
        metavar="URL",
        help="instead of DIR: watch this live server's metrics URL for one window",
    )
    p.add_argument(
        "--window",
        type=window_seconds,
        metavar="S",
        help="with --target: seconds to watch (default: the settings' window_seconds; at "
        f"most {MAX_WINDOW_SECONDS:g})",
    )
    p.add_argument(
        "--interval",
        type=seconds,
        default=5.0,
        metavar="S",
        help="with --target: seconds between scrapes (default 5)",
    )
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
            # Metrics the replay misses by more than the tolerance: their `after` is not
            # to be trusted.
            "off": {k: _finite(v) for k, v in r.off.items()},
        },
        "reasons": list(r.reasons),
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
    off = d["calibration"]["off"]
    for key in d["before"]:
        after = _shown(key, d["after"][key]) + (" !" if key in off else "")
        lines.append(
            f"{key:<30}{_shown(key, d['before'][key]):>12}"
            f"{_shown(key, d['calibration']['replay'][key]):>12}{after:>14}"
        )
    lines.append(
        "per-step overhead fitted: "
        f"{_shown('s_seconds', d['calibration']['step_overhead_seconds'])}"
        f" ({counted(d['calibration']['rounds'], 'round')})"
    )
    for key, error in off.items():
        lines.append(
            f"warning: the calibrated replay misses the measured {key} by {error:+.0%} "
            f"({_shown(key, d['calibration']['replay'][key])} replayed, "
            f"{_shown(key, d['before'][key])} measured): its `after` (marked !) is not to "
            "be trusted"
        )
    lines.extend(f"why: {reason}" for reason in d["reasons"])
    lines.extend(f"note: {n}" for n in d["notes"])
    # A peer's names on one line each, shown and never obeyed (core.shown).
    return "\n".join(one_line(line) for line in lines)


def watch(
    url: str,
    directory: Path,
    *,
    window: float,
    interval: float,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Record ``url`` for one window into ``directory`` (``recording.record``'s pacing and
    files); ``RecordingError`` when fewer than two scrapes could be read."""
    from vllm_triage.net.redact import safe_url
    from vllm_triage.recording.record import record

    try:
        stats = record(
            url,
            directory,
            interval=interval,
            duration=window + interval / 2,
            clock=clock,
            sleep=sleep,
        )
    except ScrapeError as exc:
        # A target that cannot be reached at all fails at its first scrape: no window.
        raise RecordingError(f"{safe_url(url)}: 0 scrapes usable, need 2: {exc}") from exc
    if stats.written - stats.unparseable < 2:
        raise RecordingError(
            f"{safe_url(url)}: {stats.written} of {counted(stats.scrapes, 'scrape')} usable, "
            f"need 2: {stats.last_error or 'no answer'}"
        )


#: The temporary folder of ``--target``: named for the process, so that one left by a
#: run killed outright (SIGKILL: no handler runs) is found and removed by the next run.
TMP_PREFIX = "vllm-triage-whatif-"


def remove_orphans(parent: Path) -> list[Path]:
    """Remove the temporary folders of whatif runs that are no longer running; the ones
    removed."""
    import shutil

    gone = []
    for folder in parent.glob(f"{TMP_PREFIX}*-*"):
        pid = folder.name.removeprefix(TMP_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or folder.is_symlink() or not folder.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(folder)
        except OSError:
            continue  # alive (another user's), or not ours to judge
    return gone


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM (a ``kill``, a container stopped) as ``SystemExit`` while inside: ``with``
    blocks and ``finally`` run, so the temporary folder goes. SIGINT already raises
    ``KeyboardInterrupt``."""
    previous = signal.getsignal(signal.SIGTERM)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    from vllm_triage.assemble import build_evaluator
    from vllm_triage.config.load import load_settings
    from vllm_triage.net.redact import safe_url
    from vllm_triage.whatif.budget import MAX_WATCH_SCRAPES, Budget
    from vllm_triage.whatif.calibrate import whatif
    from vllm_triage.whatif.changes import parse_changes
    from vllm_triage.whatif.window import read_window

    if (args.directory is None) == (args.target is None):
        raise ConfigError("give a recording DIR or --target URL (one of the two)")
    changes = parse_changes(args.change)
    settings = load_settings(args.config)
    window = args.window or settings.window_seconds
    if args.target is not None:
        if window > MAX_WINDOW_SECONDS:
            raise ConfigError(
                f"window_seconds {window:g}: whatif watches and replays at most "
                f"{MAX_WINDOW_SECONDS:g} s (give a shorter --window)"
            )
        if window / args.interval > MAX_WATCH_SCRAPES:
            raise ConfigError(
                f"--window {window:g} every --interval {args.interval:g} s is "
                f"{window / args.interval:,.0f} scrapes; at most {MAX_WATCH_SCRAPES}: "
                "a longer --interval"
            )
    # The wall time is the command's: the simulation's budget counts it from here.
    budget = Budget(clock=time.monotonic)
    tmp_root = Path(tempfile.gettempdir())
    remove_orphans(tmp_root)
    with (
        terminated_as_exit(),
        tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-", dir=tmp_root) as tmp,
    ):
        directory = args.directory
        at = args.at
        if args.target is not None:
            # As every command shows a URL: without its user:password or query values.
            print(f"watching {safe_url(args.target)} for {window:g} s ...", file=sys.stderr)
            watch(args.target, Path(tmp), window=window, interval=args.interval)
            directory, at = tmp, None
        obs = read_window(directory, build_evaluator(settings), at)
        result = whatif(obs, lambda: build_evaluator(settings), changes, budget)
    if args.format == "json":
        print(json.dumps(result_dict(result), allow_nan=False))
    else:
        print(result_text(result))
    return 0
