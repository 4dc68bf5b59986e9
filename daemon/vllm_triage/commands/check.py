"""``vllm-triage check URL``: a one-shot diagnosis of a live server.

Scrapes the server ``--scrapes`` times over ``--window`` seconds and diagnoses the
window with the same core as the daemon, without waiting for an incident to persist:
the verdict is this window's. A server whose engine showed no progress at all while
requests were outstanding is watched on, at the same pace, until that has lasted
``stall_after_seconds`` (then it is stalled: a hung engine) or the engine moves.

Exit codes follow the monitoring-plugin convention (Nagios, Icinga, Sensu):
  0  healthy: every SLO met (or the server was idle)
  1  incident: an SLO is breached, or the engine is stalled; the cause, its evidence
     and the fixes are printed
  2  usage or settings error (a URL without http://, an unreadable --config)
  3  cannot tell: the server did not answer with vLLM metrics, or too few requests
     finished in the window to judge

A first scrape that is refused, answered with an error status or with a page that is not
vLLM's metrics ends the check at once (the window would not change that); the reason is
printed once, with a hint for the likeliest mistakes. On a terminal, a progress line on
stderr shows each scrape as it happens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TextIO

from vllm_triage.commands.argtypes import (
    MIN_SECONDS,
    add_runtime,
    http_url,
    metrics_url,
    positive_int,
    seconds,
)
from vllm_triage.core.counts import counted
from vllm_triage.errors import TriageError

if TYPE_CHECKING:
    from vllm_triage.core.evaluate import Evaluation

Verdict = Literal["healthy", "incident", "cannot_tell"]
EXIT: dict[Verdict, int] = {"healthy": 0, "incident": 1, "cannot_tell": 3}
#: Fixes shown in the text output; the rest are in --format json.
FIXES_SHOWN = 3
#: The most scrapes one check takes (a longer look is ``record``'s, or the daemon's).
MAX_SCRAPES = 1000
#: A first scrape failing for one of these reasons ends the check: waiting will not help.
FATAL_FIRST = frozenset({"connect", "http_status", "parse", "too_costly", "evaluate", "too_large"})


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _, _, rest = (__doc__ or "").partition("\n\n")
    p = sub.add_parser(
        "check",
        help="diagnose a live vLLM server once (exit 0 healthy, 1 incident, 3 cannot tell)",
        description=rest,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "url",
        type=http_url,
        help="the server's metrics URL, e.g. http://127.0.0.1:8000/metrics",
    )
    p.add_argument(
        "--window",
        type=seconds,
        default=15.0,
        metavar="S",
        help="seconds between the first and the last scrape (default 15)",
    )
    p.add_argument(
        "--scrapes",
        type=positive_int,
        default=4,
        metavar="N",
        help=f"scrapes over the window, 2 to {MAX_SCRAPES:,} (default 4)",
    )
    p.add_argument(
        "--timeout", type=seconds, default=5.0, metavar="S", help="per scrape (default 5)"
    )
    p.add_argument("--config", metavar="FILE", help="YAML settings (SLOs, hardware, model)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    add_runtime(p)
    p.set_defaults(func=run)


def judge(result: dict[str, Any]) -> Verdict:
    """The verdict of a finished check (``models`` from ``check``)."""
    models = result["models"]
    if result["scrapes_ok"] < 2 or not models:
        return "cannot_tell"
    if any(m["cause"] for m in models):
        return "incident"
    if any(m["unjudged"] for m in models):
        return "cannot_tell"
    return "healthy"


Progress = Callable[[int, int, str], None]


def frozen(evaluation: Evaluation) -> bool:
    """Some model's engine shows no progress with work outstanding, not yet a stall."""
    return any(
        d.cause != "stalled"
        and (p := evaluation.signals[name].progress) is not None
        and p.seconds_without_progress > 0
        for name, d in evaluation.diagnoses.items()
    )


