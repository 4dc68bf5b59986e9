"""``vllm-triage render rules|dashboard|sidecar|relabel``: the Prometheus rules and the
Grafana dashboard with the SLOs and thresholds of one configuration, so that Prometheus,
Grafana and the daemon judge by the same numbers (the bundled files are what the
defaults render); the Kubernetes sidecar for a vLLM Deployment named once; and fleet
mode's shard rule for the scrape configuration."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_triage.commands.argtypes import add_runtime

if TYPE_CHECKING:  # imported when run: `vllm-triage --help` need not load pydantic
    from vllm_triage.config.schema import Settings
    from vllm_triage.render.relabel import ShardRule
    from vllm_triage.render.templates import EngineDialect, Objectives

DESCRIPTION = """\
Write vllm-triage's Prometheus rules (recording rules and alerts: the diagnosis in
PromQL) or its Grafana dashboard with the SLOs and thresholds of the settings: rules/
defaults.yaml, then --config FILE, then VLLM_TRIAGE_* variables, as `run` reads them.
The rules judge by slo.* and thresholds.*; the dashboard draws each daemon's SLO from the
gauge vllm_triage_slo_seconds and the stall and roofline lines from the settings.
--engine NAME writes them for another serving engine's metrics (SGLang, LMDeploy,
TensorRT-LLM), from its spec in rules/runtimes/: the same records and alerts over its own
series, and the dashboard's raw panels on them.

`render sidecar --deployment NAME --output DIR` writes the Kubernetes sidecar for the
vLLM Deployment NAME: configmap.yaml (the settings, in the Deployment's namespace;
--config FILE puts yours there, checked first), sidecar-patch.yaml (for `kubectl
patch deployment NAME`: the patch names no Deployment, so it can rename none),
sidecar-remove.yaml (takes out exactly what the patch added) and kustomization.yaml (a
kustomize Component, whose build fails when there is no Deployment NAME or it has no
--container). Several names: one folder each, DIR/NAME/.

`relabel` writes the metric_relabel_configs that give every vLLM and DCGM series its
shard bucket (prometheus.shard), so that each fleet-mode replica asks only for its own."""

EPILOG = """\
examples:
  vllm-triage render rules --config triage.yaml --output rules/vllm-triage.rules.yaml
  vllm-triage render rules --config triage.yaml --format prometheusrule | kubectl apply -f -
  vllm-triage render dashboard --config triage.yaml --output dashboards/vllm-triage.json
  vllm-triage render sidecar --deployment vllm-llama3-deployment-vllm --namespace llm \
      --config triage.yaml --output k8s/vllm-triage
  vllm-triage render relabel --config triage.yaml   # then paste into the scrape jobs
  vllm-triage render rules --engine sglang --output rules/sglang-triage.rules.yaml

Without --config, the defaults: exactly rules/prometheus/vllm-triage.rules.yaml,
deploy/kubernetes/prometheusrule.yaml and deploy/grafana/dashboards/vllm-triage.json;
with --engine sglang (lmdeploy, trtllm), rules/prometheus/sglang-triage.rules.yaml;
deploy/kubernetes/ holds `render sidecar --deployment vllm`."""


def dialect_of(runtime: str | None) -> EngineDialect | None:
    """The named engine's names for the rules and panels (None: vLLM's, the bundled)."""
    if runtime is None or runtime == "vllm":
        return None
    from vllm_triage.render.engines import engine_dialect
    from vllm_triage.rules import runtime_documents, runtime_table

    doc = next(d for _, d in runtime_documents() if d.get("name") == runtime)
    return engine_dialect(runtime_table().spec(runtime), doc)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "render",
        help="write the Prometheus rules or the Grafana dashboard with your SLOs",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "what", choices=("rules", "dashboard", "sidecar", "relabel"), help="which file(s) to write"
    )
    p.add_argument("--config", metavar="FILE", help="YAML settings file (default: the defaults)")
    p.add_argument(
        "--output",
        metavar="PATH",
        help="write here (replaced whole) instead of to stdout; for sidecar, a folder (required)",
    )
    p.add_argument(
        "--format",
        choices=("rules", "prometheusrule"),
        default="rules",
        help="for rules: a Prometheus rules file (default) or the Prometheus Operator's "
        "PrometheusRule",
    )
    k8s = p.add_argument_group("sidecar (the Kubernetes sidecar of a vLLM Deployment)")
    k8s.add_argument(
        "--deployment",
        metavar="NAME",
        action="extend",
        nargs="+",
        help="the vLLM Deployment's name, as `kubectl get deployments` shows it (several: "
        "one folder each)",
    )
    k8s.add_argument(
        "--namespace",
        metavar="NS",
        help="its namespace, as its manifest names it (default: none named; the "
        "ConfigMap then goes where you apply it)",
    )
    k8s.add_argument(
        "--container",
        metavar="NAME",
        default="vllm",
        help="the vLLM container's name in the pod (default: vllm)",
    )
    k8s.add_argument(
        "--port",
        metavar="PORT",
        type=int,
        default=8000,
        help="vLLM's --port, where the sidecar reads /metrics (default: 8000)",
    )
    k8s.add_argument(
        "--image",
        metavar="REF",
        help="the sidecar's image (default: the release's, at this version)",
    )
    add_runtime(
        p,
        "the serving engine whose metrics the rules and raw panels read: vllm (default), "
        "sglang, lmdeploy or trtllm (--runtime is the same flag)",
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


def shard_rule(settings: Settings, where: str) -> ShardRule:
    """The shard relabel rule of the settings' ``prometheus`` section (its shard label and
    buckets, the DCGM join's two sides), or of the defaults when there is none."""
    from vllm_triage.config.schema import DcgmSettings, ShardSettings
    from vllm_triage.render.relabel import DEFAULT_BUCKETS, ShardRule

    prom = settings.prometheus
    shard = prom.shard if prom is not None else ShardSettings()
    dcgm = prom.dcgm if prom is not None else DcgmSettings()
    vllm_side, dcgm_side = tuple(dcgm.join), tuple(dcgm.join.values())
    if prom is not None and not dcgm.enabled:
        vllm_side = dcgm_side = tuple(prom.identity_labels)
    return ShardRule(
        label=shard.label,
        buckets=shard.buckets or DEFAULT_BUCKETS,
        vllm_labels=vllm_side,
        dcgm_labels=dcgm_side,
        origin=where,
    )


