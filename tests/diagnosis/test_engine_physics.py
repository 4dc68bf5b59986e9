"""The same diagnosis on every engine, from the same physics: each bundled scenario,
simulated in each engine's dialect (``simulator.dialects``), fires the cause its physics
gives, or, where an engine's metrics cannot show it in time, nothing rather than another
cause; and the parts of the judgement that differ by engine (what progress is, where the
decode step comes from, what is said of what an engine cannot tell) do so as its spec
says (``rules/runtimes/``, docs/engines.md)."""

from __future__ import annotations

import dataclasses

import pytest

from vllm_triage.assemble import build_evaluator
from vllm_triage.config.load import load_settings
from vllm_triage.core.diagnose import diagnose
from vllm_triage.core.drive import Driver, Fed
from vllm_triage.core.evaluate import Evaluation, Evaluator
from vllm_triage.core.model import Runtime
from vllm_triage.core.totals import Window
from vllm_triage.demo.offline import scenario_facts
from vllm_triage.rules import runtime_table
from vllm_triage.simulator import get_scenario, record

from support.diagnosis import KV_FULL_PREEMPTING, q, rules, signals
from support.snapshots import hist, snap

DIALECTS = ("v1", "sglang", "lmdeploy", "trtllm", "vllm-rust")
#: scenario -> (the cause its physics gives, the simulated seconds that show it).
SCENARIOS = {
    "kv_pressure": ("kv_pressure", 90.0),
    "queue_bound": ("queue_bound", 60.0),
    "prefill_bound": ("prefill_bound", 90.0),
    "decode_bound": ("decode_bound", 60.0),
    "stalled": ("stalled", 300.0),
    "healthy": (None, 120.0),
}
#: Where an engine's metrics cannot show the cause within the run: TensorRT-LLM observes
#: its latencies when a request finishes, and a CPU's 400-token answers take ~74 s, so a
#: minute holds too few to judge ITL: nothing fires (and nothing else does either).
UNSEEN = {("trtllm", "decode_bound")}


def evaluations(scenario: str, dialect: str, seconds: float) -> list[Evaluation]:
    sc = get_scenario(scenario)
    driver = Driver(
        build_evaluator(load_settings(None, scenario_facts(sc) or None)), runtime_table()
    )
    out = []
    for at, body in record(sc, start_at=1.7e9, interval_s=5.0, duration_s=seconds, naming=dialect):  # type: ignore[arg-type]
        fed = driver.feed(body.encode(), at)
        assert isinstance(fed, Fed), fed
        out.append(fed.evaluation)
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_engine_names_the_cause_its_physics_gives(scenario: str, dialect: str) -> None:
    cause, seconds = SCENARIOS[scenario]
    evs = evaluations(scenario, dialect, seconds)
    fired = [t.cause for e in evs for t in e.transitions if t.event == "firing"]
    if (dialect, scenario) in UNSEEN:
        assert fired == []
        [d] = evs[-1].diagnoses.values()
        assert d.cause is None and d.inconclusive
        return
    assert fired[:1] == ([cause] if cause else [])
    engine = "vllm" if dialect in ("v1", "vllm-rust") else dialect
    assert all(d.runtime == engine for e in evs for d in e.diagnoses.values())


class TestProgress:
    """The stall watch reads each engine's real-time progress only."""

    TRTLLM = runtime_table().spec("trtllm").runtime

    @staticmethod
    def watch(runtime: Runtime, *, step_moves: bool) -> Window:
        """90 s of 8 requests decoding and no request finishing: the token counters stand
        still (TensorRT-LLM counts them at a request's end); the last step's latency
        moves with every step, or (a hung engine) does not."""
        w = Window(60.0)
        for i in range(19):
            step = 0.02 + (0.001 * (i % 3) if step_moves else 0.0)
            s = snap(
                i * 5.0,
                running=8.0,
                waiting=0.0,
                kv_usage=0.5,
                generation_tokens=100.0,
                prompt_tokens=900.0,
                requests_finished=3.0,
                step_seconds=step,
            )
            assert w.push(dataclasses.replace(s, runtime=runtime))
        return w

    def test_still_token_counters_are_no_stall_on_tensorrt_llm(self) -> None:
        p = self.watch(self.TRTLLM, step_moves=True).signals("m").progress
        assert p is not None and p.seconds_without_progress == 0
        assert "generation_tokens" not in p.checked and "step_seconds" in p.checked

    def test_nothing_moving_on_tensorrt_llm_is_a_stall(self) -> None:
        s = self.watch(self.TRTLLM, step_moves=False).signals("m")
        assert s.progress is not None and s.progress.seconds_without_progress == 90
        d = diagnose(s, rules())
        assert d.cause == "stalled"
        limits = d.evidence["runtime_limits"]
        assert isinstance(limits, tuple) and any("token counters" in x for x in limits)

    def test_the_same_frozen_tokens_on_vllm_are_a_stall(self) -> None:
        """vLLM writes its token counters per step: still counters with work outstanding
        are a hang (its reference semantics)."""
        s = self.watch(Runtime(), step_moves=True).signals("m")
        assert s.progress is not None and s.progress.seconds_without_progress == 90


