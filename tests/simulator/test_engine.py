"""The simulator's engine obeys the physics of docs/physics.md.

Tests for daemon/vllm_triage/simulator/engine.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from vllm_triage.simulator import Arrival, Engine, RequestRecord, ServerSpec, Workload, llama_8b

#: The seed table's A10G row with Llama-3.1-8B at 16 bits: ceiling 600/16.06 = 37 tokens/s.
A10G = llama_8b(
    "NVIDIA A10G",
    num_gpu_blocks=4096,
    max_num_batched_tokens=2048,
    max_model_len=16384,
)


def run(spec: ServerSpec, arrivals: list[Arrival], until: float = 3600.0) -> Engine:
    engine = Engine(spec, keep_records=True)
    for arrival in arrivals:
        engine.submit(arrival)
    engine.advance_to(until)
    return engine


def only(engine: Engine) -> RequestRecord:
    assert len(engine.records) == 1
    return engine.records[0]


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


class TestDecode:
    def test_single_stream_lands_just_under_the_bandwidth_ceiling(self) -> None:
        """One stream decodes at bandwidth / weight bytes, less the step overhead and KV reads."""
        record = only(run(A10G, [Arrival(0.0, 16, 401)]))
        rate = 1 / (sum(record.inter_token_s) / len(record.inter_token_s))
        ceiling = A10G.decode_ceiling_tokens_per_s
        assert ceiling == pytest.approx(37.36, abs=0.01)
        assert 0.85 * ceiling < rate < ceiling

    def test_each_step_costs_overhead_plus_weights_plus_kv_over_bandwidth(self) -> None:
        """A decode step reads every weight and the KV of the whole context, nothing else."""
        record = only(run(A10G, [Arrival(0.0, 100, 3)]))
        # The second token feeds token 101: 101 tokens of KV are read besides the weights.
        read = A10G.weight_bytes + A10G.kv_bytes_per_token * 101
        expected = A10G.step_overhead_s + read / (A10G.memory_bandwidth_gb_s * 1e9)
        assert record.inter_token_s[0] == pytest.approx(expected, rel=1e-12)

    def test_quantizing_weights_roughly_doubles_the_single_stream_rate(self) -> None:
        """Half the bytes per token, about twice the tokens per second (docs/physics.md)."""
        int8 = dataclasses.replace(A10G, weight_bytes=A10G.weight_bytes / 2)
        bf16_itl = sum(only(run(A10G, [Arrival(0.0, 16, 101)])).inter_token_s)
        int8_itl = sum(only(run(int8, [Arrival(0.0, 16, 101)])).inter_token_s)
        assert 1.7 < bf16_itl / int8_itl < 2.0

    def test_throughput_grows_with_batch_size_and_so_does_itl_p99(self) -> None:
        """Extra streams are nearly free in bandwidth; the bill arrives in the tail."""
        throughput: list[float] = []
        itl_p99: list[float] = []
        for batch in (1, 8, 64):
            engine = run(A10G, [Arrival(0.0, 128, 256) for _ in range(batch)])
            records = engine.records
            decode_s = max(r.finished_s for r in records) - min(r.first_token_s for r in records)
            throughput.append(sum(r.output_tokens - 1 for r in records) / decode_s)
            itl_p99.append(p99([x for r in records for x in r.inter_token_s]))
        assert throughput[0] < throughput[1] < throughput[2]
        assert throughput[2] > 0.5 * 64 * throughput[0]  # close to linear
        assert itl_p99[0] < itl_p99[1] < itl_p99[2]


class TestPrefill:
    def test_doubling_the_prompt_at_least_doubles_prefill_time(self) -> None:
        """Linear matmul cost plus quadratic attention: 2x the prompt, >= 2x the time."""
        short = only(run(A10G, [Arrival(0.0, 4000, 2)]))
        long = only(run(A10G, [Arrival(0.0, 8000, 2)]))
        assert long.prefill_s >= 2 * short.prefill_s
        assert long.ttft_s >= 2 * short.ttft_s
        assert short.queue_s == 0.0

    def test_a_long_prompt_is_chunked_by_the_step_budget(self) -> None:
        """With chunked prefill, 5000 prompt tokens under a 2048 budget take three steps."""
        engine = run(A10G, [Arrival(0.0, 5000, 1)])
        assert engine.stats.steps == 3
        assert engine.stats.prompt_tokens == 5000

    def test_a_prompt_arriving_mid_stream_stalls_the_other_streams(self) -> None:
        """Prefill interference: the step that carries a big chunk is long for everyone."""
        engine = run(A10G, [Arrival(0.0, 16, 200), Arrival(1.0, 8000, 2)])
        stream = next(r for r in engine.records if r.prompt_tokens == 16)
        assert max(stream.inter_token_s) > 5 * min(stream.inter_token_s)


class TestHang:
    def test_a_hung_engine_freezes_what_a_scrape_sees(self) -> None:
        """Hung at 10 s: no step completes, so gauges and counters stay as they were while
        requests keep arriving; resumed at 70 s, the streams go on after a 60 s gap and
        what arrived meanwhile is served, its TTFT holding the wait."""
        engine = Engine(A10G, keep_records=True)
        for _ in range(4):
            engine.submit(Arrival(0.0, 16, 2000))
        engine.advance_to(10.0)
        engine.hang()
        frozen = (engine.num_running, engine.num_waiting, engine.kv_usage)
        tokens, itl = engine.stats.generation_tokens, engine.stats.itl.count
        engine.submit(Arrival(20.0, 32, 5))
        engine.advance_to(70.0)
        assert engine.hung and frozen == (4, 0, frozen[2]) and frozen[2] > 0
        assert (engine.num_running, engine.num_waiting, engine.kv_usage) == frozen
        assert (engine.stats.generation_tokens, engine.stats.itl.count) == (tokens, itl)
        engine.resume()
        engine.advance_to(90.0)
        assert not engine.hung and engine.stats.generation_tokens > tokens
        late = next(r for r in engine.records if r.prompt_tokens == 32)
        assert late.ttft_s >= 50.0  # arrived at 20 s, first token after the resume at 70 s
        assert engine.stats.itl.sum >= 4 * 60.0  # each stream's one gap spans the hang

    def test_hang_and_resume_are_idempotent(self) -> None:
        engine = Engine(A10G)
        engine.resume()  # not hung: nothing to do
        engine.hang()
        engine.hang()
        engine.advance_to(5.0)
        engine.resume()
        engine.submit(Arrival(6.0, 16, 3))
        engine.advance_to(10.0)
        assert engine.stats.generation_tokens == 3


class TestKVCache:
    def test_kv_usage_climbs_with_context(self) -> None:
        """Every 16 generated tokens take one more block of the pool."""
        engine = Engine(A10G)
        engine.submit(Arrival(0.0, 1000, 3000))
        usage: list[float] = []
        for second in range(1, 60):
            engine.advance_to(float(second))
            usage.append(engine.kv_usage)
        assert usage == sorted(usage)
        assert usage[-1] > usage[0] > 0
        assert usage[0] >= math.ceil(1000 / 16) / A10G.num_gpu_blocks

    def test_a_full_pool_makes_requests_wait_and_preempts(self) -> None:
        """Six 700-token requests in a 1024-token pool: a queue, preemptions, then all finish."""
        tiny = dataclasses.replace(A10G, num_gpu_blocks=64, max_model_len=1024)
        engine = Engine(tiny, keep_records=True)
        for _ in range(6):
            engine.submit(Arrival(0.0, 300, 400))
        waiting: list[int] = []
        usage: list[float] = []
        for second in range(1, 400):
            engine.advance_to(float(second))
            waiting.append(engine.num_waiting)
            usage.append(engine.kv_usage)
        assert max(waiting) >= 4
        assert max(usage) > 0.95
        assert engine.stats.preemptions > 0
        assert len(engine.records) == 6
        assert engine.num_running == engine.num_waiting == 0
        assert engine.kv_usage == 0.0
        stalled = [r for r in engine.records if r.preemptions]
        assert stalled
        # A preempted stream stalls mid-sentence while its cache is recomputed.
        assert all(max(r.inter_token_s) > 3 * min(r.inter_token_s) for r in stalled)

    def test_sequence_cap_queues_requests_with_the_pool_nearly_empty(self) -> None:
        """max_num_seqs, not KV, is what holds them back."""
        capped = dataclasses.replace(A10G, max_num_seqs=2)
        engine = Engine(capped)
        for _ in range(10):
            engine.submit(Arrival(0.0, 100, 50))
        engine.advance_to(0.5)
        assert engine.num_running == 2
        assert engine.num_waiting == 8
        assert engine.kv_usage < 0.01


class TestEngineContract:
    def test_same_inputs_same_timeline(self) -> None:
        """No clock and no hidden randomness: two runs give identical records."""
        load = Workload(arrival_rate_per_s=2.0, prompt_tokens=500, output_tokens=60, seed=7)
        arrivals = list(load.arrivals(0.0, 30.0))
        first = run(A10G, arrivals, until=60.0)
        second = run(A10G, arrivals, until=60.0)
        assert first.records == second.records
        assert len(first.records) == len(arrivals) > 20

    def test_workload_is_poisson_with_bounded_uniform_spread(self) -> None:
        """Mean rate as asked, sizes within mean x [0.75, 1.25], seed-stable."""
        load = Workload(arrival_rate_per_s=5.0, prompt_tokens=400, output_tokens=100, seed=3)
        arrivals = list(load.arrivals(0.0, 400.0))
        assert 1800 < len(arrivals) < 2200
        assert all(300 <= a.prompt_tokens <= 500 for a in arrivals)
        assert [a.at_s for a in arrivals] == sorted(a.at_s for a in arrivals)
        assert arrivals == list(load.arrivals(0.0, 400.0))
        assert arrivals != list(dataclasses.replace(load, seed=4).arrivals(0.0, 400.0))

    def test_data_parallel_parts_split_a_burst(self) -> None:
        """Each engine's part gets every n-th burst request."""
        load = Workload(burst=10, prompt_tokens=10, output_tokens=10, spread=0.0)
        parts = [list(load.arrivals(0.0, 1.0, part=p, parts=3)) for p in range(3)]
        assert [len(p) for p in parts] == [4, 3, 3]

    def test_lognormal_sizes_keep_their_mean(self) -> None:
        load = Workload(
            arrival_rate_per_s=20.0, prompt_tokens=1000, spread=0.5, distribution="lognormal"
        )
        prompts = [a.prompt_tokens for a in load.arrivals(0.0, 500.0)]
        assert sum(prompts) / len(prompts) == pytest.approx(1000, rel=0.05)
        assert max(prompts) > 1500

    def test_arrivals_must_come_in_time_order(self) -> None:
        engine = Engine(A10G)
        engine.submit(Arrival(5.0, 10, 10))
        with pytest.raises(ValueError, match="time order"):
            engine.submit(Arrival(4.0, 10, 10))
        engine.advance_to(10.0)
        with pytest.raises(ValueError, match="time runs forward"):
            engine.advance_to(9.0)

    def test_over_long_requests_are_cut_to_max_model_len(self) -> None:
        engine = run(dataclasses.replace(A10G, max_model_len=1000), [Arrival(0.0, 5000, 5000)])
        record = only(engine)
        assert record.prompt_tokens == 999
        assert record.output_tokens == 1

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            ({"num_gpu_blocks": 10}, "at least one max_model_len"),
            ({"max_num_batched_tokens": 8}, "max_num_seqs"),
            ({"memory_bandwidth_gb_s": 0.0}, "must be > 0"),
            ({"kv_watermark": 1.0}, "kv_watermark"),
        ],
        ids=["pool-too-small", "budget-below-seqs", "no-bandwidth", "watermark"],
    )
    def test_spec_refuses_what_vllm_refuses(self, change: dict[str, Any], message: str) -> None:
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(A10G, **change)

    def test_reconfigure_shrinks_the_pool_and_aborts_what_no_longer_fits(self) -> None:
        """Swapping the server under load preempts to fit and aborts over-long requests."""
        engine = Engine(A10G)
        for _ in range(4):
            engine.submit(Arrival(0.0, 2000, 2000))
        engine.submit(Arrival(0.0, 9000, 100))
        engine.advance_to(5.0)
        assert engine.kv_usage > 0.2
        engine.reconfigure(dataclasses.replace(A10G, num_gpu_blocks=300, max_model_len=4096))
        engine.advance_to(30.0)  # the swap waits for the step in flight (a long prefill)
        assert engine.stats.finished["abort"] == 1
        assert engine.stats.preemptions > 0
        assert engine.kv_usage <= 1.0
        engine.advance_to(2000.0)
        assert engine.stats.finished["length"] == 4
        assert engine.kv_usage == 0.0


