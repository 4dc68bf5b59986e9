"""The ``vllm-triage`` command: builds the parser from ``vllm_triage.commands`` and dispatches.

Exit codes: 0 it ran; 1 the input could not be used (a recording, a target); 2 the
command line or the settings are wrong; 130 interrupted (Ctrl-C); ``check`` adds 1 for an
incident and 3 for "cannot tell". Errors are one clear line on stderr, never a
traceback, unless it is a bug of ours. Output piped into ``head`` or ``jq`` that stops
reading early ends the command quietly, exit 0.

The global flags (``--log-level``, ``--log-format``, ``--version``) are accepted before or
after the subcommand and listed in each subcommand's ``--help``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from vllm_triage import __version__
from vllm_triage.buildinfo import version_line
from vllm_triage.commands import (
    ceiling,
    check,
    check_config,
    demo,
    record,
    render,
    replay,
    report,
    run,
    simulate,
    whatif,
)
from vllm_triage.errors import ConfigError, RecordingError
from vllm_triage.logs import configure

EPILOG = """\
examples:
  vllm-triage demo                                  watch the daemon diagnose a simulated server
  vllm-triage run --config triage.yaml              the daemon (see `vllm-triage run --help`)
  vllm-triage check http://127.0.0.1:8000/metrics   diagnose a live server once
  vllm-triage simulate --scenario tour --port 8000  serve a simulated vLLM server's /metrics
  vllm-triage record http://127.0.0.1:8000/metrics --out rec/ --interval 5 --duration 600
  vllm-triage replay rec/ --config triage.yaml --format json
  vllm-triage report rec/ --config triage.yaml --out report.html
  vllm-triage whatif rec/ --config triage.yaml --change kv_cache_dtype=fp8
  vllm-triage ceiling --parameters-billion 8 --dtype bfloat16 --gpu H100
  vllm-triage check-config --config triage.yaml
  vllm-triage render rules --config triage.yaml      the Prometheus rules with your SLOs

Settings come from rules/defaults.yaml, then --config FILE, then VLLM_TRIAGE_* variables
(nested keys with __, e.g. VLLM_TRIAGE_SLO__TTFT_P99_SECONDS=1.5).
"""


class _Version(argparse.Action):
    """``--version``: the version and the commit, looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="print the version and the commit it was built from, and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kw: object) -> None:
        print(version_line(__version__))
        parser.exit()


def add_global_flags(parser: argparse.ArgumentParser, *, on_subcommand: bool) -> None:
    """The flags every command takes. On a subcommand their defaults are SUPPRESS, so a
    flag given before the subcommand is not reset by the subcommand's own copy."""
    group = parser.add_argument_group("global options (before or after the command)")
    group.add_argument("-V", "--version", action=_Version)
    group.add_argument(
        "--log-level",
        default=argparse.SUPPRESS if on_subcommand else None,
        choices=("debug", "info", "warning", "error"),
        help="default: info (warning for demo, whose view is the output)",
    )
    group.add_argument(
        "--log-format",
        default=argparse.SUPPRESS if on_subcommand else "auto",
        choices=("auto", "json", "console"),
        help="auto: JSON lines unless stderr is a terminal (default)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-triage",
        description=(
            "Tells why a vLLM server is slow (prefill-bound, decode-bound, queue-bound, KV "
            "pressure, or stalled: a hung engine) from its Prometheus /metrics, with the "
            "evidence and the fix."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_global_flags(parser, on_subcommand=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (
        demo,
        run,
        check,
        simulate,
        record,
        replay,
        report,
        whatif,
        ceiling,
        check_config,
        render,
    ):
        command.add_parser(sub)
    for subparser in sub.choices.values():
        add_global_flags(subparser, on_subcommand=True)
    return parser


def _quiet_stdout() -> None:
    """The reader of our stdout went away (``| head``): point stdout at /dev/null, so that
    Python's own flush at exit does not fail a second time (the standard recipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


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
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
    except BrokenPipeError:
        _quiet_stdout()
        return 0
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
