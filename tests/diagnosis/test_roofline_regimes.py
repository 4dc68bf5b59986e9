"""The roofline without being told: simulated servers on H100, H200 and L40S, diagnosed
with the settings users write (``hardware.gpu`` and a parameter count, or ``hardware.gpu``
alone for a model in the table), the KV facts taken from the simulated
``vllm:cache_config_info`` (``docs/physics.md``, "Where each fact comes from").

Each server is simulated for 90 s and scraped every 5 s; the last evaluation's decode
verdict is checked. Batched long-context decode with 0.5 ms of overhead per step is at
the card's bandwidth limit (the simulator's own floor over its step: 0.91 on the H100,
0.88 on the H200, 0.98 on the L40S; the daemon read 0.82 to 1.04); a server with 50 ms of
per-step overhead around a 5 to 19 ms floor is the serving stack (0.07 to 0.28).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_triage.assemble import build_evaluator
from vllm_triage.config.load import load_settings
from vllm_triage.core.model import Diagnosis
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.rules import runtime_table
from vllm_triage.simulator import Phase, Scenario, Simulation, Workload, server_spec

#: A served name in no table: its KV facts can only come from the metrics.
UNLISTED = "acme/support-bot-v7"
TABLED = "meta-llama/Llama-3.1-8B-Instruct"
CARDS = ("H100", "H200", "L40S")
#: Streams per card: long contexts that the card's pool holds without preempting.
STREAMS = {"H100": 150, "H200": 200, "L40S": 64}
#: A 16-bit Llama-3.1-8B, as the simulator runs it (every weight read per step).
KV = 131072


@dataclass(frozen=True)
class Case:
    card: str
    load: str  # "batched" or "overhead"
    pool: str  # "profiled": vLLM sized it (the estimate applies); "fixed": its bytes shown
    settings: str  # "count": hardware.gpu + parameters_billion; "gpu": hardware.gpu alone

    @property
    def model_name(self) -> str:
        return TABLED if self.settings == "gpu" else UNLISTED


def _scenario(case: Case) -> Scenario:
    caps: dict[str, Any] = dict(max_num_batched_tokens=8192, max_model_len=8192)
    if case.pool == "fixed":
        caps["kv_cache_memory_bytes"] = 20 * 2**30
    if case.load == "batched":
        spec = server_spec(case.card, step_overhead_s=0.0005, **caps)
        load = Workload(
            arrival_rate_per_s=1.0,
            burst=STREAMS[case.card],
            prompt_tokens=64,
            output_tokens=2000,
            seed=1,
        )
    else:
        spec = server_spec(case.card, step_overhead_s=0.05, **caps)
        load = Workload(burst=8, prompt_tokens=64, output_tokens=4000, spread=0.1)
    return Scenario(str(case), spec, (Phase(90.0, load),), model_name=case.model_name)


@functools.cache
def diagnosed(case: Case, tmp: Path) -> tuple[float, Diagnosis]:
    """(the simulator's own floor / step over the window, the last diagnosis)."""
    settings: dict[str, Any] = {
        "window_seconds": 40.0,
        "slo": {"itl_p99_seconds": 0.001, "ttft_p99_seconds": 1000},
        "hardware": {"gpu": case.card},
    }
    if case.settings == "count":
        settings["model"] = {"parameters_billion": 8.03}
    cfg = tmp / f"{case.card}-{case.load}-{case.pool}-{case.settings}.yaml"
    cfg.write_text(yaml.safe_dump(settings))
    evaluator = build_evaluator(load_settings(cfg))
    sim = Simulation(_scenario(case))
    parser = SnapshotParser(runtime_table())
    marks: dict[int, tuple[float, float]] = {}
    last = None
    for tick in range(19):
        sim.advance_to(tick * 5.0)
        stats = [engine.stats for _, engine in sim.engines]
        marks[tick] = (sum(s.decode_floor_s for s in stats), sum(s.decode_step_s for s in stats))
        last = evaluator.step(parser.parse(sim.render(created_at=0.0), 1000.0 + tick * 5.0))
    assert last is not None
    (f0, s0), (f1, s1) = marks[10], marks[18]
    [d] = last.diagnoses.values()
    return (f1 - f0) / (s1 - s0), d


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("regimes")


def _ratio(d: Diagnosis) -> float:
    value = d.evidence["decode_roofline_ratio"]
    assert isinstance(value, float)
    return value


@pytest.mark.parametrize("settings", ["count", "gpu"])
@pytest.mark.parametrize("pool", ["profiled", "fixed"])
@pytest.mark.parametrize("card", CARDS)
def test_batched_long_context_decode_is_at_the_hardware_limit(
    card: str, pool: str, settings: str, tmp: Path
) -> None:
    truth, d = diagnosed(Case(card, "batched", pool, settings), tmp)
    ev = d.evidence
    assert truth > 0.8
    assert d.cause == "decode_bound"
    assert _ratio(d) >= 0.7 and ev["decode_limit"] == "hardware", ev
    assert "decode_roofline_ratio_is_lower_bound" not in ev
    source = str(ev["decode_facts_source"])
    assert "bandwidth=gpu table" in source
    if settings == "count":
        assert "weights=settings" in source
        kv = "metrics (kv_cache_memory_bytes)" if pool == "fixed" else "estimate"
        assert f"kv_bytes_per_token={kv}" in source, source
    else:
        assert f"weights=model table ({TABLED})" in source
        assert str(ev["model_source"]).startswith(f"rules/models.yaml: {TABLED}")


@pytest.mark.parametrize("settings", ["count", "gpu"])
@pytest.mark.parametrize("card", CARDS)
def test_overhead_dominated_server_is_the_serving_stack(
    card: str, settings: str, tmp: Path
) -> None:
    truth, d = diagnosed(Case(card, "overhead", "profiled", settings), tmp)
    ev = d.evidence
    assert truth < 0.3
    assert d.cause == "decode_bound"
    assert _ratio(d) <= 0.4 and ev["decode_limit"] == "serving_stack", ev