def write(path: Path, text: str) -> None:
    """Replace ``path`` whole: a Prometheus or Grafana reloading meanwhile never reads a
    half-written file."""
    from vllm_triage.atomic import write_atomically

    write_atomically(path, text)


def _error(message: str) -> int:
    print(f"vllm-triage render: error: {message}", file=sys.stderr)
    return 2


#: What the sidecar's arguments set, so a settings file for it must not.
SIDECAR_ARGS = {"targets": "--port", "listen": "the sidecar's port", "state_dir": "its volume"}


def sidecar_settings(config: str, deployment: str, port: int) -> str:
    """The text of ``config``, checked as the sidecar will read it (its arguments over
    it); ConfigError saying what is wrong."""
    from vllm_triage.config.load import load_settings
    from vllm_triage.errors import ConfigError
    from vllm_triage.rules import read_file

    data = read_file(config)
    clash = sorted(k for k in SIDECAR_ARGS if isinstance(data, dict) and k in data)
    if clash:
        raise ConfigError(
            f"{config}: {', '.join(clash)}: set by the sidecar's arguments "
            f"({', '.join(SIDECAR_ARGS[k] for k in clash)}); remove from the file"
        )
    target = {"name": deployment, "url": f"http://127.0.0.1:{port}/metrics"}
    load_settings(config, {"targets": [target]})
    return Path(config).read_text(encoding="utf-8")


def run_sidecar(args: argparse.Namespace) -> int:
    from vllm_triage import __version__
    from vllm_triage.render.sidecar import FILES, Sidecar, image_of, problems, render

    names: list[str] = args.deployment or []
    if not names:
        return _error("render sidecar needs --deployment NAME (your vLLM Deployment's name)")
    if args.output is None:
        return _error("render sidecar writes four files: give --output DIR")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return _error(f"--deployment {', '.join(twice)} given twice")
    command = " ".join(["vllm-triage render sidecar", *_sidecar_flags(args)])
    sidecars = []
    for name in names:
        s = Sidecar(
            deployment=name,
            image=args.image or image_of(__version__),
            namespace=args.namespace,
            container=args.container,
            port=args.port,
            command=command,
        )
        wrong = problems(s)
        if wrong:
            return _error("; ".join(wrong))
        settings = None
        if args.config is not None:
            settings = sidecar_settings(args.config, name, args.port)
        sidecars.append(dataclasses.replace(s, settings=settings))
    root = Path(args.output)
    for s in sidecars:
        folder = root if len(sidecars) == 1 else root / s.deployment
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in render(s).items():
                write(folder / name, text)
        except OSError as exc:
            return _error(f"cannot write {folder}: {exc.strerror or type(exc).__name__}")
        ns = f" -n {s.namespace}" if s.namespace else ""
        print(f"wrote {', '.join(str(folder / n) for n in FILES)}")
        print(
            f"  kubectl apply -f {folder / 'configmap.yaml'}\n"
            f"  kubectl patch deployment {s.deployment}{ns} "
            f"--patch-file {folder / 'sidecar-patch.yaml'}\n"
            f"  or, with kustomize: list {folder} under `components:` beside the Deployment"
        )
    return 0


def _sidecar_flags(args: argparse.Namespace) -> list[str]:
    """The flags that rendered the files, for their first line (no --output: the text
    does not depend on where it was written)."""
    out = ["--deployment", *args.deployment]
    if args.namespace:
        out += ["--namespace", args.namespace]
    if args.container != "vllm":
        out += ["--container", args.container]
    if args.port != 8000:
        out += ["--port", str(args.port)]
    if args.image:
        out += ["--image", args.image]
    if args.config:
        out += ["--config", Path(args.config).name]
    return out


def run(args: argparse.Namespace) -> int:
    from vllm_triage.config.load import load_settings
    from vllm_triage.render.relabel import relabel
    from vllm_triage.render.templates import dashboard, prometheusrule, rules

    if args.what in ("sidecar", "relabel") and args.runtime not in (None, "vllm"):
        return _error("--engine is for `render rules` and `render dashboard`")
    if args.what == "sidecar":
        return run_sidecar(args)
    sidecar_only = [f for f in ("deployment", "namespace", "image") if getattr(args, f) is not None]
    if sidecar_only:
        return _error(f"--{sidecar_only[0]} is for `render sidecar`")
    if args.what != "rules" and args.format != "rules":
        print("vllm-triage render: error: --format is for `render rules`", file=sys.stderr)
        return 2
    settings = load_settings(args.config)  # a ConfigError is reported by the CLI: exit 2
    objectives = objectives_of(settings, origin(args.config))
    dialect = dialect_of(args.runtime)
    if args.what == "relabel":
        text = relabel(shard_rule(settings, origin(args.config)))
    elif args.what == "dashboard":
        text = dashboard(objectives, dialect)
    elif args.format == "prometheusrule":
        text = prometheusrule(objectives, dialect)
    else:
        text = rules(objectives, dialect)
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
