"""Tests for daemon/core/diagnose.py: the four causes, in causal order, with their evidence."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from vllm_triage.assemble import build_rulebook
from vllm_triage.config.load import load_settings
from vllm_triage.core.diagnose import diagnose, stall_breach_seconds
from vllm_triage.core.model import Progress, Quantile, Signals
from vllm_triage.core.rulebook import Ceiling, Roofline, Rulebook

SETTINGS = load_settings()
A10G_70B = Ceiling(
    gpu="NVIDIA A10G",
    memory_bandwidth_gb_s=600,
    weight_bytes_per_token=140e9,
    tokens_per_second=600e9 / 140e9,
)


def rules(ceiling: Ceiling | None = None) -> Rulebook:
    return dataclasses.replace(build_rulebook(SETTINGS), ceiling=ceiling)


def q(value: float, p: float = 0.99) -> Quantile:
    return Quantile(q=p, value=value)


HEALTHY: dict[str, Any] = dict(
    ttft_p99=q(0.3),
    ttft_mean=0.1,
    itl_p99=q(0.03),
    itl_mean=0.02,
    waiting_mean=0.0,
    running_mean=4.0,
    kv_usage_mean=0.2,
    kv_usage_max=0.25,
    preemptions_per_second=0.0,
    queue_time_mean=0.01,
    queue_time_count=100.0,
    ttft_count=100.0,
    prefill_time_share=0.1,
    decode_tokens_per_second_per_stream=50.0,
    kv_pool_tokens=100_000,
)


def signals(**changes: Any) -> Signals:
    return Signals(
        model_name="m", at=100.0, span_seconds=60.0, snapshots=13, **{**HEALTHY, **changes}
    )


# Each case: the signals of one situation, the cause it must get, and why.
CASES = [
    pytest.param(
        # waiting, and the pool (100k tokens, 97 % used by 8 requests) has room for
        # 0.25 more request of the current size; preemptions confirm
        dict(
            waiting_mean=6.0,
            running_mean=8.0,
            kv_usage_mean=0.97,
            kv_usage_max=0.99,
            preemptions_per_second=0.4,
            ttft_p99=q(9.0),
            ttft_mean=4.0,
            queue_time_mean=3.5,
        ),
        "kv_pressure",
        (),
        id="kv-full-preempting",
    ),
    pytest.param(
        # a small pool (4096 tokens) 70 % used by 2 long requests has room for 0.86
        # more: KV pressure, although usage is far below any fixed 90 % cut-off
        dict(
            waiting_mean=3.0,
            running_mean=2.0,
            kv_usage_mean=0.7,
            kv_usage_max=0.72,
            preemptions_per_second=0.0,
            kv_pool_tokens=4096,
            ttft_p99=q(6.0),
            ttft_mean=3.0,
            queue_time_mean=2.5,
        ),
        "kv_pressure",
        (),
        id="small-pool-headroom-in-requests",
    ),
    pytest.param(
        # many waiting, KV 20 % used: a sequence cap, not memory
        dict(
            waiting_mean=20.0,
            running_mean=16.0,
            kv_usage_mean=0.2,
            ttft_p99=q(12.0),
            ttft_mean=8.0,
            queue_time_mean=7.5,
            prefill_time_share=0.1,
        ),
        "queue_bound",
        (),
        id="seq-cap-with-kv-room",
    ),
    pytest.param(
        # TTFT breached, queue empty, prefill dominates: long prompts
        dict(
            ttft_p99=q(4.0),
            ttft_mean=2.5,
            queue_time_mean=0.05,
            prefill_time_share=0.8,
            prefill_time_mean=2.4,
            mean_prompt_tokens=12000.0,
        ),
        "prefill_bound",
        (),
        id="long-prompts",
    ),
    pytest.param(
        # requests wait, KV has room, but prefill takes the engine: a prefill backlog
        dict(
            ttft_p99=q(8.0),
            ttft_mean=5.0,
            queue_time_mean=4.0,
            waiting_mean=4.0,
            prefill_time_share=0.85,
            kv_usage_mean=0.3,
        ),
        "prefill_bound",
        (),
        id="prefill-backlog",
    ),
    pytest.param(
        # ITL breached while prefill takes 75 % of engine time: interference
        dict(
            itl_p99=q(0.6),
            itl_mean=0.08,
            prefill_time_share=0.75,
            decode_tokens_per_second_per_stream=12.5,
        ),
        "prefill_bound",
        (),
        id="prefill-interference",
    ),
    pytest.param(
        # ITL breached, decode dominates engine time
        dict(
            itl_p99=q(0.3),
            itl_mean=0.25,
            prefill_time_share=0.05,
            decode_tokens_per_second_per_stream=4.0,
        ),
        "decode_bound",
        (),
        id="slow-decode",
    ),
    pytest.param(
        # V0 (no queue/prefill histograms): TTFT breached with no one waiting is prefill
        dict(ttft_p99=q(5.0), ttft_mean=3.0, queue_time_mean=None, prefill_time_share=None),
        "prefill_bound",
        (),
        id="v0-ttft-no-queue",
    ),
    pytest.param(
        # V0: TTFT breached with a sustained queue and KV room is queue-bound
        dict(
            ttft_p99=q(5.0),
            ttft_mean=3.0,
            waiting_mean=8.0,
            queue_time_mean=None,
            prefill_time_share=None,
        ),
        "queue_bound",
        (),
        id="v0-ttft-with-queue",
    ),
]


class TestCauses:
    @pytest.mark.parametrize(("changes", "cause", "secondary"), CASES)
    def test_cause(self, changes: dict[str, Any], cause: str, secondary: tuple[str, ...]) -> None:
        """Each situation gets the cause the physics gives, with the others as secondary."""
        d = diagnose(signals(**changes), rules(A10G_70B))
        assert d.cause == cause
        assert d.secondary == secondary
        assert 0.0 < d.confidence <= 1.0
        assert d.remediation and d.summary

    def test_healthy_is_nothing(self) -> None:
        """Within every SLO, nothing is breached and no cause is named."""
        d = diagnose(signals(), rules())
        assert d.cause is None and d.breaches == ()

    def test_not_enough_data_is_not_a_breach(self) -> None:
        """Missing percentiles (too few observations) never open an incident."""
        d = diagnose(signals(ttft_p99=None, itl_p99=None), rules())
        assert d.cause is None


class TestDecodeCeiling:
    def test_at_the_hardware_limit(self) -> None:
        """Decode at 93 % of the ceiling is the hardware's limit; quantizing comes first."""
        d = diagnose(
            signals(itl_p99=q(0.3), itl_mean=0.25, decode_tokens_per_second_per_stream=4.0),
            rules(A10G_70B),
        )
        assert d.cause == "decode_bound"
        assert d.evidence["decode_limit"] == "hardware"
        assert d.evidence["decode_ceiling_ratio"] == pytest.approx(4.0 / (600 / 140))
        assert "hardware limit" in d.summary
        assert d.remediation[0].startswith("Quantize")

    def test_below_the_ceiling_is_the_serving_stack(self) -> None:
        """Decode at 23 % of the ceiling points at the serving stack, not the card."""
        d = diagnose(
            signals(itl_p99=q(0.3), itl_mean=1.0, decode_tokens_per_second_per_stream=1.0),
            rules(A10G_70B),
        )
        assert d.evidence["decode_limit"] == "serving_stack"
        assert "serving stack" in d.summary
        assert not d.remediation[0].startswith("Quantize")

    def test_without_hardware(self) -> None:
        """Without hardware settings the ratio is left out and the summary says why."""
        d = diagnose(
            signals(itl_p99=q(0.3), itl_mean=0.25, decode_tokens_per_second_per_stream=4.0), rules()
        )
        assert d.cause == "decode_bound"
        assert "decode_ceiling_ratio" not in d.evidence
        assert d.evidence["decode_limit"] == "unknown"