class TestDecodeStep:
    """The decode step from what each engine measures."""

    @staticmethod
    def window(runtime: Runtime, **fields: float) -> Window:
        w = Window(60.0, min_observations=1)
        zero = hist([0] * 11)
        w.push(dataclasses.replace(snap(0.0, itl=zero, running=4.0, **fields), runtime=runtime))
        busy = hist([100] + [0] * 10, total=0.5)  # 100 observations, 5 ms mean
        w.push(dataclasses.replace(snap(10.0, itl=busy, running=4.0, **fields), runtime=runtime))
        return w

    def test_sglang_step_is_itl_times_tokens_per_step(self) -> None:
        """SGLang divides each gap by the tokens it brought: a step is ITL x accept length."""
        sglang = runtime_table().spec("sglang").runtime
        s = self.window(sglang, tokens_per_step=2.5).signals("m")
        assert s.itl_mean == pytest.approx(0.005)
        assert s.step_seconds_mean == pytest.approx(0.0125)
        assert s.decode_tokens_per_step == pytest.approx(2.5)
        assert s.decode_tokens_per_second_per_stream == pytest.approx(200.0)  # 1 / ITL
        assert "per token" in s.step_source

    def test_sglang_without_speculative_decoding_reads_zero_as_one(self) -> None:
        sglang = runtime_table().spec("sglang").runtime
        s = self.window(sglang, tokens_per_step=0.0).signals("m")
        assert s.step_seconds_mean == pytest.approx(0.005) and s.decode_tokens_per_step == 1.0

    def test_tensorrt_llm_step_is_its_iteration_latency(self) -> None:
        trt = runtime_table().spec("trtllm").runtime
        s = self.window(trt, step_seconds=0.018, tokens_per_step=1.0).signals("m")
        assert s.step_seconds_mean == pytest.approx(0.018)
        assert "last-iteration latency" in s.step_source

    def test_tensorrt_llm_without_its_gauge_has_no_step(self) -> None:
        trt = runtime_table().spec("trtllm").runtime
        s = self.window(trt).signals("m")
        assert s.step_seconds_mean is None and s.decode_tokens_per_second_per_stream is None
        assert "decode step is unknown" in s.missing["decode_step_seconds"]


class TestWhatCannotBeJudged:
    def test_lmdeploy_kv_pressure_says_it_is_judged_from_usage_alone(self) -> None:
        """No preemption series: a full pool while TTFT breaches is KV pressure, and the
        evidence says how it was judged."""
        lmdeploy = runtime_table().spec("lmdeploy").runtime
        s = signals(
            **{**KV_FULL_PREEMPTING, "preemptions_per_second": None, "waiting_mean": 0.0},
            kv_pool_tokens=None,
            runtime=lmdeploy,
        )
        d = diagnose(s, rules())
        assert d.cause == "kv_pressure" and d.runtime == "lmdeploy"
        assert (
            "no preemption series on LMDeploy: KV pressure judged from usage alone"
            in (d.evidence["runtime_limits"])
        )
        assert "n/a" not in d.summary and "preemptions" not in d.summary

    def test_a_cause_the_engine_cannot_judge_is_never_named(self) -> None:
        """A spec that says its metrics cannot show KV pressure never gets it: the breach
        is said, unexplained, and nothing opens."""
        blind = Runtime(
            name="blind",
            title="Blind",
            judges=("stalled", "queue_bound", "prefill_bound", "decode_bound"),
        )
        d = diagnose(signals(**KV_FULL_PREEMPTING, runtime=blind), rules())
        assert d.cause != "kv_pressure" and "kv_pressure" not in d.present
        only = Runtime(name="only", title="Only", judges=("stalled",))
        d = diagnose(signals(**KV_FULL_PREEMPTING, runtime=only), rules())
        assert d.cause is None and not d.breached
        assert "cannot show which cause" in d.summary

    def test_the_rust_frontend_says_rendering_is_unknown(self) -> None:
        """A TTFT breach on vLLM's Rust frontend: no render histogram, so the API
        server's share is unknown, and the prefill verdict says so."""
        rust = runtime_table().spec("vllm").runtime_for("openmetrics")
        d = diagnose(signals(ttft_p99=q(6.0), ttft_mean=3.0, runtime=rust), rules())
        assert d.cause == "prefill_bound"
        limits = d.evidence["runtime_limits"]
        assert (
            isinstance(limits, tuple) and "Rust frontend exports no render histogram" in limits[0]
        )


def test_a_target_whose_engine_changes_starts_its_window_again() -> None:
    """Another engine answering at the address: said, and nothing compared across it."""
    ev = Evaluator(rules(), window_seconds=60.0)
    sglang = runtime_table().spec("sglang").runtime
    first = ev.step(snap(0.0, generation_tokens=100.0, running=2.0))
    assert first.accepted and not first.problems
    ev.step(snap(5.0, generation_tokens=200.0, running=2.0))
    changed = ev.step(
        dataclasses.replace(snap(10.0, generation_tokens=5.0, running=2.0), runtime=sglang)
    )
    assert changed.accepted
    assert any("engine changed from vLLM to SGLang" in p for p in changed.problems)
    [s] = changed.signals.values()
    assert s.snapshots == 1 and s.runtime.name == "sglang"  # the old window is gone
