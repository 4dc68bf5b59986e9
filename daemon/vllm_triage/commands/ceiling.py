"""``vllm-triage ceiling``: the single-stream decode ceiling of a model on each GPU.

The arithmetic of ``docs/physics.md`` as a command, so a user can compare a measured
tokens-per-second figure with what the card's published bandwidth allows before blaming
the serving stack or the hardware.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vllm_triage.ceiling.gpus import find_gpu, load_gpu_table
from vllm_triage.ceiling.hardware import ceiling_rows
from vllm_triage.ceiling.resolve import model_size, table_model
from vllm_triage.ceiling.sizing import ModelSize
from vllm_triage.commands.argtypes import fraction, positive_float, positive_int
from vllm_triage.core.counts import counted
from vllm_triage.errors import ConfigError

DESCRIPTION = """\
Print the decode ceiling (tokens/s for one stream) of a model on each GPU of the bundled
table: published memory bandwidth divided by the weight bytes one decoded token reads.
It is arithmetic, not a benchmark: measured speed is below it, and how far below tells
whether to fix the serving stack or the hardware. Give the model as a parameter count
(every weight read per token), as its config.json, or by the name vLLM serves it under
when the bundled model table has it (mixture-of-experts models read only their active
experts; the KV cache bytes per token are reported too). The "facts" line says where
each figure came from, as the daemon's decode_facts_source does. A card whose memory
cannot hold the weights (at vLLM's default 90% of it, split over --tensor-parallel-size
cards) gets no rate: it says so, and the least tensor-parallel size that would hold them."""

EPILOG = """\
examples:
  vllm-triage ceiling --parameters-billion 8 --dtype float16
  vllm-triage ceiling --parameters-billion 70 --dtype int4 --gpu h100 --tensor-parallel-size 2
  vllm-triage ceiling --config-json ./Llama-3.1-8B-Instruct/config.json --format json
  vllm-triage ceiling --config-json config.json --kv-cache-dtype fp8 --achievable-fraction 0.8
  vllm-triage ceiling --model meta-llama/Llama-3.1-8B-Instruct --gpu h100

Figures are published peaks; --achievable-fraction discounts the bandwidth to what real
kernels reach. Tensor parallelism reads 1/N of the weights on each of N GPUs, so the
ceiling scales with N (communication aside)."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``ceiling`` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "ceiling",
        help="decode ceiling (tokens/s) of a model on each GPU",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--parameters-billion",
        type=positive_float,
        metavar="FLOAT",
        help="model size in billions of parameters (all read per token)",
    )
    p.add_argument(
        "--config-json",
        type=Path,
        metavar="PATH",
        help="the model's HuggingFace config.json (or the directory holding it)",
    )
    # No argparse default: with --config-json the dtype comes from the config (torch_dtype,
    # quantization_config) unless the user names one.
    p.add_argument(
        "--dtype",
        metavar="NAME",
        help="weight dtype: float32, bfloat16, float16, fp8, int8, int4, awq, ... "
        "(default: float16 with --parameters-billion; from config.json with --config-json)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        metavar="NAME",
        help="KV cache dtype, e.g. fp8 (default: the model's 16-bit dtype; needs --config-json)",
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help="the model by the name vLLM serves it under (its model_name), from the bundled "
        "table rules/models.yaml, e.g. meta-llama/Llama-3.1-8B-Instruct or Qwen3-8B-FP8",
    )
    p.add_argument("--gpu", metavar="NAME", help="only this GPU (name or alias, e.g. h100, 4090)")
    p.add_argument(
        "--tensor-parallel-size",
        type=positive_int,
        default=1,
        metavar="N",
        help="GPUs the model is split over (default: 1)",
    )
    p.add_argument(
        "--achievable-fraction",
        type=fraction,
        default=1.0,
        metavar="F",
        help="share of the published bandwidth kernels reach, 0 < F <= 1 (default: 1.0)",
    )
    p.add_argument("--format", choices=("text", "json"), default="text", help="default: text")
    p.set_defaults(func=run)