def check(
    url: str,
    *,
    window: float,
    scrapes: int,
    timeout: float,
    config: str | None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    progress: Progress | None = None,
    runtime: str | None = None,
) -> dict[str, Any]:
    """Scrape and diagnose; ``progress(done, of, outcome)`` is told after each scrape.
    ``runtime``: the serving engine the server must be (default: detected)."""
    from vllm_triage.assemble import build_rulebook, model_rulebooks
    from vllm_triage.config.load import load_settings
    from vllm_triage.core.drive import Driver, Unusable
    from vllm_triage.core.evaluate import Evaluator
    from vllm_triage.core.report import diagnosis_dict
    from vllm_triage.errors import ScrapeError
    from vllm_triage.net.fetch import DEFAULT_MAX_BODY_BYTES, BlockingFetcher, not_metrics_hint
    from vllm_triage.net.redact import safe_url
    from vllm_triage.rules import runtime_table

    settings = load_settings(config)
    # The window must hold every scrape of the check, whatever the settings say. The
    # verdict is this window's own, so a stall breaches at stall_after_seconds itself.
    rules = build_rulebook(settings)
    evaluator = Evaluator(
        rules,
        rulebook_for=model_rulebooks(settings, rules),
        window_seconds=window * 2 + timeout,
        open_after=1,
    )
    driver = Driver(evaluator, runtime_table(), named=runtime)
    errors: Counter[str] = Counter()
    last: Evaluation | None = None
    ok = 0
    total = max(scrapes, 2)
    gap = window / (total - 1)
    stopped_early = False

    def one(client: BlockingFetcher) -> str:
        """One scrape and evaluation; the failure reason, or "" when it worked."""
        nonlocal ok, last
        at = clock()
        try:
            body = client.fetch(url, timeout=timeout, max_body_bytes=DEFAULT_MAX_BODY_BYTES)
        except ScrapeError as exc:
            errors[str(exc)[:500]] += 1
            return exc.reason
        fed = driver.feed(body, at)
        if isinstance(fed, Unusable):
            errors[not_metrics_hint(url, fed.error)[:500]] += 1
            return fed.reason
        ok += 1
        last = fed.evaluation
        return ""

    with BlockingFetcher() as client:
        for i in range(total):
            if i:
                sleep(gap)
            reason = one(client)
            if progress is not None:
                progress(i + 1, total, "ok" if not reason else f"failed ({reason})")
            if i == 0 and reason in FATAL_FIRST:
                stopped_early = True
                break
        # A frozen engine is watched on until it moves or has been stalled long enough.
        until = clock() + settings.thresholds.stall_after_seconds + gap
        while not stopped_early and last is not None and frozen(last) and clock() < until:
            sleep(gap)
            one(client)
    models = []
    if last is not None and ok >= 2:
        for name, d in sorted(last.diagnoses.items()):
            s = last.signals[name]
            active = (s.running_max or 0) > 0 or (s.waiting_max or 0) > 0
            unjudged = d.cause is None and active and s.ttft_p99 is None and s.itl_p99 is None
            models.append(
                {
                    "model_name": name,
                    "cause": d.cause,
                    **diagnosis_dict(d),
                    "ttft_p99_seconds": s.ttft_p99.value if s.ttft_p99 else None,
                    "itl_p99_seconds": s.itl_p99.value if s.itl_p99 else None,
                    "requests_waiting_mean": s.waiting_mean,
                    "seconds_without_progress": (
                        s.progress.seconds_without_progress if s.progress else None
                    ),
                    "unjudged": unjudged,
                    "idle": not active and s.ttft_p99 is None and s.itl_p99 is None,
                }
            )
    engines = sorted({s.runtime.shown for s in last.signals.values()}) if last is not None else []
    result: dict[str, Any] = {
        "url": safe_url(url),  # without user:password or query values
        # The serving engine its metrics showed (vLLM, SGLang, vLLM (Rust frontend), ...).
        "runtime": ", ".join(engines) or None,
        "scrapes_ok": ok,
        "scrapes_tried": sum(errors.values()) + ok,
        "stopped_early": stopped_early,
        # Each distinct error once, with how often it happened.
        "errors": [{"error": e, "times": n} for e, n in errors.items()],
        "models": models,
    }
    result["verdict"] = judge(result)
    return result


def _fmt(x: float | None, unit: str = "") -> str:
    return "n/a" if x is None else f"{x:.3g}{unit}"


