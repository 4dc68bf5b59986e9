"""Held-out pairs: a simulated server, and the same server after one change. ``whatif``
calibrated to the first recording predicts the second; the simulator's own run of the
changed server is the truth it is held to (docs/physics.md, "Predicted effects").

Nothing of the second server reaches the prediction: it sees only the first recording
and the settings a user would give for the first server (its card and model).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from vllm_triage.assemble import build_evaluator
from vllm_triage.demo.offline import scenario_settings
from vllm_triage.simulator import Phase, Scenario, ServerSpec, Workload, server_spec
from vllm_triage.whatif.calibrate import Result, measured, whatif
from vllm_triage.whatif.changes import parse_changes
from vllm_triage.whatif.window import read_window

from support.scenarios import write_recording

DURATION = 150.0
GIB = 1024**3


def _spec(gpu: str = "NVIDIA H100 SXM", **caps: object) -> ServerSpec:
    fields: dict[str, object] = {
        "num_gpu_blocks": 9375,
        "max_num_batched_tokens": 8192,
        "max_model_len": 32768,
        "max_num_seqs": 256,
    }
    fields.update(caps)
    return server_spec(gpu, **fields)  # type: ignore[arg-type]


def _scenario(spec: ServerSpec, rate: float, prompt: int, output: int) -> Scenario:
    load = Workload(arrival_rate_per_s=rate, prompt_tokens=prompt, output_tokens=output, seed=7)
    return Scenario(name="pair", spec=spec, phases=(Phase(DURATION, load),))


#: The decode-heavy load of the tour's decode phase, lighter: ~80 streams, KV a third of
#: the reads. And a sequence-capped one for the capacity changes.
DECODE = (5.0, 64, 1200)
QUEUE = (22.0, 200, 250)


def _predict(tmp: Path, first: Scenario, change: str) -> Result:
    rec = write_recording(tmp / "first", first, duration=DURATION, interval=5.0)
    settings = scenario_settings(first, None)
    obs = read_window(rec, build_evaluator(settings), DURATION)
    return whatif(obs, lambda: build_evaluator(settings), parse_changes([change]))


def _truth(tmp: Path, second: Scenario) -> dict[str, float | None]:
    rec = write_recording(tmp / "second", second, duration=DURATION, interval=5.0)
    settings = scenario_settings(second, None)
    return measured(read_window(rec, build_evaluator(settings), DURATION).signals)


def _pairs() -> dict[str, tuple[Scenario, Scenario, str, str]]:
    base = _spec()
    fp8_kv = dataclasses.replace(
        base, kv_bytes_per_token=base.kv_bytes_per_token / 2, num_gpu_blocks=9375 * 2
    )
    freed = base.weight_bytes / 2
    fp8_w = dataclasses.replace(
        base,
        weight_bytes=base.weight_bytes / 2,
        num_gpu_blocks=9375 + int(freed // (base.kv_bytes_per_token * 16)),
    )
    capped = _spec(max_num_seqs=32)
    h200 = _spec("NVIDIA H200", num_gpu_blocks=9375 + int(38 * GIB * 0.9 // (131072 * 16)))
    decode = _scenario(base, *DECODE)
    queue = _scenario(capped, *QUEUE)
    half_rate, prompt, output = QUEUE[0] / 2, QUEUE[1], QUEUE[2]
    return {
        "fp8-kv-cache": (
            decode,
            _scenario(fp8_kv, *DECODE),
            "kv_cache_dtype=fp8",
            "decode_step_seconds",
        ),
        "fp8-weights": (decode, _scenario(fp8_w, *DECODE), "dtype=fp8", "decode_step_seconds"),
        "twice-the-sequences": (
            queue,
            _scenario(_spec(max_num_seqs=64), *QUEUE),
            "max_num_seqs=64",
            "generation_tokens_per_second",
        ),
        "one-more-replica": (
            queue,
            _scenario(capped, half_rate, prompt, output),
            "replicas=2",
            "generation_tokens_per_second",
        ),
        "another-card": (decode, _scenario(h200, *DECODE), "gpu=H200", "decode_step_seconds"),
    }


def _errors(tmp: Path) -> dict[str, float]:
    out = {}
    for name, (first, second, change, metric) in _pairs().items():
        predicted = _predict(tmp / name, first, change).after[metric]
        truth = _truth(tmp / name, second)[metric]
        assert predicted is not None and truth
        out[name] = predicted / truth - 1
    return out


@pytest.mark.slow
def test_four_of_five_held_out_pairs_within_a_quarter(tmp_path: Path) -> None:
    errors = _errors(tmp_path)
    within = [name for name, e in errors.items() if abs(e) <= 0.25]
    assert len(within) >= 4, errors


def test_fp8_kv_cache_pair(tmp_path: Path) -> None:
    """One pair in the default tier: the KV cache in 8 bits, predicted within a quarter."""
    first, second, change, metric = _pairs()["fp8-kv-cache"]
    predicted = _predict(tmp_path, first, change).after[metric]
    truth = _truth(tmp_path, second)[metric]
    assert predicted is not None and truth
    assert abs(predicted / truth - 1) <= 0.25, (predicted, truth)
