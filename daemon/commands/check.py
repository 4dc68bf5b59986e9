"""``vllm-triage check URL``: a one-shot diagnosis of a live server.

Scrapes the server ``--scrapes`` times over ``--window`` seconds and diagnoses the
window with the same core as the daemon, without waiting for an incident to persist:
the verdict is this window's. Exit 0 healthy, 1 an SLO is breached (the cause is
printed), 2 cannot tell (the server did not answer, or too few requests finished in the
window to judge). Usage errors also exit 2, as everywhere in vllm-triage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

from daemon.commands.argtypes import positive_float, positive_int

Verdict = Literal["healthy", "incident", "cannot_tell"]
EXIT: dict[Verdict, int] = {"healthy": 0, "incident": 1, "cannot_tell": 2}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check",
        help="diagnose a live vLLM server once (exit 0 healthy, 1 incident, 2 cannot tell)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("url", help="the server's metrics URL, e.g. http://127.0.0.1:8000/metrics")
    p.add_argument(
        "--window",
        type=positive_float,
        default=15.0,
        metavar="S",
        help="seconds between the first and the last scrape (default 15)",
    )
    p.add_argument(
        "--scrapes",
        type=positive_int,
        default=4,
        metavar="N",
        help="scrapes over the window, at least 2 (default 4)",
    )
    p.add_argument(
        "--timeout", type=positive_float, default=5.0, metavar="S", help="per scrape (default 5)"
    )
    p.add_argument("--config", metavar="FILE", help="YAML settings (SLOs, hardware, model)")
    p.add_argument("--format", choices=("text", "json"), default="text")
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


def check(
    url: str,
    *,
    window: float,
    scrapes: int,
    timeout: float,
    config: str | None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    import httpx

    from daemon.assemble import build_rulebook
    from daemon.core.evaluate import Evaluation, Evaluator
    from daemon.core.parse import SnapshotParser
    from daemon.core.report import diagnosis_dict
    from daemon.errors import ParseError, ScrapeError
    from daemon.redact import safe_url
    from daemon.scrape import DEFAULT_MAX_BODY_BYTES, fetch
    from daemon.settings import load_settings

    settings = load_settings(config)
    # The window must hold every scrape of the check, whatever the settings say.
    evaluator = Evaluator(build_rulebook(settings), window_seconds=window * 2 + timeout)
    parser = SnapshotParser()
    errors: list[str] = []
    last: Evaluation | None = None
    ok = 0
    gap = window / max(scrapes - 1, 1)
    with httpx.Client(follow_redirects=False) as client:
        for i in range(max(scrapes, 2)):
            if i:
                sleep(gap)
            at = clock()
            try:
                body = fetch(client, url, timeout=timeout, max_body_bytes=DEFAULT_MAX_BODY_BYTES)
                evaluation = evaluator.step(parser.parse_bytes(body, at))
            except (ScrapeError, ParseError) as exc:
                errors.append(str(exc)[:500])
                continue
            ok += 1
            last = evaluation
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
                    "unjudged": unjudged,
                    "idle": not active and s.ttft_p99 is None and s.itl_p99 is None,
                }
            )
    shown = safe_url(url)  # without user:password or query values
    result: dict[str, Any] = {"url": shown, "scrapes_ok": ok, "errors": errors, "models": models}
    result["verdict"] = judge(result)
    return result


def _fmt(x: float | None, unit: str = "") -> str:
    return "n/a" if x is None else f"{x:.3g}{unit}"


def _text(result: dict[str, Any]) -> str:
    lines = [f"vllm-triage check {result['url']}: {result['verdict'].replace('_', ' ')}"]
    lines.extend(f"  scrape failed: {e}" for e in result["errors"][:3])
    if result["scrapes_ok"] < 2:
        lines.append("  fewer than two scrapes worked: nothing to compare")
    for m in result["models"]:
        name = m["model_name"] or "(no model_name)"
        if m["cause"]:
            lines.append(f"  {name}: {m['cause']} (confidence {m['confidence']:.2f})")
            lines.append(f"    {m['summary']}")
            lines.extend(f"    fix: {item}" for item in m["remediation"][:3])
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
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.scrapes < 2:
        print("vllm-triage check: --scrapes must be at least 2", file=sys.stderr)
        return 2
    result = check(
        args.url,
        window=args.window,
        scrapes=args.scrapes,
        timeout=args.timeout,
        config=args.config,
    )
    if args.format == "json":
        print(json.dumps(result, indent=2, allow_nan=False))
    else:
        print(_text(result))
    return EXIT[result["verdict"]]
