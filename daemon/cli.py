"""The ``vllm-triage`` command: a thin map from subcommands onto the core and the shell.

Exit codes: 0 it ran; 1 the input could not be used (a recording, a target); 2 the
command line or the settings are wrong. Errors are one clear line on stderr, never a
traceback, unless it is a bug of ours.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from daemon import __version__, ceiling_cmd, check_cmd, run_cmd, simulate_cmd
from daemon.argtypes import positive_float, positive_int
from daemon.errors import ConfigError, RecordingError
from daemon.logs import configure

EPILOG = """\
examples:
  vllm-triage demo                                  watch the daemon diagnose a simulated server
  vllm-triage run --config triage.yaml              the daemon (see `vllm-triage run --help`)
  vllm-triage check http://127.0.0.1:8000/metrics   diagnose a live server once
  vllm-triage simulate --scenario tour --port 8000  serve a simulated vLLM server's /metrics
  vllm-triage record http://127.0.0.1:8000/metrics --out rec/ --interval 5 --duration 600
  vllm-triage replay rec/ --config triage.yaml --format json
  vllm-triage ceiling --parameters-billion 8 --dtype bfloat16 --gpu H100
  vllm-triage check-config --config triage.yaml

Settings come from rules/defaults.yaml, then --config FILE, then VLLM_TRIAGE_* variables
(nested keys with __, e.g. VLLM_TRIAGE_SLO__TTFT_P99_SECONDS=1.5).
"""


def _add_record(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "record",
        help="save a target's /metrics, one file per scrape, for replay",
        description=(
            "Scrape URL every --interval seconds and write each raw body to "
            "DIR/<unix_time_ms>.prom. A failed scrape is logged and skipped; the "
            "recording goes on. Without --duration it runs until Ctrl-C."
        ),
    )
    p.add_argument("url", help="the vLLM server's metrics URL, e.g. http://127.0.0.1:8000/metrics")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write into (created)")
    p.add_argument(
        "--interval",
        type=positive_float,
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
        type=positive_float,
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
    p.set_defaults(func=_run_record)


def _add_replay(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="run the diagnosis over a recording and print every incident transition",
        description=(
            "Run the diagnosis core over a recording made by `record`, in file-name order, "
            "using the file names as scrape times, and print every incident transition "
            "(firing, resolved). Unreadable files are reported on stderr and skipped."
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
    p.set_defaults(func=_run_replay)


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from daemon.demo import DEFAULT_SCENARIOS

    p = sub.add_parser(
        "demo",
        help="watch the daemon diagnose a simulated vLLM server, live (no GPU needed)",
        description=(
            "Start a simulated vLLM server playing the `tour` scenario (healthy, then each "
            "cause in turn) at --speed times real time, the daemon scraping it exactly as "
            "`run` does, and a local webhook receiver; show a live view of the signals, the "
            "diagnosis and the transitions, and print the URL of the derived /metrics. Takes "
            "about 45 s. Exit 1 if a cause the scenario was built to show was not delivered "
            "as an alert. With --offline: no sockets, every scenario in virtual time, in "
            "seconds."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenario",
        action="append",
        choices=(*DEFAULT_SCENARIOS, "tour"),
        metavar="NAME",
        help=(
            "scenario(s) to run (repeatable; one of "
            f"{', '.join(DEFAULT_SCENARIOS)}, tour). Live: one target each (default tour "
            "and decode_bound); "
            "--offline: run in turn (default: all but tour)"
        ),
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        default=None,
        metavar="S",
        help="simulated seconds (live default: the scenario plus 60 s; --offline: 300 each)",
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
        help="--offline: also write each scenario's scrapes to DIR/<scenario>/ for `replay`",
    )
    p.set_defaults(func=_run_demo)


def _add_check_config(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check-config",
        help="validate settings and print the effective values",
        description=(
            "Load rules/defaults.yaml, --config FILE and VLLM_TRIAGE_* variables; "
            "print the result as JSON, or the errors."
        ),
    )
    p.add_argument("--config", metavar="FILE", help="YAML settings file")
    p.set_defaults(func=_run_check_config)


def _run_record(args: argparse.Namespace) -> int:
    from daemon.record import record

    stats = record(
        args.url,
        args.out,
        interval=args.interval,
        duration=args.duration,
        timeout=args.timeout,
        max_body_bytes=args.max_body_bytes,
    )
    return 0 if stats.written else 1


def _run_replay(args: argparse.Namespace) -> int:
    from daemon.evaluate import Evaluation
    from daemon.replay import replay
    from daemon.report import transition_json, transition_text
    from daemon.rulebook import build_evaluator
    from daemon.settings import load_settings

    evaluator = build_evaluator(load_settings(args.config))
    files = skipped = transitions = 0
    for item in replay(args.directory, evaluator):
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
            f"replayed {files} files ({skipped} skipped): {transitions} transitions",
            file=sys.stderr,
        )
    return 1 if args.strict and skipped else 0


def _run_demo(args: argparse.Namespace) -> int:
    if args.offline:
        return _run_offline_demo(args)
    if args.record or args.format != "text":
        raise ConfigError("--record and --format need --offline")
    from daemon.live_demo import DEFAULT_LIVE, run_live_demo

    names = tuple(dict.fromkeys(args.scenario or DEFAULT_LIVE))
    result = run_live_demo(
        names,
        speed=args.speed,
        listen=args.listen,
        config=args.config,
        duration_s=args.duration,
    )
    print()
    good = True
    for name, (ok, why) in result.verdicts().items():
        good &= ok
        resolved = ", ".join(result.resolved.get(name, [])) or "none"
        print(
            f"{name}: {'ok' if ok else 'NOT AS EXPECTED'}: {why}; alerts fired: "
            f"{', '.join(result.fired.get(name, [])) or 'none'}; resolved: {resolved}"
        )
    print(
        f"{result.delivered} notifications delivered to the local receiver, {result.failed} failed."
    )
    return 0 if good and not result.failed else 1


def _run_offline_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from daemon.demo import DEFAULT_SCENARIOS, EXPECTED, run_demo
    from daemon.report import transition_json, transition_text
    from daemon.settings import load_settings

    names = tuple(args.scenario or DEFAULT_SCENARIOS)
    text = args.format == "text"
    if text:
        print(
            f"vllm-triage demo: {len(names)} simulated vLLM servers, "
            f"{args.duration or 300.0:g} s each, "
            "diagnosed from their /metrics as a live run would be.\n"
        )
    good = 0
    record_dir = Path(args.record) if args.record else None
    for run in run_demo(
        load_settings(args.config), names, duration_s=args.duration or 300.0, record_dir=record_dir
    ):
        expected = EXPECTED.get(run.name)
        first = run.fired[0] if run.fired else None
        ok = run.name == "tour" or first == expected
        good += ok
        if not text:
            for t in run.transitions:
                print(transition_json(t, target=f"simulated/{run.name}"), flush=True)
            continue
        print(f"== {run.name}: {run.description}")
        for t in run.transitions:
            print("   " + transition_text(t).replace("\n", "\n   "))
        verdict = "no incident" if first is None else f"diagnosed {first}"
        wanted = "no incident" if expected is None else expected
        mark = "as expected" if ok else f"EXPECTED {wanted}"
        print(f"   -> {verdict} over {run.scrapes} scrapes: {mark}\n", flush=True)
    if text:
        print(f"{good}/{len(names)} scenarios diagnosed as expected.")
        if record_dir is not None:
            print(
                f"Recordings in {record_dir}/<scenario>/: "
                f"try `vllm-triage replay {record_dir}/{names[-1]}`."
            )
    return 0 if good == len(names) else 1


def _run_check_config(args: argparse.Namespace) -> int:
    from daemon.rulebook import build_rulebook
    from daemon.settings import load_settings

    settings = load_settings(args.config)
    # Building the rulebooks resolves each GPU name and reads each config.json too.
    rulebooks = [("default", build_rulebook(settings))] + [
        (f"target {t.name}", build_rulebook(settings.for_target(t))) for t in settings.targets
    ]
    print(settings.model_dump_json(indent=2))  # secrets print as **********
    for who, rulebook in rulebooks:
        c = rulebook.ceiling
        line = (
            "unknown (set hardware and model)"
            if c is None
            else (f"{c.tokens_per_second:.1f} tok/s per stream on {c.gpu}")
        )
        print(f"decode ceiling, {who}: {line}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-triage",
        description=(
            "Tells why a vLLM server is slow (prefill-bound, decode-bound, queue-bound or "
            "KV pressure) from its Prometheus /metrics, with the evidence and the fix."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"vllm-triage {__version__}")
    parser.add_argument(
        "--log-level",
        default=None,
        choices=("debug", "info", "warning", "error"),
        help="default: info (warning for demo, whose view is the output)",
    )
    parser.add_argument(
        "--log-format",
        default="auto",
        choices=("auto", "json", "console"),
        help="auto: JSON lines unless stderr is a terminal (default)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_demo(sub)
    run_cmd.add_parser(sub)
    check_cmd.add_parser(sub)
    simulate_cmd.add_parser(sub)
    _add_record(sub)
    _add_replay(sub)
    ceiling_cmd.add_parser(sub)
    _add_check_config(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    level = args.log_level or ("warning" if args.command == "demo" else "info")
    configure(level, json=None if args.log_format == "auto" else args.log_format == "json")
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"vllm-triage: configuration error: {exc}", file=sys.stderr)
        return 2
    except RecordingError as exc:
        print(f"vllm-triage: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
