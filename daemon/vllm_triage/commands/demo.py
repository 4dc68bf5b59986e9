"""``vllm-triage demo``: the simulator, the daemon and a webhook receiver, live; or every
scenario in virtual time (``--offline``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_triage.commands.argtypes import positive_float
from vllm_triage.core.counts import counted
from vllm_triage.errors import ConfigError

if TYPE_CHECKING:
    from vllm_triage.demo.live import LiveDemoResult

#: The exit code of a live demo that could not be judged (as `check`'s "cannot tell").
HOST_TOO_SLOW = 3
#: The live demo's log file, in its folder beside the recordings and the report.
LOG_NAME = "demo.log"
#: The events a summary of the log names, most frequent first.
LOG_EVENTS_SHOWN = 4


DESCRIPTION = """\
Start a simulated vLLM server playing the `tour` scenario (one H100, healthy, then each
cause in turn: prefill_bound, decode_bound, queue_bound, kv_pressure and stalled, a hung
engine) at --speed times real time, the daemon scraping it exactly as `run` does, and a
local webhook receiver; show the signals, the diagnosis and the transitions as they
happen, the URLs of the derived /metrics and the API, and the first alert the receiver
got. Takes about 55 s. With --offline: no sockets, every scenario in virtual time, in
seconds.

The demo checks itself: each phase of a scenario says what it is built to make the
diagnosis say, and the demo exits 1, saying what went differently, unless each fault's
first firing is its own cause, nothing else fires, and each incident resolves in the
healthy time after it. A scenario may bring its own SLOs (the tour judges ITL against
24 ms: see rules/scenarios/tour.yaml); --config and VLLM_TRIAGE_* variables still win.

The live demo runs the simulator, the daemon and the receiver in one process. On a host
too busy to keep up (scrapes skipped or late, the simulator behind its clock) it slows
the scenario's clock down, to an eighth of --speed at most, and says by how much; what
is judged stays in the scenario's seconds. If the scenario still does not come out as
built on a host that showed strain, the verdict is "could not judge: the host was too
slow" (exit 3), not a diagnosis error: --offline needs no pace at all. The daemon's log
lines go to demo.log in the demo's folder, never between the demo's own lines.

Exit codes: 0 as built; 1 not as built, or an alert was not delivered; 2 a usage or
settings error; 3 could not judge (the host was too slow for the live demo); 130
interrupted (Ctrl-C)."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from vllm_triage.demo.offline import DEFAULT_SCENARIOS

    p = sub.add_parser(
        "demo",
        help="watch the daemon diagnose a simulated vLLM server, live (no GPU needed)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenario",
        action="append",
        metavar="NAME|FILE",
        help=(
            "scenario(s) to run (repeatable): tour, "
            f"{', '.join(DEFAULT_SCENARIOS)}, or a scenario YAML file. Live: one target "
            "each (default: tour); --offline: run in turn (default: all but tour)"
        ),
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        default=None,
        metavar="S",
        help="simulated seconds (default: the scenario plus 60 s; --offline: 300 for a "
        "single-phase scenario)",
    )
    p.add_argument(
        "--speed",
        type=positive_float,
        default=20.0,
        metavar="X",
        help="live: simulated seconds per real second (default 20)",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:9468",
        metavar="HOST:PORT",
        help="live: where the daemon serves /metrics (default 127.0.0.1:9468; a free port "
        "if taken)",
    )
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="live: after the scenario, keep the simulator, the daemon and their URLs "
        "running until Ctrl-C",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="YAML settings (SLOs, thresholds); hardware comes from each scenario",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="diagnose recordings simulated in virtual time instead (no sockets, seconds)",
    )
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="--offline: text for people, json for one transition per line",
    )
    p.add_argument(
        "--record",
        metavar="DIR",
        help=(
            "live: the daemon records each scenario it scrapes into DIR/<scenario>/ and the "
            "report goes beside it (default: a new temporary folder, named at the end); "
            "--offline: also write each scenario's scrapes to DIR/<scenario>/ for `replay`"
        ),
    )
    p.set_defaults(func=run)


