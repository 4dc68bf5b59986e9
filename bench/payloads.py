"""Benchmark payloads with real vLLM family names, HELP/TYPE lines and buckets.

One model: the vLLM 0.19.1 capture itself (tests/fixtures/vllm, 56 KB). Eight models: the
same capture's vllm: families with every sample repeated for eight model names, as a
multi-model deployment exposes them (one HELP/TYPE pair per family, then each model's
samples), with the process/HTTP families once.
"""

from __future__ import annotations

from pathlib import Path

FIXTURE = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "fixtures"
    / "vllm"
    / "kvwarden-vllm-0.19.1-v1.txt"
)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def one_model() -> str:
    return FIXTURE.read_text(encoding="utf-8")


def many_models(n: int = 8, *, name_length: int = 0) -> str:
    """``n`` models; with ``name_length``, every name but the first padded to that many
    characters (the longest label values a target may send make the largest bodies)."""
    names = [MODEL] + [f"org-{i}/model-{i}-instruct".ljust(name_length, "x") for i in range(1, n)]
    out: list[str] = []
    block: list[str] = []

    def flush() -> None:
        samples = [line for line in block if not line.startswith("#")]
        out.extend(line for line in block if line.startswith("#"))
        for name in names:
            out.extend(
                line.replace(f'model_name="{MODEL}"', f'model_name="{name}"') for line in samples
            )
        block.clear()

    for line in one_model().splitlines():
        if line.startswith("# HELP") and block:
            flush()
        if line.startswith(("# HELP", "# TYPE")) or f'model_name="{MODEL}"' in line:
            block.append(line)
        else:
            if block:
                flush()
            out.append(line)
    flush()
    return "\n".join(out) + "\n"