class TestSpeculativeDecoding:
    """Chain drafts: k draft forwards per step, 1 + k tokens verified per request, the
    accepted drafts plus one emitted at once (one ITL sample)."""

    DRAFTING = dataclasses.replace(
        A10G, num_speculative_tokens=3, draft_weight_bytes=2e9, draft_parameters=1e9
    )

    def test_the_step_adds_k_draft_forwards_and_verifies_k_more_tokens(self) -> None:
        """Nothing accepted: one token a step, each step k draft reads longer."""
        record = only(run(self.DRAFTING, [Arrival(0.0, 100, 10)]))
        assert len(record.inter_token_s) == 9  # tau = 1: every token its own step
        # Token 101 and its 3 drafts: KV of 104 positions, then 3 draft forwards.
        bandwidth = A10G.memory_bandwidth_gb_s * 1e9
        target = (A10G.weight_bytes + A10G.kv_bytes_per_token * 104) / bandwidth
        expected = A10G.step_overhead_s + target + 3 * 2e9 / bandwidth
        assert record.inter_token_s[0] == pytest.approx(expected, rel=1e-12)

    def test_accepted_drafts_come_out_together(self) -> None:
        """With acceptance 0.8 a step emits (1 - 0.8^4) / 0.2 = 2.95 tokens on average."""
        spec = dataclasses.replace(self.DRAFTING, draft_acceptance=0.8)
        engine = run(spec, [Arrival(0.0, 16, 3001)])
        record = only(engine)
        per_step = 3000 / len(record.inter_token_s)
        assert per_step == pytest.approx((1 - 0.8**4) / 0.2, rel=0.05)
        stats = engine.stats
        assert stats.spec_drafts == len(record.inter_token_s)
        assert 1 + stats.spec_accepted_tokens / stats.spec_drafts == pytest.approx(per_step, 0.01)

    def test_refuses_impossible_drafts(self) -> None:
        with pytest.raises(ValueError, match="draft_acceptance"):
            dataclasses.replace(self.DRAFTING, draft_acceptance=1.0)