#: Llama-3.1-8B at bf16 on an H100 with its KV layout: the roofline's facts.
H100_8B = Roofline(
    gpu="NVIDIA H100 SXM",
    memory_bandwidth_gb_s=3350,
    weight_bytes=16.06e9,
    compute_tflops=989.4,
    active_parameters=8.03e9,
    kv_bytes_per_token=131072,
    kv_split=8,
)


def roofline_rules() -> Rulebook:
    return dataclasses.replace(build_rulebook(SETTINGS), roofline=H100_8B)


#: 150 streams holding 40 % of a 400,000-token pool: 16.06 GB of weights and 20.97 GB
#: of KV a step, an 11.05 ms floor on an H100 (3.35 TB/s).
BATCH = dict(itl_p99=q(0.3), running_mean=150.0, kv_usage_mean=0.4, kv_pool_tokens=400_000)
FLOOR_S = (16.06e9 + 160_000 * 131072) / 3350e9


class TestDecodeRoofline:
    def test_at_the_floor_is_the_hardware_and_kv_comes_first(self) -> None:
        """A step 1.1x its floor is at the hardware's limit; KV reads dominate, so the
        first fix is an 8-bit KV cache, then the weights'."""
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 1.1), roofline_rules())
        ev = d.evidence
        assert d.cause == "decode_bound"
        assert ev["decode_limit"] == "hardware"
        assert ev["decode_roofline_ratio"] == pytest.approx(1 / 1.1, rel=1e-4)
        assert ev["decode_step_floor_seconds"] == pytest.approx(FLOOR_S, rel=1e-4)
        assert (ev["decode_bound_by"], ev["decode_dominant_term"]) == ("memory", "kv")
        assert "at the hardware limit, KV cache reads dominate" in d.summary
        assert "fp8" in d.remediation[0]
        assert any(r.startswith("Quantize") for r in d.remediation[3:])

    def test_far_above_the_floor_is_the_serving_stack(self) -> None:
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 4), roofline_rules())
        assert d.evidence["decode_limit"] == "serving_stack"
        assert "serving stack" in d.summary
        assert "per-step overhead" in d.remediation[0]

    def test_faster_than_the_floor_means_the_settings_are_wrong(self) -> None:
        """A step half its floor is impossible: the summary says the settings are wrong
        and names them, the KV setting first (the dominant term)."""
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S / 2), roofline_rules())
        ev = d.evidence
        assert ev["decode_limit"] == "unknown"
        assert "settings are wrong" in d.summary and "model.kv_bytes_per_token" in d.summary
        assert str(ev["decode_settings_suspect"]).startswith("model.kv_bytes_per_token")
        assert "hardware.tensor_parallel_size" in str(ev["decode_settings_suspect"])
        assert "faster than the hardware and model settings allow" in d.remediation[0]

    def test_compute_bound_steps_fix_tokens_per_step_first(self) -> None:
        changes = dict(
            itl_p99=q(0.3),
            itl_mean=0.15,
            running_mean=32.0,
            kv_usage_mean=0.05,
            kv_pool_tokens=400_000,
            prompt_tokens_per_second=50_000.0,
        )
        d = diagnose(signals(**changes), roofline_rules())
        assert d.evidence["decode_bound_by"] == "compute"
        assert d.evidence["decode_limit"] == "hardware"
        assert "fewer tokens per step" in d.remediation[0]

    def test_healthy_carries_the_roofline(self) -> None:
        """The roofline is evidence while healthy too (exported, drawn in Grafana)."""
        d = diagnose(signals(**{**BATCH, "itl_p99": q(0.015)}, itl_mean=0.013), roofline_rules())
        assert d.cause is None
        assert d.evidence["decode_roofline_ratio"] == pytest.approx(FLOOR_S / 0.013, rel=1e-4)
        assert "decode_limit" not in d.evidence

    def test_unknown_kv_is_named_in_the_summary(self) -> None:
        rules = dataclasses.replace(
            roofline_rules(), roofline=dataclasses.replace(H100_8B, kv_bytes_per_token=None)
        )
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 1.1), rules)
        assert "left out: KV reads" in d.summary
        assert "model.kv_bytes_per_token" in str(d.evidence["decode_roofline_left_out"])

    def test_spec_decode_per_stream_rate_in_the_summary(self) -> None:
        d = diagnose(
            signals(
                **BATCH,
                itl_mean=FLOOR_S * 1.1,
                decode_tokens_per_step=2.5,
                decode_tokens_per_second_per_stream=2.5 / (FLOOR_S * 1.1),
            ),
            roofline_rules(),
        )
        assert d.evidence["decode_tokens_per_step"] == 2.5
        assert f"{2.5 / (FLOOR_S * 1.1):.3g} tok/s per stream" in d.summary


