"""A model the card cannot hold gets no decode rate (daemon/vllm_triage/ceiling/hardware.py,
daemon/vllm_triage/commands/ceiling.py): 70 B parameters in fp8 are 70 GB of weights, an L40S has
48 GB, of which vLLM lets itself use 90 %; the command says it does not fit and the least
tensor-parallel size that holds the weights, instead of printing 12 tok/s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_triage.ceiling.gpus import find_gpu, load_gpu_table
from vllm_triage.ceiling.hardware import ceiling_rows, fit
from vllm_triage.ceiling.sizing import model_size_from_parameters

from support.clirun import vllm_triage

GIB = 2**30


def test_70b_fp8_does_not_fit_an_l40s_and_needs_two() -> None:
    size = model_size_from_parameters(70, "fp8")
    f = fit(size, find_gpu("L40S"))
    assert f is not None and not f.fits
    assert f.weight_bytes_per_gpu == 70e9
    assert f.usable_bytes == pytest.approx(48 * GIB * 0.9)
    assert f.min_tensor_parallel_size == 2  # 35 GB each: under 46.4 GB
    split = fit(size, find_gpu("L40S"), 2)
    assert split is not None and split.fits and split.weight_bytes_per_gpu == 35e9


def test_the_least_split_is_the_physics_not_a_table() -> None:
    """405 B in bf16 (810 GB) on 80 GB cards: 72 GiB usable each, 12 would do, vLLM's
    split is a power of two: 16."""
    f = fit(model_size_from_parameters(405, "bfloat16"), find_gpu("h100"))
    assert f is not None and not f.fits and f.min_tensor_parallel_size == 16
    assert 810e9 / 8 > 80 * GIB * 0.9 >= 810e9 / 16


def test_a_card_without_a_memory_figure_is_not_judged() -> None:
    cpu = next(g for g in load_gpu_table() if g.memory_gb is None)
    assert fit(model_size_from_parameters(70, "fp8"), cpu) is None
    [row] = ceiling_rows(model_size_from_parameters(70, "fp8"), [cpu])
    assert row["decode_ceiling_tokens_per_s"] > 0 and "fits" not in row


def test_rows_give_no_rate_where_it_does_not_fit_and_keep_it_where_it_does() -> None:
    size = model_size_from_parameters(70, "fp8")
    rows = {r["gpu"]: r for r in ceiling_rows(size, load_gpu_table())}
    l40s, h100 = rows["NVIDIA L40S"], rows["NVIDIA H100 SXM"]
    assert l40s["decode_ceiling_tokens_per_s"] is None and l40s["fits"] is False
    assert "does not fit" in l40s["does_not_fit"] and l40s["min_tensor_parallel_size"] == 2
    assert h100["fits"] is True and h100["decode_ceiling_tokens_per_s"] == pytest.approx(
        3350e9 / 70e9, abs=0.01
    )


def test_the_command_says_it_does_not_fit_not_a_rate(tmp_path: Path) -> None:
    args = ("ceiling", "--parameters-billion", "70", "--dtype", "fp8", "--gpu", "L40S")
    result = vllm_triage(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "does not fit (TP >= 2)" in out
    assert "70.0 GB of weights per card" in out
    assert "at least 2 such cards (--tensor-parallel-size 2)" in out
    table = out.split("ceiling tok/s", 1)[1]
    assert " 12\n" not in table and " 12 " not in table  # the rate it used to print
    rows = json.loads(vllm_triage(*args, "--format", "json", cwd=tmp_path).stdout)
    assert rows[0]["decode_ceiling_tokens_per_s"] is None
    split = vllm_triage(*args, "--tensor-parallel-size", "2", cwd=tmp_path).stdout
    assert "does not fit" not in split and "NVIDIA L40S             864             25" in split