def _text(result: dict[str, Any]) -> str:
    engine = f" ({result['runtime']})" if result.get("runtime") else ""
    lines = [f"vllm-triage check {result['url']}{engine}: {result['verdict'].replace('_', ' ')}"]
    for e in result["errors"]:
        times = f" ({e['times']} of {result['scrapes_tried']} scrapes)" if e["times"] > 1 else ""
        lines.append(f"  scrape failed{times}: {e['error']}")
    if result["stopped_early"]:
        lines.append("  stopped after the first scrape: waiting out the window would not help")
    elif result["scrapes_ok"] < 2:
        lines.append("  fewer than two scrapes worked: nothing to compare")
    for m in result["models"]:
        name = m["model_name"] or "(no model_name)"
        if m["cause"]:
            lines.append(f"  {name}: {m['cause']} (confidence {m['confidence']:.2f})")
            lines.append(f"    {m['summary']}")
            fixes = m["remediation"]
            lines.extend(f"    fix: {item}" for item in fixes[:FIXES_SHOWN])
            if len(fixes) > FIXES_SHOWN:
                more = len(fixes) - FIXES_SHOWN
                lines.append(f"    ({more} more fix{'es' if more > 1 else ''}: --format json)")
        elif m["unjudged"]:
            lines.append(
                f"  {name}: busy, but too few requests finished in the window to judge; "
                "try a longer --window"
            )
        elif m["idle"]:
            lines.append(f"  {name}: idle (no requests in the window); nothing is slow")
        else:
            lines.append(
                f"  {name}: healthy: TTFT p99 {_fmt(m['ttft_p99_seconds'], ' s')}, "
                f"ITL p99 {_fmt(m['itl_p99_seconds'], ' s')}, "
                f"waiting {_fmt(m['requests_waiting_mean'])}"
            )
        lines.extend(_facts(m.get("evidence", {})))
    # A peer's names on one line each, shown and never obeyed (core.shown).
    from vllm_triage.core.shown import one_line

    return "\n".join(one_line(line) for line in lines)


def _facts(evidence: dict[str, Any]) -> list[str]:
    """What the roofline assumed, and where each fact came from (docs/physics.md,
    "Where each fact comes from"), so a verdict can be checked against the server."""
    out: list[str] = []
    if "model_source" in evidence:
        out.append(f"    model: {evidence['model_source']}")
    if "decode_facts_source" in evidence:
        out.append(f"    facts: {evidence['decode_facts_source']}")
    return out


def terminal_progress(stream: TextIO, *, window: float) -> Progress:
    """A line on a terminal that shows each scrape as it happens, rewritten in place and
    cleared when the check is done (so the verdict stands alone)."""
    started = time.monotonic()

    def show(done: int, total: int, outcome: str) -> None:
        elapsed = time.monotonic() - started
        line = f"check: scrape {done} of {total} {outcome}, {elapsed:.0f} of {window:g} s"
        end = "\r\x1b[K" if done == total else ""
        stream.write(f"\r\x1b[K{line}{end}")
        stream.flush()

    return show


def run(args: argparse.Namespace) -> int:
    if not 2 <= args.scrapes <= MAX_SCRAPES:
        print(
            f"vllm-triage check: error: --scrapes must be from 2 to {MAX_SCRAPES:,}",
            file=sys.stderr,
        )
        return 2
    if args.window / (args.scrapes - 1) < MIN_SECONDS:
        # A scrape every millisecond is a load test of the server, not a check of it.
        print(
            f"vllm-triage check: error: {counted(args.scrapes, 'scrape')} over "
            f"{args.window:g} s are "
            f"{args.window / (args.scrapes - 1):.3g} s apart; at least {MIN_SECONDS:g} s: "
            "fewer --scrapes or a longer --window",
            file=sys.stderr,
        )
        return 2
    progress = terminal_progress(sys.stderr, window=args.window) if sys.stderr.isatty() else None
    try:
        result = check(
            metrics_url(args.url, args.runtime),
            runtime=args.runtime,
            window=args.window,
            scrapes=args.scrapes,
            timeout=args.timeout,
            config=args.config,
            progress=progress,
        )
    except TriageError:
        raise  # a settings error: exit 2, said by the command line
    except Exception as exc:
        # Whatever the server's answer set off: "cannot tell" (3), never a traceback's
        # exit 1, which a monitoring plugin reads as an incident.
        from vllm_triage.errors import UnjudgeableError

        print(f"vllm-triage check: cannot tell: {UnjudgeableError.of(exc)}", file=sys.stderr)
        return EXIT["cannot_tell"]
    finally:
        if progress is not None:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
    if args.format == "json":
        print(json.dumps(result, indent=2, allow_nan=False))
    else:
        print(_text(result))
    return EXIT[result["verdict"]]