class TestMeasuredMemoryActivity:
    """DCGM's DRAM activity in the decode split (fleet mode): a card busy reading memory
    is at its limit whatever the arithmetic says; disagreements are said."""

    def test_busy_memory_is_the_hardware_limit_though_the_floor_is_low(self) -> None:
        """The arithmetic puts the step at a quarter of its floor (it misses reads), but
        the memory interface is busy 75 % of cycles: at the hardware limit."""
        d = diagnose(
            signals(**BATCH, itl_mean=FLOOR_S * 4, dram_active_mean=0.75), roofline_rules()
        )
        ev = d.evidence
        assert ev["decode_limit"] == "hardware"
        assert ev["decode_dram_active_ratio"] == 0.75
        assert ev["decode_dram_agrees_with_roofline"] is False
        assert "memory busy 75% of cycles" in d.summary
        assert "at the hardware limit by measurement, though the floor is only 25%" in d.summary
        assert "fp8" in d.remediation[0]  # the reads to cut, KV's first

    def test_quiet_memory_disagrees_with_a_memory_bound_floor(self) -> None:
        d = diagnose(
            signals(**BATCH, itl_mean=FLOOR_S * 1.1, dram_active_mean=0.2), roofline_rules()
        )
        assert d.evidence["decode_limit"] == "hardware"  # the roofline's verdict stands
        assert d.evidence["decode_dram_agrees_with_roofline"] is False
        assert "busy only 20% of cycles: the measurement and the arithmetic disagree" in d.summary

    def test_both_say_the_limit(self) -> None:
        d = diagnose(
            signals(**BATCH, itl_mean=FLOOR_S * 1.1, dram_active_mean=0.7), roofline_rules()
        )
        assert d.evidence["decode_dram_agrees_with_roofline"] is True
        assert "disagree" not in d.summary

    def test_quiet_memory_below_the_floor_agrees_on_the_serving_stack(self) -> None:
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 4, dram_active_mean=0.2), roofline_rules())
        assert d.evidence["decode_limit"] == "serving_stack"
        assert d.evidence["decode_dram_agrees_with_roofline"] is True

    def test_a_compute_bound_step_leaves_the_memory_quiet(self) -> None:
        changes = dict(
            itl_p99=q(0.3),
            itl_mean=0.15,
            running_mean=32.0,
            kv_usage_mean=0.05,
            kv_pool_tokens=400_000,
            prompt_tokens_per_second=50_000.0,
            dram_active_mean=0.1,
        )
        d = diagnose(signals(**changes), roofline_rules())
        assert d.evidence["decode_bound_by"] == "compute"
        assert d.evidence["decode_dram_agrees_with_roofline"] is True

    def test_busy_memory_without_any_hardware_settings(self) -> None:
        d = diagnose(signals(itl_p99=q(0.3), itl_mean=0.2, dram_active_mean=0.8), rules())
        assert d.evidence["decode_limit"] == "hardware"
        assert "decode_dram_agrees_with_roofline" not in d.evidence
        assert "memory busy 80% of cycles: at the hardware limit" in d.summary

    def test_the_threshold_is_the_settings(self) -> None:
        strict = dataclasses.replace(
            roofline_rules(),
            thresholds=dataclasses.replace(SETTINGS_THRESHOLDS, dram_active_busy=0.9),
        )
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 4, dram_active_mean=0.75), strict)
        assert d.evidence["decode_limit"] == "serving_stack"

    def test_a_sidecar_has_no_measurement(self) -> None:
        d = diagnose(signals(**BATCH, itl_mean=FLOOR_S * 4), roofline_rules())
        assert "decode_dram_active_ratio" not in d.evidence and "DCGM" not in d.summary


