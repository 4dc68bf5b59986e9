"""``vllm-triage simulate``: a simulated vLLM server, as a recording or as a live endpoint.

The simulator (``vllm_triage.simulator``) steps a physically modelled vLLM server in virtual
time and renders ``/metrics`` as vLLM does. This command makes it useful outside the
test suite: ``--record`` writes what ``record`` would have captured (no waiting: ten
simulated minutes take seconds), ready for ``replay``; ``--port`` serves it, so that the
daemon, Prometheus or a dashboard can scrape a server that is slow for a known reason.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from vllm_triage.commands.argtypes import port_number, positive_float, seconds, unix_time
from vllm_triage.core.counts import counted
from vllm_triage.errors import ConfigError
from vllm_triage.simulator import Scenario, get_scenario, hold_last_phase, record, scenario_names
from vllm_triage.simulator.textformat import Naming

#: The engines whose metrics it can write (``simulator.dialects``).
ENGINES = ("vllm", "sglang", "lmdeploy", "trtllm", "vllm-rust")
#: 2026-01-01T00:00:00Z, the demo's start too: the same command writes the same files.
DEFAULT_START = 1_767_225_600.0
DEFAULT_INTERVAL_S = 5.0
DEFAULT_HOST = "127.0.0.1"
DEFAULT_SPEED = 1.0

DESCRIPTION = """\
Simulate a vLLM server under a scenario (a bundled one, or your own YAML file; copy one
from rules/scenarios/ to start) and either write a recording in `record`'s format
(--record, in virtual time: no waiting) or serve GET /metrics and /health like vLLM
(--port). Past the scenario's last phase, that phase's load goes on: a fault scenario
stays faulty, `tour` ends healthy. The numbers follow the physics of the card and model
in the scenario: prefill is compute-bound, decode is bandwidth-bound, the KV pool is a
fixed number of blocks."""

EPILOG = """\
examples:
  vllm-triage simulate --scenario kv_pressure --record rec/ --duration 600
  vllm-triage replay rec/
  vllm-triage simulate --scenario tour --port 8000 --speed 10
  vllm-triage simulate --scenario ./my-scenario.yaml --record rec/ --duration 300 --naming v0
  vllm-triage simulate --scenario kv_pressure --engine sglang --record rec/ --duration 300

