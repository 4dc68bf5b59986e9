"""``vllm-triage check-config``: validate settings and print what is in force."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_triage.config.schema import Settings


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check-config",
        help="validate settings and print the effective values",
        description=(
            "Load rules/defaults.yaml, --config FILE and VLLM_TRIAGE_* variables; "
            "print the result as JSON, or the errors."
        ),
    )
    p.add_argument("--config", metavar="FILE", help="YAML settings file")
    p.set_defaults(func=run)


def unknown_ceiling(settings: Settings) -> str:
    """Why there is no ceiling yet, and what gives one: with the card known, the bundled
    model table does, once vLLM reports the model's name."""
    from vllm_triage.ceiling.gpus import find_gpu
    from vllm_triage.ceiling.model_table import load_model_table

    hw = settings.hardware
    if hw.gpu is None and hw.memory_bandwidth_gb_s is None:
        return "unknown (set hardware: the GPU, and model: unless the model table has it)"
    card = find_gpu(hw.gpu).name if hw.gpu is not None else "the card given"
    known = len(load_model_table().rows)
    return (
        f"on {card}, from the bundled model table ({known} models) once vLLM reports its "
        "model_name; set model: for one the table does not have"
    )


def run(args: argparse.Namespace) -> int:
    from vllm_triage.assemble import build_rulebook
    from vllm_triage.config.load import load_settings
    from vllm_triage.net.redact import masked_urls
    from vllm_triage.store import default_state_dir

    settings = load_settings(args.config)
    # Building the rulebooks resolves each GPU name and reads each config.json too.
    rulebooks = [("default", build_rulebook(settings))] + [
        (f"target {t.name}", build_rulebook(settings.for_target(t))) for t in settings.targets
    ]
    # Secrets print as **********; URLs without user:password and query values.
    print(json.dumps(masked_urls(settings.model_dump(mode="json")), indent=2))
    sections = [("default", settings)] + [
        (f"target {t.name}", settings.for_target(t)) for t in settings.targets
    ]
    for (who, rulebook), (_, these) in zip(rulebooks, sections, strict=True):
        c = rulebook.ceiling
        line = (
            unknown_ceiling(these)
            if c is None
            else (f"{c.tokens_per_second:.1f} tok/s per stream on {c.gpu}")
        )
        print(f"decode ceiling, {who}: {line}", file=sys.stderr)
    state = settings.state_path(default_state_dir())
    print(f"alert state (run): {state or 'not kept (state_dir: null)'}", file=sys.stderr)
    return 0
