"""Each regime's predicted effect (``core.predict``) held to the simulator (docs/physics.md,
"Predicted effects"): simulate a load, predict a change from what the window measured
(the core's own signals and roofline, nothing of the simulator's truth), simulate the
changed server, and hold the prediction to what it measures, within 20 %.
"""

from __future__ import annotations

import dataclasses

import pytest

from vllm_triage.assemble import build_evaluator
from vllm_triage.core import predict
from vllm_triage.core.drive import Driver, Fed
from vllm_triage.core.model import Signals
from vllm_triage.core.roofline import step as roofline
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.demo.offline import scenario_settings
from vllm_triage.rules import runtime_table
from vllm_triage.simulator import Phase, Scenario, ServerSpec, Workload, server_spec

from support.scenarios import START, recorded

WITHIN = 0.20
DURATION = 180.0


def _run(spec: ServerSpec, load: Workload) -> tuple[Signals, Rulebook]:
    """The scenario's last window as the core measured it, and the rulebook a user would
    give it (the card and the model of the first server, nothing of a second)."""
    sc = Scenario(name="predict", spec=spec, phases=(Phase(DURATION, load),))
    settings = scenario_settings(sc, None)
    evaluator = build_evaluator(settings)
    driver = Driver(evaluator, runtime_table())
    fed = None
    for at, text in recorded(sc, start_at=START, interval_s=5.0, duration_s=DURATION):
        fed = driver.feed(text.encode(), at)
    assert isinstance(fed, Fed)
    rules = evaluator.rulebook_for(sc.model_name) if evaluator.rulebook_for else evaluator.rulebook
    return fed.evaluation.signals[sc.model_name], rules


def _spec(**caps: object) -> ServerSpec:
    fields: dict[str, object] = {
        "num_gpu_blocks": 25_000,
        "max_num_batched_tokens": 8192,
        "max_model_len": 32768,
    }
    fields.update(caps)
    return server_spec("NVIDIA H100 SXM", **fields)  # type: ignore[arg-type]


def _step_prediction(spec: ServerSpec, load: Workload, change: predict.StepChange) -> float:
    s, rules = _run(spec, load)
    assert rules.roofline is not None
    r = roofline.step_roofline(s, rules.roofline)
    assert r is not None
    step = predict.step_after(r, rules.roofline, change, predict.queue_state(s))
    assert step is not None
    return step


STEP_REGIMES = {
    # A few streams: every step reads 16 GB of weights and little else.
    "weight-bound": (
        _spec(),
        Workload(arrival_rate_per_s=1.0, prompt_tokens=64, output_tokens=400, seed=1),
        predict.StepChange(weights=0.5),
        lambda s: dataclasses.replace(s, weight_bytes=s.weight_bytes / 2),
    ),
    # A model without grouped KV heads (512 KiB a token) and 3,000-token contexts: the KV
    # reads outweigh the weights.
    "kv-bound": (
        _spec(kv_bytes_per_token=524288.0, num_gpu_blocks=9000),
        Workload(arrival_rate_per_s=2.0, prompt_tokens=3000, output_tokens=400, seed=2),
        predict.StepChange(kv=0.5),
        lambda s: dataclasses.replace(
            s, kv_bytes_per_token=s.kv_bytes_per_token / 2, num_gpu_blocks=s.num_gpu_blocks * 2
        ),
    ),
    # 20 ms of host time per step around a 5 ms floor: quantizing barely moves it.
    "overhead-bound": (
        _spec(step_overhead_s=0.02),
        Workload(arrival_rate_per_s=1.0, prompt_tokens=64, output_tokens=400, seed=3),
        predict.StepChange(weights=0.5),
        lambda s: dataclasses.replace(s, weight_bytes=s.weight_bytes / 2),
    ),
    # 8,000-token documents: the mean step carries compute-bound prefill chunks, which
    # quantized weights do not shorten (the decode steps between them they do).
    "prefill-bound": (
        _spec(),
        Workload(arrival_rate_per_s=1.5, prompt_tokens=8000, output_tokens=60, seed=4),
        predict.StepChange(weights=0.5),
        lambda s: dataclasses.replace(s, weight_bytes=s.weight_bytes / 2),
    ),
}


@pytest.mark.parametrize("regime", list(STEP_REGIMES))
def test_the_decode_step_prediction_holds_in_the_simulator(regime: str) -> None:
    spec, load, change, changed = STEP_REGIMES[regime]
    predicted = _step_prediction(spec, load, change)
    truth, _ = _run(changed(spec), load)
    assert truth.itl_mean is not None
    assert abs(predicted / truth.itl_mean - 1) <= WITHIN, (predicted, truth.itl_mean)


def _admitted(s: Signals) -> float:
    """What an overloaded server serves: its admissions while requests waited all window."""
    assert (s.waiting_min or 0) > 0, "the truth run must be overloaded to show its capacity"
    return s.ttft_count / s.span_seconds


CAPACITY_REGIMES = {
    # 16 seats under 10 requests/s: twice the seats (the queue_bound scenario's server).
    "queue-bound": (
        _spec(max_num_seqs=16),
        Workload(arrival_rate_per_s=10.0, prompt_tokens=400, output_tokens=250, seed=5),
        {"seq_cap": 2.0},
        lambda s: dataclasses.replace(s, max_num_seqs=32),
    ),
    # The pool fills long before the seats: the KV cache in 8 bits holds twice the tokens.
    "kv-pressure": (
        _spec(max_num_seqs=1024, num_gpu_blocks=6000),
        Workload(arrival_rate_per_s=12.0, prompt_tokens=300, output_tokens=1000, seed=6),
        {"pool": 2.0, "kv_bytes": 0.5},
        lambda s: dataclasses.replace(
            s, num_gpu_blocks=s.num_gpu_blocks * 2, kv_bytes_per_token=s.kv_bytes_per_token / 2
        ),
    ),
}


@pytest.mark.parametrize("regime", list(CAPACITY_REGIMES))
def test_the_capacity_prediction_holds_in_the_simulator(regime: str) -> None:
    spec, load, change, changed = CAPACITY_REGIMES[regime]
    s, rules = _run(spec, load)
    q = predict.queue_state(s)
    assert q is not None and q.regime != "stable"
    hw = rules.roofline
    r = roofline.step_roofline(s, hw) if hw is not None else None
    predicted = predict.capacity_after(s, q, r, hw, **change)
    # The changed server under three times the load: overloaded, so it shows its capacity.
    heavier = dataclasses.replace(load, arrival_rate_per_s=load.arrival_rate_per_s * 3)
    truth = _admitted(_run(changed(spec), heavier)[0])
    assert abs(predicted / truth - 1) <= WITHIN, (predicted, truth)