--naming v1 writes vLLM's current (V1 engine) metric names, v0 those of vLLM 0.5.
--engine sglang, lmdeploy, trtllm or vllm-rust writes that engine's metrics instead
(its names, label sets, buckets, and what it observes when): docs/engines.md."""


def _names_for_help() -> str:
    try:
        return ", ".join(scenario_names())
    except ConfigError:  # a broken install: say so when run, not in --help
        return "see rules/scenarios/"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``simulate`` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "simulate",
        help="simulate a vLLM server: write a recording, or serve /metrics (no GPU needed)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenario",
        required=True,
        metavar="NAME|FILE",
        help=f"a bundled scenario ({_names_for_help()}) or a scenario YAML file",
    )
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument(
        "--record", metavar="DIR", help="write DIR/<unix_time_ms>.prom scrapes (needs --duration)"
    )
    out.add_argument(
        "--port", type=port_number, metavar="P", help="serve GET /metrics on this port"
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        metavar="S",
        help="simulated seconds: the recording's length (required with --record); when "
        "serving, exit after S simulated seconds (default: serve until Ctrl-C or SIGTERM)",
    )
    p.add_argument(
        "--naming",
        choices=("v1", "v0"),
        default="v1",
        help="metric names of vLLM's V1 engine (default) or of vLLM 0.5",
    )
    p.add_argument(
        "--engine",
        "--runtime",
        dest="engine",
        choices=ENGINES,
        default="vllm",
        help="the serving engine whose metrics to write: vllm (default), sglang, lmdeploy, "
        "trtllm (served at /prometheus/metrics, as trtllm-serve does) or vllm-rust (vLLM's "
        "Rust frontend: OpenMetrics)",
    )
    rec = p.add_argument_group("with --record")
    rec.add_argument(
        "--interval",
        type=seconds,
        metavar="S",
        help=f"simulated seconds between scrapes (default {DEFAULT_INTERVAL_S:g})",
    )
    rec.add_argument(
        "--start",
        type=unix_time,
        metavar="UNIX_SECONDS",
        help="time of the first scrape (default 2026-01-01T00:00:00Z, so reruns are identical)",
    )
    live = p.add_argument_group("with --port")
    live.add_argument("--host", metavar="H", help=f"address to listen on (default {DEFAULT_HOST})")
    live.add_argument(
        "--speed",
        type=positive_float,
        metavar="X",
        help="simulated seconds per wall-clock second (default 1; 60 plays a minute a second)",
    )
    p.set_defaults(func=run)


def _error(message: str) -> None:
    print(f"vllm-triage simulate: error: {message}", file=sys.stderr)


def _misused_flags(args: argparse.Namespace) -> str | None:
    """Flags of the other mode: refused rather than silently ignored."""
    if args.record is not None:
        if args.duration is None:
            return "--record needs --duration (simulated seconds to record)"
        return _only_for(args, ("host", "speed"), "--port")
    return _only_for(args, ("interval", "start"), "--record")


def _only_for(args: argparse.Namespace, flags: tuple[str, ...], mode: str) -> str | None:
    given = [f"--{f}" for f in flags if getattr(args, f) is not None]
    if not given:
        return None
    return f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} only for {mode}"


def _naming(args: argparse.Namespace) -> Naming:
    """What to render: vLLM's era (``--naming``) or another engine's dialect."""
    naming: Naming = args.naming if args.engine == "vllm" else args.engine
    return naming


def run(args: argparse.Namespace) -> int:
    """Load the scenario, then record or serve; user errors are one line on stderr."""
    misused = _misused_flags(args)
    if misused:
        _error(misused)
        return 2
    if args.engine != "vllm" and args.naming != "v1":
        _error(f"--naming is vLLM's; --engine {args.engine} has its own names")
        return 2
    try:
        scenario = get_scenario(args.scenario)
    except KeyError as exc:
        _error(str(exc.args[0]))
        return 2
    except ConfigError as exc:
        _error(str(exc))
        return 2
    if args.record is not None:
        return _record(args, scenario)
    return _serve(args, scenario)


def _record(args: argparse.Namespace, scenario: Scenario) -> int:
    from vllm_triage.recording.files import write_scrape

    directory = Path(args.record)
    interval = args.interval or DEFAULT_INTERVAL_S
    start = DEFAULT_START if args.start is None else args.start
    try:
        if directory.exists() and not directory.is_dir():
            _error(f"{directory}: not a directory")
            return 1
        if directory.is_dir() and any(directory.glob("*.prom")):
            # Scrape times would collide or interleave with the other recording's.
            _error(f"{directory}: already holds a recording; give a new or empty folder")
            return 1
        directory.mkdir(parents=True, exist_ok=True)
        began = time.perf_counter()
        written = 0
        for at, body in record(
            hold_last_phase(scenario, args.duration),
            start_at=start,
            interval_s=interval,
            duration_s=args.duration,
            naming=_naming(args),
        ):
            write_scrape(directory, round(at * 1000), body.encode("utf-8"))
            written += 1
    except OSError as exc:
        _error(f"{directory}: cannot write: {exc.strerror or exc}")
        return 1
    print(
        f"simulate: wrote {counted(written, 'scrape')} of {scenario.name} "
        f"({args.duration:g} simulated s, "
        f"every {interval:g} s, {_naming(args)} names) to {directory} "
        f"in {time.perf_counter() - began:.1f} s",
        file=sys.stderr,
    )
    return 0


class _StopFlag:
    """Set by SIGINT/SIGTERM. A plain attribute, no lock: the handler runs between two
    bytecodes of the main thread, which may hold any lock at that moment."""

    def __init__(self) -> None:
        self.raised = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.raised = True


def _serve(args: argparse.Namespace, scenario: Scenario) -> int:
    from vllm_triage.simulator.serve import SimulatedServer

    host = args.host or DEFAULT_HOST
    try:
        server = SimulatedServer(
            scenario,
            host=host,
            port=args.port,
            speed=args.speed or DEFAULT_SPEED,
            naming=_naming(args),
            until_s=args.duration,
        )
    except OSError as exc:  # port in use, address not local, name not resolved
        # A settings problem, as `run` says of its own --listen: exit 2.
        _error(f"cannot listen on {host}:{args.port}: {exc.strerror or exc}")
        return 2
    flag = _StopFlag()
    previous = {sig: signal.signal(sig, flag) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(lambda: flag.raised)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
