"""``vllm-triage render rules|dashboard``: the Prometheus rules and the Grafana dashboard
with the SLOs and thresholds of one configuration, so that Prometheus, Grafana and the
daemon judge by the same numbers. The bundled files are what the defaults render."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when run: `vllm-triage --help` need not load pydantic
    from vllm_triage.config.schema import Settings
    from vllm_triage.render.templates import Objectives

DESCRIPTION = """\
Write vllm-triage's Prometheus rules (recording rules and alerts: the diagnosis in
PromQL) or its Grafana dashboard with the SLOs and thresholds of the settings: rules/
defaults.yaml, then --config FILE, then VLLM_TRIAGE_* variables, as `run` reads them.
The rules judge by slo.* and thresholds.*; the dashboard draws each daemon's SLO from the
gauge vllm_triage_slo_seconds and the stall and roofline lines from the settings."""

EPILOG = """\
examples:
  vllm-triage render rules --config triage.yaml --output rules/vllm-triage.rules.yaml
  vllm-triage render rules --config triage.yaml --format prometheusrule | kubectl apply -f -
  vllm-triage render dashboard --config triage.yaml --output dashboards/vllm-triage.json

Without --config, the defaults: exactly rules/prometheus/vllm-triage.rules.yaml,
deploy/kubernetes/prometheusrule.yaml and deploy/grafana/dashboards/vllm-triage.json."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "render",
        help="write the Prometheus rules or the Grafana dashboard with your SLOs",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("what", choices=("rules", "dashboard"), help="which file to write")
    p.add_argument("--config", metavar="FILE", help="YAML settings file (default: the defaults)")
    p.add_argument(
        "--output", metavar="PATH", help="write here (replaced whole) instead of to stdout"
    )
    p.add_argument(
        "--format",
        choices=("rules", "prometheusrule"),
        default="rules",
        help="for rules: a Prometheus rules file (default) or the Prometheus Operator's "
        "PrometheusRule",
    )
    p.set_defaults(func=run)


def origin(config: str | None) -> str:
    """Where the numbers came from, for the generated file's first line: file names only
    (no directories, so the text does not depend on where it was rendered)."""
    from vllm_triage.config.load import service_links

    parts = ["rules/defaults.yaml"]
    if config is not None:
        parts.append(Path(config).name)
    links = service_links(os.environ)  # a Service's, not settings
    parts.extend(
        sorted(k for k in os.environ if k.upper().startswith("VLLM_TRIAGE_") and k not in links)
    )
    return ", ".join(parts)


def objectives_of(settings: Settings, where: str) -> Objectives:
    """What the rendered files judge by, from the settings (``where``: their origin)."""
    from vllm_triage.render.templates import Objectives

    slo, th = settings.slo, settings.thresholds
    return Objectives(
        ttft_p99_seconds=slo.ttft_p99_seconds,
        itl_p99_seconds=slo.itl_p99_seconds,
        waiting_requests=slo.waiting_requests,
        queue_share_of_ttft=th.queue_share_of_ttft,
        prefill_dominant_share=th.prefill_dominant_share,
        itl_spike_ratio=th.itl_spike_ratio,
        near_ceiling_ratio=th.near_ceiling_ratio,
        roofline_impossible_ratio=th.roofline_impossible_ratio,
        stall_after_seconds=th.stall_after_seconds,
        open_after=settings.incident.open_after,
        origin=where,
    )


def write(path: Path, text: str) -> None:
    """Replace ``path`` whole: a Prometheus or Grafana reloading meanwhile never reads a
    half-written file."""
    from vllm_triage.atomic import write_atomically

    write_atomically(path, text)


def run(args: argparse.Namespace) -> int:
    from vllm_triage.config.load import load_settings
    from vllm_triage.render.templates import dashboard, prometheusrule, rules

    if args.what == "dashboard" and args.format != "rules":
        print("vllm-triage render: error: --format is for `render rules`", file=sys.stderr)
        return 2
    settings = load_settings(args.config)  # a ConfigError is reported by the CLI: exit 2
    objectives = objectives_of(settings, origin(args.config))
    if args.what == "dashboard":
        text = dashboard(objectives)
    elif args.format == "prometheusrule":
        text = prometheusrule(objectives)
    else:
        text = rules(objectives)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        write(Path(args.output), text)
    except OSError as exc:
        # strerror, not the exception: it would name the temporary file, not the output.
        reason = exc.strerror or type(exc).__name__
        print(f"vllm-triage render: cannot write {args.output}: {reason}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}", file=sys.stderr)
    return 0