SETTINGS_THRESHOLDS = build_rulebook(SETTINGS).thresholds


class TestEvidence:
    def test_evidence_holds_the_deciding_numbers(self) -> None:
        """KV pressure's evidence carries the headroom, usage, waiting and preemptions."""
        d = diagnose(signals(**CASES[0].values[0]), rules())
        ev = d.evidence
        # free tokens at the fullest moment (99 % used) over the tokens per running request
        assert ev["kv_headroom_requests"] == pytest.approx(
            (100_000 * 0.01) / (97_000 / 8), rel=1e-5
        )
        assert ev["requests_waiting_mean"] == 6.0
        assert ev["preemptions_per_second"] == 0.4
        assert ev["breaches"] == "ttft_p99,waiting,kv_preemptions"

    def test_no_nan_in_evidence(self) -> None:
        """A NaN from a broken target never reaches the evidence."""
        d = diagnose(signals(ttft_p99=q(9.0), ttft_mean=float("nan")), rules())
        assert "ttft_mean_seconds" not in d.evidence


class TestKvHeadroom:
    def test_footprint_is_the_finished_requests_size(self) -> None:
        """Room is counted in requests as big as finished ones grew (prompt + output):
        a 2,048-token pool half used has no room for a 1,500-token request."""
        d = diagnose(
            signals(
                waiting_mean=5.0, running_mean=1.0, kv_usage_mean=0.5, kv_usage_max=0.5,
                kv_pool_tokens=2048, mean_prompt_tokens=700.0, mean_generation_tokens=800.0,
                ttft_p99=q(9.0), ttft_mean=6.0, queue_time_mean=5.5,
            ),
            rules(),
        )  # fmt: skip
        assert d.cause == "kv_pressure"
        assert d.evidence["kv_request_footprint_tokens"] == 1500.0
        assert d.evidence["kv_headroom_requests"] == pytest.approx(1024 / 1500, rel=1e-5)

    def test_fullest_moment_counts(self) -> None:
        """A window that began idle (mean usage low) still sees the pool full at its peak."""
        d = diagnose(
            signals(
                waiting_mean=3.0, running_mean=0.9, kv_usage_mean=0.4, kv_usage_max=0.8,
                kv_pool_tokens=2048, ttft_p99=q(0.5),
            ),
            rules(),
        )  # fmt: skip
        assert d.cause == "kv_pressure"