class TestMixtureOfExperts:
    #: 1 GB read every step, 64 GB of routed experts, 8 of 128 per token.
    MOE = dataclasses.replace(
        A10G,
        weight_bytes=1e9,
        parameters=3e9,
        routed_expert_bytes=64e9,
        num_experts=128,
        experts_per_token=8,
    )

    def test_one_token_reads_its_k_experts(self) -> None:
        record = only(run(self.MOE, [Arrival(0.0, 100, 3)]))
        read = 1e9 + 64e9 * 8 / 128 + A10G.kv_bytes_per_token * 101
        expected = A10G.step_overhead_s + read / (A10G.memory_bandwidth_gb_s * 1e9)
        assert record.inter_token_s[0] == pytest.approx(expected, rel=1e-12)

    def test_a_batch_reads_the_experts_its_tokens_touch(self) -> None:
        """32 tokens of 8 random experts each touch 1 - (1 - 8/128)^32 = 87 % of them."""
        engine = Engine(self.MOE)
        reads = [engine._experts_read(32) for _ in range(400)]
        share = sum(reads) / len(reads) / 64e9
        assert share == pytest.approx(1 - (1 - 8 / 128) ** 32, abs=0.01)
        assert engine._experts_read(1024) == 64e9

    def test_refuses_experts_without_routing(self) -> None:
        with pytest.raises(ValueError, match="experts_per_token"):
            dataclasses.replace(self.MOE, experts_per_token=0)


def test_the_engine_keeps_its_floor_apart_from_overhead() -> None:
    """busy time = the floors + one overhead per step; a lone stream's floor / step."""
    engine = run(A10G, [Arrival(0.0, 16, 201)])
    stats = engine.stats
    assert stats.busy_s == pytest.approx(stats.floor_s + stats.steps * A10G.step_overhead_s)
    assert 0.9 < stats.decode_floor_s / stats.decode_step_s < 1.0
