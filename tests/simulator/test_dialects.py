"""Tests for daemon/vllm_triage/simulator/dialects.py: the simulated server speaks each
engine's dialect as the engine's own metrics code writes it (its fixture in
tests/fixtures/runtimes/: the same family names, label names and bucket bounds), the
parser reads each as its engine, and what each engine observes when is kept (SGLang's
per-token gaps, TensorRT-LLM's request series at a request's end)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.simulator import Scenario, get_scenario, record
from vllm_triage.simulator.dialects import DIALECTS

from support.parsing import parse_snapshot
from support.paths import RUNTIME_FIXTURES

#: Each dialect, the fixture it must match, and whether it is OpenMetrics.
FIXTURE = {
    "sglang": ("sglang/sglang-0.5.23.txt", False),
    "lmdeploy": ("lmdeploy/lmdeploy-0.18.0.txt", False),
    "trtllm": ("trtllm/trtllm-serve.txt", False),
    "vllm-rust": ("vllm-rust/vllm-0.34.0-rust-frontend.txt", True),
}
#: Families whose labels or buckets follow the server's settings, not the engine's code:
#: the pool's settings (vLLM's cache_config_info) and the 1-2-5 token buckets cut at the
#: server's max_model_len.
SETTINGS_BOUND = {
    "vllm:cache_config_info",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "lmdeploy:request_prompt_tokens",
    "lmdeploy:request_generation_tokens",
}


def shapes(text: str, openmetrics: bool) -> dict[str, tuple[frozenset[str], tuple[float, ...]]]:
    """Per family: the label names its samples carry (``le`` aside), its bucket bounds."""
    parse = om_families if openmetrics else text_string_to_metric_families
    labels: dict[str, set[str]] = defaultdict(set)
    bounds: dict[str, set[float]] = defaultdict(set)
    for family in parse(text):
        for s in family.samples:
            labels[family.name] |= set(s.labels) - {"le"}
            if s.name.endswith("_bucket"):
                bounds[family.name].add(float(s.labels["le"]))
    return {n: (frozenset(labels[n]), tuple(sorted(bounds[n]))) for n in labels}


def last_body(dialect: str, scenario: str | Scenario = "kv_pressure", seconds: float = 60.0) -> str:
    """The scrape at ``seconds`` of ``scenario`` in ``dialect``."""
    sc = get_scenario(scenario) if isinstance(scenario, str) else scenario
    scrapes = record(sc, start_at=1.7e9, interval_s=5.0, duration_s=seconds, naming=dialect)  # type: ignore[arg-type]
    return [body for _at, body in scrapes][-1]


#: The healthy load with three draft tokens a step, 70 % of them accepted.
SPEC_SCENARIO = dataclasses.replace(
    get_scenario("healthy"),
    spec=dataclasses.replace(
        get_scenario("healthy").spec, num_speculative_tokens=3, draft_acceptance=0.7
    ),
)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_writes_what_the_engine_writes(dialect: str) -> None:
    """Every family the simulator writes in an engine's dialect is one the engine's own
    code writes, with the same label names and bucket bounds."""
    name, openmetrics = FIXTURE[dialect]
    want = shapes((RUNTIME_FIXTURES / name).read_text(encoding="utf-8"), openmetrics)
    got = shapes(last_body(dialect), openmetrics)
    assert len(got) >= 10
    for family, (labels, bounds) in got.items():
        assert family in want, family
        if family in SETTINGS_BOUND:
            continue
        assert labels == want[family][0], family
        assert bounds == want[family][1], family


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_is_read_as_its_engine(dialect: str) -> None:
    snap = parse_snapshot(last_body(dialect), 1.0)
    engine = "vllm" if dialect == "vllm-rust" else dialect
    assert snap.runtime.name == engine and snap.problems == ()
    assert (snap.format == "openmetrics") == (dialect == "vllm-rust")
    [series] = snap.models.values()
    assert series.running == 8 and series.kv_usage is not None and series.kv_usage > 0.8


def test_sglang_two_ranks_carry_dp_rank_on_the_schedulers_series_only() -> None:
    """Two data-parallel ranks: the scheduler's series per rank (dp_rank), the
    tokenizer's once per model; as the engine's two-rank fixture shows them."""
    want = shapes(
        (RUNTIME_FIXTURES / "sglang/sglang-0.5.23-dp2-eagle.txt").read_text(encoding="utf-8"),
        False,
    )
    bodies = list(
        record(
            get_scenario("healthy"),
            start_at=1.7e9,
            interval_s=5.0,
            duration_s=30.0,
            naming="sglang",
            engines=2,
        )
    )
    got = shapes(bodies[-1][1], False)
    both = set(got) & set(want)  # a counter is created at its first count (retractions)
    assert len(both) >= 10
    for family in both:
        assert got[family][0] == want[family][0], family
    snap = parse_snapshot(bodies[-1][1], 1.0)
    [series] = snap.models.values()
    assert series.engines == 2 and set(series.per_engine) == {"0", "1"}


def test_sglang_observes_each_token_of_a_speculative_step() -> None:
    """Under speculative decoding a step emits several tokens: vLLM observes one gap per
    step, SGLang that gap over each of its tokens (more observations, the same sum)."""
    vllm = parse_snapshot(last_body("v1", SPEC_SCENARIO), 1.0)
    sglang = parse_snapshot(last_body("sglang", SPEC_SCENARIO), 1.0)
    [v], [s] = vllm.models.values(), sglang.models.values()
    assert v.itl is not None and s.itl is not None
    assert s.itl.count > 1.5 * v.itl.count
    assert s.itl.sum == pytest.approx(v.itl.sum, rel=1e-9)
    assert s.tokens_per_step is not None and s.tokens_per_step > 1.5


def test_trtllm_counts_tokens_and_first_tokens_when_requests_finish() -> None:
    """On a CPU decoding 400-token answers (~74 s each), nothing has finished after 30 s:
    TensorRT-LLM's token counters and TTFT count still read zero; vLLM's have moved."""
    vllm = parse_snapshot(last_body("v1", "decode_bound", 30.0), 1.0)
    trt = parse_snapshot(last_body("trtllm", "decode_bound", 30.0), 1.0)
    [v], [t] = vllm.models.values(), trt.models.values()
    assert v.generation_tokens and v.ttft is not None and v.ttft.count > 0
    assert t.generation_tokens == 0 and t.ttft is not None and t.ttft.count == 0
    assert t.step_seconds is not None and t.step_seconds > 0.1  # the engine's own step