class TestQueueShare:
    def test_share_needs_comparable_requests(self) -> None:
        """Queue time seen for few requests (V1 observes it at finish) is no share of TTFT:
        the waiting queue alone decides, and nothing claims "0 % of TTFT"."""
        d = diagnose(
            signals(
                waiting_mean=12.0, ttft_p99=q(19.0), ttft_mean=10.0, ttft_count=16.0,
                queue_time_mean=0.001, queue_time_count=2.0,
            ),
            rules(),
        )  # fmt: skip
        assert d.cause == "queue_bound"
        assert d.secondary == ()
        assert "queue_share_of_ttft" not in d.evidence


def progress(**changes: Any) -> Progress:
    """An engine 8 requests deep whose series stopped moving ``seconds_without_progress`` ago."""
    base = Progress(
        last_progress_at=40.0,
        seconds_without_progress=60.0,
        running=8.0,
        waiting=0.0,
        checked=("generation_tokens", "prompt_tokens", "iterations", "running", "waiting"),
        last_values={"generation_tokens": 1234.0, "running": 8.0},
        interval_seconds=5.0,
    )
    return dataclasses.replace(base, **changes)


# Signals whose symptoms, taken at face value, would be queue_bound (a frozen queue).
QUEUED: dict[str, Any] = dict(waiting_mean=6.0, ttft_p99=q(9.0), ttft_mean=4.0)


