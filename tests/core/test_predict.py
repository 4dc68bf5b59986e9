"""Predicted effects (``core.predict``): the queue graded by its load ratio, and fixes
matched to changes (docs/physics.md, "Predicted effects"); each regime's prediction held
to the simulator is tests/diagnosis/test_predict_sim.py."""

from __future__ import annotations

import dataclasses

import pytest

from vllm_triage.core import predict
from vllm_triage.core.model import Quantile, RemediationEffect, Signals
from vllm_triage.core.predict import ServerTerms, change_reason


def _signals(**kw: object) -> Signals:
    base: dict[str, object] = {"model_name": "m", "at": 60.0, "span_seconds": 60.0, "snapshots": 13}
    base.update(kw)
    return Signals(**base)  # type: ignore[arg-type]


class TestQueue:
    def test_a_queue_that_never_empties_is_measured_by_its_admissions(self) -> None:
        s = _signals(
            ttft_count=600.0,
            waiting_first=100.0,
            waiting_last=400.0,
            waiting_min=100.0,
            waiting_max=400.0,
            running_max=16.0,
        )
        q = predict.queue_state(s)
        assert q is not None
        assert q.capacity_per_second == pytest.approx(10.0)
        assert q.arrivals_per_second == pytest.approx(15.0)
        assert q.load_ratio == pytest.approx(1.5)
        assert q.regime == "overloaded"
        assert q.replicas_needed == 2

    def test_at_capacity_within_the_noise_is_backlogged_not_fine(self) -> None:
        """rho = 1.02 over 600 arrivals: inside the 1/sqrt(600) = 4 % noise. The queue
        random-walks (its growth like sqrt t), so it is backlogged, not stable."""
        s = _signals(
            ttft_count=600.0,
            waiting_first=5.0,
            waiting_last=17.0,
            waiting_min=3.0,
            waiting_max=20.0,
            running_max=16.0,
        )
        q = predict.queue_state(s)
        assert q is not None
        assert abs(q.load_ratio - 1) < q.noise
        assert q.regime == "backlogged"

    def test_light_load_is_stable(self) -> None:
        s = _signals(
            ttft_count=60.0,
            waiting_first=0.0,
            waiting_last=0.0,
            waiting_min=0.0,
            waiting_max=0.0,
            running_max=4.0,
            prefill_time_mean=0.05,
            decode_time_mean=1.0,
            kv_pool_tokens=100_000,
            mean_prompt_tokens=500.0,
            mean_generation_tokens=200.0,
        )
        q = predict.queue_state(s)
        assert q is not None and q.regime == "stable" and q.load_ratio < 0.5
        assert predict.queue_evidence(q)["queue_regime"] == "stable"

    def test_no_arrivals_no_ratio(self) -> None:
        assert predict.queue_state(_signals()) is None


class TestFixes:
    def test_a_check_says_why_it_has_no_number(self) -> None:
        (e,) = predict.effects(
            ["Check context length: long conversations hold more KV."],
            _signals(),
            cause="kv_pressure",
            breaches=("waiting",),
            roofline=None,
            hw=None,
            queue=None,
        )
        assert e.predicted is None and e.change == {}
        assert "not a setting" in e.why
        assert "no prediction" in predict.effect_text(e)

    def test_a_change_without_the_card_says_so(self) -> None:
        (e,) = predict.effects(
            ["Quantize the weights: fewer bytes."],
            _signals(itl_p99=Quantile(0.99, 0.03)),
            cause="decode_bound",
            breaches=("itl_p99",),
            roofline=None,
            hw=None,
            queue=None,
        )
        assert e.change == {"dtype": "fp8"} and e.predicted is None
        assert "card or model" in e.why

    def test_effect_text_reads_before_and_after(self) -> None:
        e = RemediationEffect(
            fix="x",
            label="FP8 KV cache",
            change={"kv_cache_dtype": "fp8"},
            metric="itl_p99_seconds",
            now=0.018,
            predicted=0.014,
            step_now=0.0093,
            step_predicted=0.0071,
        )
        assert predict.effect_text(e) == (
            "FP8 KV cache: decode step 9.3 ms → 7.1 ms, ITL p99 18 ms → 14 ms"
        )
        assert predict.effect_dict(e)["change"] == {"kv_cache_dtype": "fp8"}


class TestChangeReason:
    """``whatif``'s one line per change: the term it moves, by how much, and what the
    load made of it."""

    BEFORE = ServerTerms(
        kv_bytes_per_token=131072.0,
        weight_bytes=16e9,
        pool_tokens=100_000,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        bandwidth_gb_s=3350.0,
        compute_tflops=989.0,
        facts=True,
        running_mean=40.0,
        step_seconds=0.0249,
    )

    def test_fp8_kv_that_admits_a_bigger_batch_and_a_slower_step(self) -> None:
        """The newcomer's case: ITL p99 24.9 -> 52.1 ms with FP8 KV, now with its reason."""
        after = dataclasses.replace(
            self.BEFORE,
            kv_bytes_per_token=65536.0,
            pool_tokens=200_000,
            running_mean=84.0,
            step_seconds=0.0521,
        )
        line = change_reason("kv_cache_dtype", "fp8", self.BEFORE, after)
        assert line == (
            "KV cache in fp8: halves the KV bytes each step reads per token, and the pool "
            "holds 2x the tokens; but it admits 2.1x the batch (40 → 84 running), and each "
            "step reads more: step 24.9 → 52.1 ms"
        )

    def test_weights_that_shorten_the_step(self) -> None:
        after = dataclasses.replace(
            self.BEFORE, weight_bytes=8e9, pool_tokens=150_000, step_seconds=0.015
        )
        line = change_reason("dtype", "fp8", self.BEFORE, after)
        assert line.startswith("weights in fp8: halves the weight bytes each step reads")
        assert line.endswith("the batch stays at 40 running: step 24.9 → 15 ms")

    def test_without_a_run_it_names_the_term_only(self) -> None:
        after = dataclasses.replace(
            self.BEFORE, max_num_seqs=64, running_mean=None, step_seconds=None
        )
        line = change_reason("max_num_seqs", 64, self.BEFORE, after)
        assert line.startswith("max_num_seqs 64: the batch cap 256 → 64 sequences per step")
        assert ";" not in line