def _scenarios(args: argparse.Namespace) -> None:
    """Unknown scenario names are a usage error, said before anything starts."""
    from vllm_triage.simulator import get_scenario

    for name in args.scenario or ():
        try:
            get_scenario(name)
        except KeyError as exc:
            raise ConfigError(f"--scenario: {exc.args[0]}") from None


def run(args: argparse.Namespace) -> int:
    _scenarios(args)
    if args.offline:
        if args.keep_running:
            raise ConfigError("--keep-running is for the live demo (without --offline)")
        return _run_offline(args)
    if args.format != "text":
        raise ConfigError("--format needs --offline")
    from vllm_triage.demo.live import DEFAULT_LIVE, run_live_demo
    from vllm_triage.demo.tour_report import demo_folder

    names = tuple(dict.fromkeys(args.scenario or DEFAULT_LIVE))
    outcome: dict[str, int] = {}
    folder = demo_folder(Path(args.record) if args.record else None)
    log_file = folder / LOG_NAME
    with logging_to(log_file, args.log_level or "warning", args.log_format):
        run_live_demo(
            names,
            speed=args.speed,
            listen=args.listen,
            config=args.config,
            duration_s=args.duration,
            keep_running=args.keep_running,
            report=lambda result: outcome.update(code=_report(result)),
            record_dir=folder,
            log_file=log_file,
        )
    code = outcome.get("code", 1)
    if args.keep_running and code != 130:
        print("stopped.")
    return code


@contextlib.contextmanager
def logging_to(path: Path, level: str, log_format: str) -> Iterator[None]:
    """The log lines (JSON) into ``path`` while the live demo runs, so that none falls
    between the demo's own lines on a terminal or in a pipe; then back to stderr."""
    from vllm_triage.logs import configure

    with path.open("a", encoding="utf-8") as f:
        configure(level, json=True, stream=f)
        # The standard library's loggers (the scheduler's errors) go there too.
        handler = logging.StreamHandler(f)
        root = logging.getLogger()
        root.addHandler(handler)
        try:
            yield
        finally:
            root.removeHandler(handler)
            configure(level, json=None if log_format == "auto" else log_format == "json")


def log_summary(path: Path | None) -> str:
    """What the log file holds: its lines by event, most first; empty when nothing."""
    if path is None or not path.exists():
        return ""
    events: Counter[str] = Counter()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            events[str(json.loads(line).get("event", "?"))] += 1
        except (ValueError, AttributeError):
            events["(other)"] += 1
    if not events:
        return ""
    shown = ", ".join(f"{event} {n}" for event, n in events.most_common(LOG_EVENTS_SHOWN))
    more = ", ..." if len(events) > LOG_EVENTS_SHOWN else ""
    return f"{counted(events.total(), 'log line')} ({shown}{more}) in {path}"