def _model_size(args: argparse.Namespace) -> tuple[ModelSize, str]:
    """The model's size and where it came from (``weights=...``, as the daemon says it)."""
    given = [a for a in (args.parameters_billion, args.config_json, args.model) if a is not None]
    if len(given) != 1:
        raise ConfigError(
            "give exactly one of --parameters-billion or --config-json "
            "(or --model, a name vLLM serves that is in rules/models.yaml)"
        )
    if args.parameters_billion is not None and args.kv_cache_dtype is not None:
        raise ConfigError("--kv-cache-dtype needs --config-json (the KV layout comes from it)")
    if args.model is not None:
        if args.dtype is not None:
            raise ConfigError("--dtype with --model: name the quantized model instead (-FP8)")
        found = table_model(args.model, args.kv_cache_dtype)
        if found is None:
            raise ConfigError(
                f"--model {args.model!r} is in no model table (rules/models.yaml); "
                "give --parameters-billion or --config-json"
            )
        return found.size, f"model table ({found.source.detail}; found by its {found.how})"
    size = model_size(
        parameters_billion=args.parameters_billion,
        config_json=args.config_json,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    assert size is not None  # exactly one of the two was given
    if args.config_json is not None:
        return size, f"config.json ({Path(args.config_json).name})"
    return size, "--parameters-billion x --dtype"


def facts_source(size: ModelSize, weights: str, args: argparse.Namespace, gpu: str) -> str:
    """Every fact of the ceiling with its source, as the daemon's ``decode_facts_source``."""
    kv = weights.partition(";")[0] + (")" if ";" in weights else "")
    if size.kv_bytes_per_token is None:
        kv = "unknown (a parameter count has no KV layout)"
    return (
        f"bandwidth=gpu table ({gpu}); weights={weights}; kv_bytes_per_token={kv}; "
        f"tensor_parallel=--tensor-parallel-size ({args.tensor_parallel_size})"
    )


def _render_text(
    size: ModelSize, rows: list[dict[str, Any]], args: argparse.Namespace, facts: str
) -> str:
    """An aligned table under a header that says what the ceiling was computed from."""
    lines = [
        f"Decode ceiling, one stream: {size.parameters / 1e9:.2f}B parameters, {size.dtype}, "
        f"{size.weight_bytes_per_token / 1e9:.2f} GB of weights read per token",
        f"facts: {facts}",
    ]
    if args.tensor_parallel_size != 1 or args.achievable_fraction != 1.0:
        lines.append(
            f"tensor parallel size {args.tensor_parallel_size}, "
            f"{args.achievable_fraction:.0%} of published bandwidth"
        )
    if size.kv_bytes_per_token is not None:
        kib = size.kv_bytes_per_token / 1024
        lines.append(f"KV cache: {size.kv_bytes_per_token:,} bytes per token ({kib:.1f} KiB)")
    lines.extend(f"note: {n}" for n in size.notes)
    table = [("GPU", "bandwidth GB/s", "ceiling tok/s")]
    table += [
        (
            r["gpu"],
            f"{r['memory_bandwidth_gb_s']:g}",
            # A card that cannot hold the weights has no rate: it would not run at all.
            f"{r['decode_ceiling_tokens_per_s']:.0f}"
            if r["decode_ceiling_tokens_per_s"] is not None
            else f"does not fit (TP >= {r['min_tensor_parallel_size'] or '128+'})",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    lines.append("")
    if len(rows) > 1:
        lines.append("By memory bandwidth, lowest first:")
    for name, bandwidth, ceiling in table:
        lines.append(f"{name:<{widths[0]}}  {bandwidth:>{widths[1]}}  {ceiling:>{widths[2]}}")
    lines.append("")
    unfit = [r for r in rows if r.get("does_not_fit")]
    if len(rows) == 1 and unfit:
        lines.append(f"{unfit[0]['gpu']}: {unfit[0]['does_not_fit']}.")
    elif unfit:
        lines.append(
            f"{counted(len(unfit), 'card')} cannot hold the weights at tensor parallel size "
            f"{args.tensor_parallel_size} (vLLM uses 90% of a card by default): no rate; "
            "TP >= N is the least split that holds the weights alone."
        )
    lines.append("Published peak bandwidth; measured speed is below it (KV reads not included).")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the ceiling rows; user errors go to stderr as one line and return 2."""
    try:
        size, weights = _model_size(args)
        gpus = (find_gpu(args.gpu),) if args.gpu else load_gpu_table()
    except ConfigError as exc:
        print(f"vllm-triage ceiling: error: {exc}", file=sys.stderr)
        return 2
    # By bandwidth (the ceiling's one input that varies by card), then name: a stated
    # order, the same in text and JSON.
    ordered = sorted(gpus, key=lambda g: (g.memory_bandwidth_gb_s, g.name))
    rows = ceiling_rows(size, ordered, args.tensor_parallel_size, args.achievable_fraction)
    for row in rows:
        row["decode_facts_source"] = facts_source(size, weights, args, row["gpu"])
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        card = rows[0]["gpu"] if len(rows) == 1 else "each row"
        print(_render_text(size, rows, args, facts_source(size, weights, args, card)))
    return 0
