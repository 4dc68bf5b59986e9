"""Argument types for the command line: a bad value is refused by argparse with the
flag's name and a reason, before anything starts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

N = TypeVar("N", int, float)


def _checked(
    text: str, convert: Callable[[str], N], what: str, ok: Callable[[N], bool], want: str
) -> N:
    """``text`` converted, or an argparse error saying what it is not or what it must be."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {want}, got {text}")
    return value


def positive_float(text: str) -> float:
    return _checked(text, float, "a number", lambda v: 0 < v < math.inf, "a positive number")


#: A duration on the command line is bounded as the settings' are (config/schema.py's
#: ``Duration``): from 50 ms (a scrape every 1 ms is a load test of the target, and
#: thousands of requests for nothing) to a week.
MIN_SECONDS = 0.05
MAX_SECONDS = 7 * 86400.0


def seconds(text: str) -> float:
    """A duration in seconds, from ``MIN_SECONDS`` to ``MAX_SECONDS``."""
    return _checked(
        text,
        float,
        "a number of seconds",
        lambda v: MIN_SECONDS <= v <= MAX_SECONDS,
        f"from {MIN_SECONDS:g} to {MAX_SECONDS:g} seconds",
    )


def seconds_at_most(limit: float) -> Callable[[str], float]:
    """``seconds``, and at most ``limit``."""

    def parse(text: str) -> float:
        value = seconds(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit:g} seconds, got {text}")
        return value

    return parse


def positive_int(text: str) -> int:
    return _checked(text, int, "a whole number", lambda v: v >= 1, "at least 1")


def fraction(text: str) -> float:
    """A share in (0, 1]."""
    return _checked(text, float, "a number", lambda v: 0 < v <= 1, "in (0, 1]")


def port_number(text: str) -> int:
    """A TCP port, 0 to 65535 (0: any free port, reported once listening)."""
    return _checked(text, int, "a port number", lambda v: 0 <= v <= 65535, "0 to 65535")


def unix_time(text: str) -> float:
    """Seconds since 1970-01-01 UTC, 0 or later."""
    return _checked(
        text, float, "a number", lambda v: 0 <= v < math.inf, "a unix time in seconds (>= 0)"
    )


def http_url(text: str) -> str:
    """An http:// or https:// URL with a host; a missing scheme gets a hint."""
    parts = urlsplit(text)
    if parts.scheme in ("http", "https") and parts.hostname:
        return text
    if "://" not in text:
        raise argparse.ArgumentTypeError(
            f"expected a URL such as http://127.0.0.1:8000/metrics, got {text!r}: "
            f"add the scheme (http://{text})"
        )
    raise argparse.ArgumentTypeError(
        f"expected an http:// or https:// URL such as http://127.0.0.1:8000/metrics, got {text!r}"
    )


#: What ``--runtime`` (or ``--engine``) says in every command's --help.
RUNTIME_HELP = (
    "the serving engine: vllm, sglang, lmdeploy or trtllm (default: detected from what "
    "its metrics show; named, another engine's metrics are an error, and a URL without a "
    "path gets the engine's metrics path; --engine is the same flag)"
)


def runtime_name(text: str) -> str:
    """A serving engine vllm-triage reads (rules/runtimes/)."""
    from vllm_triage.rules import runtime_table

    names = runtime_table().names
    if text not in names:
        raise argparse.ArgumentTypeError(
            f"not an engine vllm-triage reads: {text!r} ({', '.join(names)})"
        )
    return text


def add_runtime(p: argparse.ArgumentParser, help_text: str = RUNTIME_HELP) -> None:
    """``--runtime NAME`` (or ``--engine NAME``: the issue's and many users' word)."""
    p.add_argument(
        "--runtime", "--engine", dest="runtime", type=runtime_name, metavar="NAME", help=help_text
    )


def metrics_url(url: str, runtime: str | None) -> str:
    """``url``, with the named engine's metrics path when it has none."""
    if runtime is None:
        return url
    from vllm_triage.config.schema import with_metrics_path
    from vllm_triage.rules import runtime_table

    return with_metrics_path(url, runtime_table().spec(runtime).metrics_path)
