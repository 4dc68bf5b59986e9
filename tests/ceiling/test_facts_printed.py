"""``vllm-triage ceiling`` and ``vllm-triage check`` say where each fact came from, so a
user sees what was assumed (``docs/physics.md``, "Where each fact comes from")."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from vllm_triage.commands import check
from vllm_triage.commands.ceiling import add_parser

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def ceiling(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    p = argparse.ArgumentParser(prog="vllm-triage")
    add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["ceiling", *argv])
    code: int = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


class TestCeiling:
    def test_a_served_name_from_the_table(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Llama-3.1-8B reads 15.0 GB a token (no input table): 223 tok/s on an H100."""
        code, out, _ = ceiling(capsys, "--model", LLAMA, "--gpu", "h100")
        assert code == 0
        facts = next(line for line in out.splitlines() if line.startswith("facts: "))
        assert "bandwidth=gpu table (NVIDIA H100 SXM)" in facts
        assert f"weights=model table ({LLAMA}; found by its Hugging Face id)" in facts
        assert f"kv_bytes_per_token=model table ({LLAMA})" in facts
        assert out.splitlines()[-3].split()[-1] == "223"

    def test_json_rows_carry_the_sources(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, _ = ceiling(capsys, "--parameters-billion", "8", "--format", "json")
        rows: list[dict[str, Any]] = json.loads(out)
        assert code == 0 and rows
        for row in rows:
            source = row["decode_facts_source"]
            assert source.startswith(f"bandwidth=gpu table ({row['gpu']}); ")
            assert "weights=--parameters-billion x --dtype" in source
            assert "kv_bytes_per_token=unknown" in source

    def test_an_unknown_name_is_refused(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, err = ceiling(capsys, "--model", "meta-llama/Llama-3.1-9B")
        assert (code, out) == (2, "")
        assert "is in no model table" in err


def test_check_prints_each_models_facts() -> None:
    evidence = {
        "model_source": f"rules/models.yaml: {LLAMA} (Hugging Face id)",
        "decode_facts_source": "bandwidth=gpu table (NVIDIA H100 SXM); weights=model table",
    }
    model = {
        "model_name": LLAMA,
        "cause": "decode_bound",
        "confidence": 0.9,
        "summary": "ITL p99 0.3 s > SLO 0.1 s",
        "remediation": [],
        "evidence": evidence,
        "unjudged": False,
        "idle": False,
    }
    result = {
        "url": "http://x/metrics",
        "verdict": "incident",
        "errors": [],
        "stopped_early": False,
        "scrapes_ok": 4,
        "scrapes_tried": 4,
        "models": [model],
    }
    lines = check._text(result).splitlines()
    assert f"    model: rules/models.yaml: {LLAMA} (Hugging Face id)" in lines
    assert "    facts: bandwidth=gpu table (NVIDIA H100 SXM); weights=model table" in lines