def _report(result: LiveDemoResult) -> int:
    """The live demo's verdict, and the first alert as the receiver got it."""
    if result.interrupted:
        print("\ninterrupted: the demo did not finish, so it was not judged.")
        return 130
    print()
    good = True
    too_slow = result.host_too_slow
    for name, (ok, why) in result.verdicts().items():
        good &= ok
        fired = ", ".join(result.fired(name)) or "none"
        resolved = ", ".join(result.resolved(name)) or "none"
        if ok:
            print(f"{name}: as built: {why}")
        elif too_slow:
            print(f"{name}: could not judge: the host was too slow ({result.strain.said()})")
            print(f"  what went differently on it: {why}")
        else:
            print(f"{name}: NOT AS BUILT: {why}")
        print(f"  alerts fired: {fired}; resolved: {resolved}")
    paced = result.pacer.said() if result.pacer is not None else ""
    if paced:
        print(f"Pace: {paced}.")
    if too_slow:
        print(
            "This host was too busy for the live demo. `vllm-triage demo --offline` plays "
            "the same scenarios in virtual time (no sockets, seconds), judged by the same "
            "check; or run the live demo where fewer jobs compete for the cores."
        )
    print(
        f"{counted(result.delivered, 'notification')} delivered to the local receiver, "
        f"{result.failed} failed."
    )
    if result.first_payload is not None:
        print("\nThe first of them, as your receiver would get it (Alertmanager webhook, v4):")
        print(json.dumps(result.first_payload, indent=2))
    if result.report is not None:
        print(
            f"\nThe post-mortem report of {result.report.path.stem.removesuffix('-report')} "
            f"(open it in a browser; `vllm-triage report DIR` makes one from any recording):"
        )
        print(result.report.path)
    elif result.report_error:
        print(result.report_error)
    if result.recording is not None:
        print(kept_text(result.recording, result.recording_bytes, result.settings_file))
    logged = log_summary(result.log_file)
    if logged:
        print(f"The log: {logged}.")
    if too_slow:
        return HOST_TOO_SLOW
    return 0 if good and not result.failed else 1


def kept_text(folder: Path, size: int, settings: Path | None = None) -> str:
    """The folder the live demo leaves: named, sized, and how to be rid of it. Kept, not
    cleaned: it holds the report just printed, to open after the demo has gone."""
    again = "<scenario>" if settings is None else settings.name.removesuffix("-settings.yaml")
    config = f" --config {settings}" if settings is not None else ""
    return (
        f"\nRecording kept in {folder} ({size / 1e6:.1f} MB): the daemon's own scrapes, "
        f"its settings, its log and the report (`vllm-triage replay {folder}/{again}{config}` "
        "tells what the alerts told); delete it when done (rm -r it), or pass "
        "--record DIR to choose where it goes."
    )


def _run_offline(args: argparse.Namespace) -> int:
    from vllm_triage.core.report import transition_json, transition_text
    from vllm_triage.demo.offline import DEFAULT_SCENARIOS, run_demo

    names = tuple(args.scenario or DEFAULT_SCENARIOS)
    text = args.format == "text"
    if text:
        servers = (
            "1 simulated vLLM server" if len(names) == 1 else f"{len(names)} simulated vLLM servers"
        )
        length = f", {args.duration:g} simulated s each" if args.duration else ""
        print(
            f"vllm-triage demo: {servers}{length}, diagnosed from /metrics as a live run "
            "would be.\n"
        )
    good = 0
    record_dir = Path(args.record) if args.record else None
    for run in run_demo(args.config, names, duration_s=args.duration, record_dir=record_dir):
        good += not run.problems
        if not text:
            for t in run.transitions:
                print(transition_json(t, target=f"simulated/{run.name}"), flush=True)
            for problem in run.problems:
                print(f"vllm-triage demo: {run.name}: {problem}", file=sys.stderr)
            continue
        print(f"== {run.name}: {run.description}")
        for t in run.transitions:
            print("   " + transition_text(t).replace("\n", "\n   "))
        fired = ", ".join(run.fired) or "no incident"
        if run.problems:
            print(f"   -> NOT AS BUILT over {counted(run.scrapes, 'scrape')} (fired: {fired}):")
            print("\n".join(f"      - {p}" for p in run.problems) + "\n", flush=True)
        else:
            print(
                f"   -> as built over {counted(run.scrapes, 'scrape')} (fired: {fired})\n",
                flush=True,
            )
    if text:
        print(f"{good} of {counted(len(names), 'scenario')} diagnosed as built.")
        if record_dir is not None:
            print(
                f"Recordings in {record_dir}/<scenario>/: "
                f"try `vllm-triage replay {record_dir}/{names[-1]}`."
            )
    return 0 if good == len(names) else 1