class TestStalled:
    def test_no_progress_with_work_outstanding_is_stalled(self) -> None:
        """A minute without a token or a step, 8 requests running: stalled, with the
        numbers that decided it and how to get a stack dump."""
        d = diagnose(signals(progress=progress()), rules())
        assert d.cause == "stalled" and d.breaches == ("no_progress",)
        assert d.evidence["seconds_without_progress"] == 60.0
        assert d.evidence["stall_after_seconds"] == 30.0
        assert d.evidence["requests_running"] == 8.0
        assert d.evidence["last_generation_tokens"] == 1234.0
        assert "iterations" in str(d.evidence["progress_series_checked"])
        assert "no progress for 60 s" in d.summary and "8 requests running" in d.summary
        assert "py-spy dump" in d.remediation[0]
        assert d.secondary == ()
        # gauges and the step counter hold, no probe: (1 + 1 + 0.5 + 1) / 4
        assert d.confidence == 0.88

    def test_stalled_comes_first(self) -> None:
        """Frozen gauges keep showing a queue; the stall explains it, so it wins."""
        d = diagnose(signals(progress=progress(waiting=6.0), **QUEUED), rules())
        assert d.cause == "stalled" and d.secondary == ()

    def test_not_yet_a_stall_judges_nothing(self) -> None:
        """10 s without progress: too short for a stall, and the gauges are frozen, so the
        queue they show is not judged either (it would fire before the stall could)."""
        d = diagnose(signals(progress=progress(seconds_without_progress=10.0), **QUEUED), rules())
        assert d.cause is None and d.breaches == () and d.held
        assert "no engine progress for 10 s" in d.summary

    def test_the_window_after_a_stall_is_the_stalls(self) -> None:
        """The engine resumed 20 s ago after 60 s without progress: the minute-long TTFTs
        now in the window are the stall's, not a queue's or prefill's."""
        after = progress(
            seconds_without_progress=0.0,
            previous_stall_seconds=60.0,
            previous_stall_ended_seconds_ago=20.0,
        )
        d = diagnose(signals(progress=after, **QUEUED), rules())
        assert d.cause is None and "resumed 20 s ago" in d.summary
        assert not d.held  # clear: the stall is over, and it resolves

    def test_a_short_pause_before_is_no_alibi(self) -> None:
        """A pause shorter than a stall leaves the symptoms to be judged as usual."""
        brief = progress(
            seconds_without_progress=0.0,
            previous_stall_seconds=5.0,
            previous_stall_ended_seconds_ago=20.0,
        )
        d = diagnose(signals(progress=brief, **QUEUED), rules())
        assert d.cause == "queue_bound"

    def test_the_breach_leads_the_alert_by_open_after(self) -> None:
        """With 5 s scrapes and open_after 3 the stall breaches at 20 s, so the alert
        (three breached evaluations later) fires at stall_after_seconds, 30 s."""
        assert stall_breach_seconds(rules(), 5.0, 3) == 20.0
        assert (
            diagnose(
                signals(progress=progress(seconds_without_progress=20.0)), rules(), open_after=3
            ).cause
            == "stalled"
        )
        assert (
            diagnose(
                signals(progress=progress(seconds_without_progress=19.0)), rules(), open_after=3
            ).cause
            is None
        )
        # a one-off verdict (open_after 1) waits the whole 30 s
        assert (
            diagnose(signals(progress=progress(seconds_without_progress=29.0)), rules()).cause
            is None
        )
        # never earlier than half of it, however long the scrape interval
        assert stall_breach_seconds(rules(), 60.0, 5) == 15.0

    def test_an_unanswered_probe_on_an_idle_looking_engine(self) -> None:
        """The gauges say idle, but a one-token probe has had no answer for 35 s while
        nothing moved: the hang the metrics cannot show."""
        idle = progress(
            running=0.0,
            waiting=0.0,
            seconds_without_progress=35.0,
            probe_unanswered_seconds=35.0,
            probe_last_reason="timeout",
        )
        d = diagnose(signals(progress=idle), rules())
        assert d.cause == "stalled"
        assert "probe unanswered for 35 s" in d.summary
        assert d.evidence["probe_last_reason"] == "timeout"
        # the gauges do not show it, the probe and the step counter do: (1 + 0 + 1 + 1) / 4
        assert d.confidence == 0.75

    def test_an_idle_engine_is_healthy(self) -> None:
        d = diagnose(signals(progress=progress(running=0.0, seconds_without_progress=0.0)), rules())
        assert d.cause is None and d.summary == ""
