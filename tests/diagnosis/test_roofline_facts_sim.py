"""Where each roofline fact comes from, on simulated servers judged as the daemon judges
them (``docs/physics.md``, "Where each fact comes from"): vLLM's estimator counters fill a
model in no table, and a model in no table without KV facts is never called the serving
stack (the arithmetic: tests/core/test_roofline_facts.py, tests/core/test_roofline_unknown.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_triage.assemble import build_evaluator
from vllm_triage.config.load import load_settings
from vllm_triage.core.model import Diagnosis
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.core.roofline import sources
from vllm_triage.rules import runtime_table
from vllm_triage.simulator import Phase, Scenario, Simulation, Workload, server_spec


def test_vllms_counters_end_to_end(tmp_path: Path) -> None:
    """A simulated H100 whose /metrics also carry vLLM's estimator counters (40 GB and
    4 TFLOP a step), judged with hardware.gpu alone for a model in no table: the floor's
    bytes are vLLM's, and the evidence says where they came from."""
    spec = server_spec("H100", max_num_batched_tokens=8192, max_model_len=8192)
    load = Workload(arrival_rate_per_s=1.0, burst=100, prompt_tokens=64, output_tokens=2000)
    sim = Simulation(Scenario("x", spec, (Phase(60.0, load),), model_name="acme/bot"))
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text(yaml.safe_dump({"hardware": {"gpu": "H100"}, "window_seconds": 30}))
    evaluator = build_evaluator(load_settings(cfg))
    parser = SnapshotParser(runtime_table())
    last = None
    for tick in range(13):
        sim.advance_to(tick * 5.0)
        [(_, engine)] = sim.engines
        steps = engine.stats.iteration_tokens.count
        body = sim.render(created_at=0.0) + "".join(
            f'{name}{{engine="0",model_name="acme/bot"}} {steps * per_step}\n'
            for name, per_step in (
                ("vllm:estimated_read_bytes_per_gpu_total", 40e9),
                ("vllm:estimated_flops_per_gpu_total", 4e12),
            )
        )
        last = evaluator.step(parser.parse(body, 1000.0 + tick * 5.0))
    assert last is not None
    ev = last.measurements["acme/bot"]
    assert ev["decode_step_bytes_vllm"] == pytest.approx(40e9)
    assert ev["decode_step_flops_vllm"] == pytest.approx(4e12)
    d = last.diagnoses["acme/bot"]
    assert "step_bytes=metrics" in str(d.evidence["decode_facts_source"])
    assert "decode_roofline_ratio_is_lower_bound" not in d.evidence
    assert str(d.evidence["model_source"]).startswith("unknown: 'acme/bot'")


def _simulated(tmp: Path) -> list[Diagnosis]:
    """Long-context decode on a simulated H100 at its bandwidth limit, told only the
    bandwidth and the parameter count, serving a model in no table: no card memory to
    estimate the pool from, no kv_cache_memory_bytes, no row."""
    spec = server_spec(
        "H100", step_overhead_s=0.0005, max_num_batched_tokens=8192, max_model_len=8192
    )
    load = Workload(arrival_rate_per_s=4.0, burst=150, prompt_tokens=64, output_tokens=2000)
    sim = Simulation(Scenario("x", spec, (Phase(90.0, load),), model_name="acme/bot"))
    cfg = tmp / "bare.yaml"
    settings = {
        "window_seconds": 40,
        "slo": {"itl_p99_seconds": 0.001, "ttft_p99_seconds": 1000},
        "hardware": {"memory_bandwidth_gb_s": 3350},
        "model": {"parameters_billion": 8.03},
    }
    cfg.write_text(yaml.safe_dump(settings))
    evaluator = build_evaluator(load_settings(cfg))
    parser = SnapshotParser(runtime_table())
    out: list[Diagnosis] = []
    for tick in range(19):
        sim.advance_to(tick * 5.0)
        evaluation = evaluator.step(parser.parse(sim.render(created_at=0.0), 1000.0 + tick * 5))
        out.extend(d for d in evaluation.diagnoses.values() if d.cause == "decode_bound")
    return out


def test_a_model_in_no_table_without_kv_facts_never_says_serving_stack(tmp_path: Path) -> None:
    judged = _simulated(tmp_path)
    assert len(judged) >= 10
    assert all(d.evidence["decode_limit"] != "serving_stack" for d in judged)
    fullest = max(judged, key=lambda d: float(d.evidence["kv_usage_mean"])).evidence
    assert fullest["decode_limit"] == "unknown", fullest
    assert fullest["decode_roofline_ratio_is_lower_bound"] is True
    assert fullest["decode_roofline_needs"] == sources.SETTLE_KV
    assert "kv_bytes_per_token=unknown" in str(fullest["decode_facts_source"])
