"""``vllm-triage run``: the daemon's command line. Flags beat VLLM_TRIAGE_* beat --config."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vllm_triage.commands.argtypes import add_runtime, seconds
from vllm_triage.errors import ConfigError

DESCRIPTION = """\
Watch one or more vLLM servers: scrape each /metrics every interval, diagnose why
latency is bad (prefill-bound, decode-bound, queue-bound, KV pressure, or a stalled
engine: hung, asleep, or with stale gauges), serve the derived metrics for Prometheus and
Grafana, and send alert webhooks with the diagnosis.

Settings come from rules/defaults.yaml, then --config FILE, then VLLM_TRIAGE_* variables
(nested keys with __, lists as JSON), then these flags. The keys beside the SLOs and
thresholds: listen, interval_seconds, scrape_timeout_seconds, max_body_bytes,
shutdown_grace_seconds, state_dir, targets, receivers, alerting, record. See
docs/operations.md, "Run it".

Open incidents, what each receiver was told and undelivered notifications are kept in
state_dir (default $XDG_STATE_HOME/vllm-triage), so a restart or a crash loses no alert.

Endpoints: / (the status page), /metrics, /healthz, /readyz, /api/v1/diagnoses,
/api/v1/series. With no receiver it says so at start: incidents are then shown, not sent.
SIGTERM or Ctrl-C stops it,
delivering pending notifications first (for at most shutdown_grace_seconds).
"""

EXAMPLE = """\
example:
  vllm-triage run --target local=http://127.0.0.1:8000/metrics \\
      --webhook http://127.0.0.1:9000/hook --listen 127.0.0.1:9468
"""


def target_arg(text: str) -> dict[str, str]:
    """``NAME=URL`` or a bare URL (named after its host and port, as a config target
    without a name is: ``settings.target_name``)."""
    from vllm_triage.config.schema import target_name

    name, sep, url = text.partition("=")
    if not sep or "://" in name:
        name, url = "", text
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected [NAME=]http://host:port/metrics, got {text!r}")
    return {"name": name or target_name(url), "url": url}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="the daemon: scrape targets, diagnose, export metrics, send alerts",
        description=DESCRIPTION,
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="YAML settings file")
    p.add_argument(
        "--config-optional",
        action="store_true",
        help="a --config FILE that does not exist is not an error: run on the defaults, the "
        "variables and these flags, and say so loudly at start (the Kubernetes sidecar: a "
        "missing ConfigMap must not stop it, nor the vLLM pod it sits in)",
    )
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where open incidents and undelivered notifications survive a restart "
        "(state_dir; default $XDG_STATE_HOME/vllm-triage)",
    )
    p.add_argument(
        "--listen", metavar="HOST:PORT", help="where to serve /metrics and the API (0.0.0.0:9468)"
    )
    p.add_argument("--interval", type=seconds, metavar="S", help="seconds between scrapes (5)")
    p.add_argument(
        "--target",
        action="append",
        type=target_arg,
        metavar="[NAME=]URL",
        help="a vLLM /metrics URL to watch (repeatable; replaces the file's targets)",
    )
    add_runtime(
        p,
        "the serving engine of every --target: vllm, sglang, lmdeploy or trtllm (default: "
        "detected from each scrape; a target in the --config file names its own with "
        "runtime:; --engine is the same flag)",
    )
    p.add_argument(
        "--webhook",
        action="append",
        metavar="URL",
        help="an Alertmanager-format webhook receiver (repeatable; replaces the file's receivers)",
    )
    p.add_argument(
        "--record",
        metavar="DIR",
        help=(
            "also keep every scrape the daemon takes, as DIR/<target>/<unix_time_ms>.prom "
            "(the format `record` writes): `report DIR/<target>` then tells exactly what "
            "the alerts said (record.max_bytes, 1 GiB per target by default, bounds it)"
        ),
    )
    p.set_defaults(func=run)


def flags(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.listen is not None:
        out["listen"] = args.listen
    if args.interval is not None:
        out["interval_seconds"] = args.interval
    if args.target:
        out["targets"] = [
            {**t, "runtime": args.runtime} if args.runtime else t for t in args.target
        ]
    elif args.runtime:
        raise ConfigError("--runtime names the engine of the --target URLs: give --target too")
    if args.record is not None:
        out["record"] = {"dir": args.record}
    if args.state_dir is not None:
        out["state_dir"] = args.state_dir
    if args.webhook:
        out["receivers"] = [
            # Unnamed: known by type and URL, so reordering the flags moves nothing.
            {"type": "alertmanager_webhook", "url": url}
            for url in args.webhook
        ]
    return out


def run(args: argparse.Namespace) -> int:
    from vllm_triage.assemble import build_daemon
    from vllm_triage.config.load import load_settings
    from vllm_triage.store import default_state_dir

    config = args.config
    if config is not None and args.config_optional and not Path(config).exists():
        import structlog

        structlog.get_logger("vllm_triage.run").error(
            "config_missing",
            config=config,
            consequence="running on the defaults, VLLM_TRIAGE_* variables and flags: no "
            "receivers, hardware or model settings but what those give",
            hint="create it; it is read at start (in Kubernetes: apply the sidecar's "
            "ConfigMap, then restart the sidecar alone: kubectl exec POD -c vllm-triage "
            "-- sh -c 'kill 1')",
        )
        config = None
    settings = load_settings(config, flags(args))
    if not settings.targets and settings.source == "scrape":
        raise ConfigError(
            "no targets: give --target URL, or `targets:` in the --config file "
            "(e.g. targets: [{name: vllm, url: http://127.0.0.1:8000/metrics}]), or "
            "`source: prometheus` with a `prometheus: {url: ...}` section (fleet mode)"
        )
    try:
        daemon = build_daemon(settings, default_state_dir=default_state_dir())
    except OSError as exc:
        raise ConfigError(f"listen: cannot listen on {settings.listen}: {exc}") from None
    asyncio.run(daemon.run(handle_signals=True))
    return 0
