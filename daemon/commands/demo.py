"""``vllm-triage demo``: the simulator, the daemon and a webhook receiver, live; or every
scenario in virtual time (``--offline``)."""

from __future__ import annotations

import argparse

from daemon.commands.argtypes import positive_float
from daemon.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from daemon.demo.offline import DEFAULT_SCENARIOS

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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.offline:
        return _run_offline(args)
    if args.record or args.format != "text":
        raise ConfigError("--record and --format need --offline")
    from daemon.demo.live import DEFAULT_LIVE, run_live_demo

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
    if result.report is not None:
        print(
            f"The post-mortem report of {result.report.path.stem.removesuffix('-report')} "
            f"(open it in a browser; `vllm-triage report DIR` makes one from any recording):"
        )
        print(result.report.path)
    else:
        print(result.report_error)
    return 0 if good and not result.failed else 1


def _run_offline(args: argparse.Namespace) -> int:
    from pathlib import Path

    from daemon.core.report import transition_json, transition_text
    from daemon.demo.offline import DEFAULT_SCENARIOS, EXPECTED, run_demo
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
