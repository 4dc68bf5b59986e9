"""Tests for daemon/vllm_triage/core/parse.py: exposition text -> Snapshot, for every vLLM naming
era."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_triage.core.parse import SnapshotParser
from vllm_triage.errors import ParseError

from support.captures import fixture_text, reference_models, snapshot_models
from support.parsing import parse_snapshot
from support.rulebooks import runtime_table

KVWARDEN = "kvwarden-vllm-0.19.1-v1.txt"
KUBEAI = "kubeai-vllm-0.5.x-v0.txt"
DATADOG = "datadog-vllm-0.4.3-v0.txt"
AIBRIX = "aibrix-docs-vllm-0.7.x-v0-excerpt.txt"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def with_engine(text: str, engine: str, scale: float) -> str:
    """The vllm: samples of a V1 payload as another data-parallel engine would expose them."""
    out = []
    for line in text.splitlines():
        if line.startswith("vllm:") and 'engine="0"' in line:
            name_labels, value = line.rsplit(" ", 1)
            if "cache_config_info" not in name_labels and "_created" not in name_labels:
                value = repr(float(value) * scale)
            out.append(name_labels.replace('engine="0"', f'engine="{engine}"') + " " + value)
    return "\n".join(out)


#: The aibrix excerpt ends inside vllm:iteration_tokens_total (a documentation excerpt):
#: that histogram has no +Inf bucket, so it is left out and said.
FIXTURE_PROBLEMS = {
    "aibrix-docs-vllm-0.7.x-v0-excerpt.txt": (
        "Qwen/Qwen2.5-Coder-1.5B-Instruct: iteration_tokens: no +Inf bucket (truncated "
        "histogram); left out",
    ),
}


class TestFixtures:
    def test_every_fixture_matches_prometheus_client(self, vllm_fixture: Path) -> None:
        """The fast reader yields exactly the values prometheus_client reads from each capture."""
        text = vllm_fixture.read_text(encoding="utf-8")
        snap = parse_snapshot(text, at=1.0)
        assert snapshot_models(snap) == reference_models(text)
        assert snap.problems == FIXTURE_PROBLEMS.get(vllm_fixture.name, ())

    @pytest.mark.parametrize(
        ("name", "era", "models"),
        [
            pytest.param(KVWARDEN, "v1", [LLAMA], id="kvwarden-0.19.1"),
            pytest.param(
                KUBEAI,
                "v0",
                ["neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", "other/OTHER"],
                id="kubeai-0.5",
            ),
            pytest.param(DATADOG, "v0", ["facebook/opt-125m"], id="datadog-0.4.3"),
            pytest.param(AIBRIX, "v0", ["Qwen/Qwen2.5-Coder-1.5B-Instruct"], id="aibrix-excerpt"),
        ],
    )
    def test_era_and_models(self, name: str, era: str, models: list[str]) -> None:
        """Each capture is recognised as its naming era, with its models kept apart."""
        snap = parse_snapshot(fixture_text(name), at=0.0)
        assert snap.era == era
        assert sorted(snap.models) == models

    def test_kvwarden_values(self) -> None:
        """Values read from vLLM 0.19.1 match the file: TTFT, ITL, queue time, KV pool."""
        m = parse_snapshot(fixture_text(KVWARDEN), at=0.0).models[LLAMA]
        assert m.ttft is not None and m.itl is not None and m.queue_time is not None
        assert m.ttft.count == 917.0
        assert m.ttft.sum == pytest.approx(234.6708381175995)
        assert m.ttft.bounds[:4] == (0.001, 0.005, 0.01, 0.02)
        assert m.ttft.cumulative[3:5] == (16.0, 732.0)
        assert math.isinf(m.ttft.bounds[-1])
        assert m.itl.count == 17571.0
        assert m.itl.cumulative[0] == 496.0
        assert m.prompt_tokens == 115898.0
        assert m.generation_tokens == 18488.0
        assert m.requests_finished == 917.0  # summed over finished_reason
        assert m.preemptions == 0.0
        assert (m.running, m.waiting, m.kv_usage) == (0.0, 0.0, 0.0)
        assert m.prefill_time is not None and m.decode_time is not None
        assert m.prompt_length is not None and m.prompt_length.sum == 115898.0

    def test_kvwarden_pool_from_cache_config_info(self) -> None:
        """The KV pool is num_gpu_blocks x block_size from vllm:cache_config_info."""
        snap = parse_snapshot(fixture_text(KVWARDEN), at=0.0)
        assert snap.kv_pool is not None
        assert (snap.kv_pool.block_size, snap.kv_pool.num_gpu_blocks) == (16, 7975)
        assert snap.kv_pool.tokens == 127_600

    def test_kubeai_v0_values(self) -> None:
        """V0 names feed the same fields: gpu_cache_usage_perc and time_per_output_token."""
        snap = parse_snapshot(fixture_text(KUBEAI), at=0.0)
        m = snap.models["neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8"]
        assert (m.running, m.waiting) == (3.0, 2.0)
        assert m.kv_usage == pytest.approx(0.0026235242675994863)
        assert m.itl is not None and m.itl.count == 2537.0
        assert m.itl.sum == pytest.approx(98.35070300102234)
        assert m.queue_time is None  # V0 had no queue-time histogram
        assert snap.models["other/OTHER"].waiting == 3.0
        assert snap.kv_pool is not None and snap.kv_pool.num_gpu_blocks == 4574

    def test_datadog_without_trailing_newline(self) -> None:
        """A body whose last line has no newline (vLLM 0.4.3 capture) parses whole."""
        text = fixture_text(DATADOG)
        assert not text.endswith("\n")
        m = parse_snapshot(text, at=0.0).models["facebook/opt-125m"]
        assert m.ttft is not None and m.ttft.count == 1.0
        assert m.itl is not None and m.itl.count == 6.0

    def test_aibrix_excerpt_without_latency(self) -> None:
        """A payload cut inside a family we do not read still gives the gauges it has."""
        m = parse_snapshot(fixture_text(AIBRIX), at=0.0).models["Qwen/Qwen2.5-Coder-1.5B-Instruct"]
        assert m.ttft is None and m.itl is None
        assert m.kv_usage == 0.0 and m.running == 0.0


class TestNamingEras:
    def test_transitional_prefers_new_names(self) -> None:
        """When old and new names are both exposed (0.9-0.14), the new ones are read."""
        text = fixture_text(KVWARDEN) + (
            f'\nvllm:gpu_cache_usage_perc{{engine="0",model_name="{LLAMA}"}} 0.77\n'
            "vllm:time_per_output_token_seconds_bucket"
            f'{{engine="0",le="+Inf",model_name="{LLAMA}"}} 5.0\n'
            f'vllm:time_per_output_token_seconds_count{{engine="0",model_name="{LLAMA}"}} 5.0\n'
            f'vllm:time_per_output_token_seconds_sum{{engine="0",model_name="{LLAMA}"}} 1.0\n'
        )
        snap = parse_snapshot(text, at=0.0)
        m = snap.models[LLAMA]
        assert snap.era == "transitional"
        assert m.kv_usage == 0.0
        assert m.itl is not None and m.itl.count == 17571.0

    def test_ray_prefix(self) -> None:
        """Ray Serve's ray_vllm: prefix reads the same values as vllm:."""
        text = fixture_text(KVWARDEN)
        ray = parse_snapshot(text.replace("vllm:", "ray_vllm:"), at=0.0)
        plain = parse_snapshot(text, at=0.0)
        assert ray.prefix == "ray_vllm:"
        assert snapshot_models(ray) == snapshot_models(plain)

    def test_created_samples_are_skipped(self) -> None:
        """A _created sample never counts as an observation, whatever its value."""
        text = fixture_text(KVWARDEN)
        assert "vllm:time_to_first_token_seconds_created" in text
        m = parse_snapshot(text, at=0.0).models[LLAMA]
        assert m.ttft is not None and m.ttft.count == 917.0

    def test_engines_are_summed_bucket_by_bucket(self) -> None:
        """Data-parallel engines merge by summing counters and buckets, KV usage by mean/max."""
        base = fixture_text(KVWARDEN)
        two = (
            base.replace(
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="{LLAMA}"}} 0.0',
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="{LLAMA}"}} 0.2',
            )
            + "\n"
            + with_engine(base, "1", 3.0).replace(
                f'vllm:kv_cache_usage_perc{{engine="1",model_name="{LLAMA}"}} 0.0',
                f'vllm:kv_cache_usage_perc{{engine="1",model_name="{LLAMA}"}} 0.6',
            )
        )
        snap = parse_snapshot(two, at=0.0)
        one = parse_snapshot(base, at=0.0).models[LLAMA]
        m = snap.models[LLAMA]
        assert m.engines == 2
        assert m.ttft is not None and one.ttft is not None
        assert m.ttft.count == 4 * one.ttft.count
        assert m.ttft.cumulative == tuple(4 * c for c in one.ttft.cumulative)
        assert m.kv_usage == pytest.approx(0.4)
        assert m.kv_usage_max == pytest.approx(0.6)
        assert snap.kv_pool is not None and snap.kv_pool.num_gpu_blocks == 2 * 7975
        assert snapshot_models(snap) == reference_models(two)

    def test_bucket_bounds_come_from_the_payload(self) -> None:
        """Custom bucket bounds are read, not assumed."""
        text = (
            'vllm:time_to_first_token_seconds_bucket{le="0.3",model_name="m"} 1\n'
            'vllm:time_to_first_token_seconds_bucket{le="7.0",model_name="m"} 4\n'
            'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 5\n'
            'vllm:time_to_first_token_seconds_count{model_name="m"} 5\n'
            'vllm:time_to_first_token_seconds_sum{model_name="m"} 12.5\n'
        )
        h = parse_snapshot(text, at=0.0).models["m"].ttft
        assert h is not None
        assert h.bounds == (0.3, 7.0, math.inf)
        assert h.cumulative == (1.0, 4.0, 5.0)


class TestBadInput:
    @pytest.mark.parametrize(
        ("body", "message"),
        [
            pytest.param("", "empty body", id="empty"),
            pytest.param("  \n\n", "empty body", id="blank"),
            pytest.param(
                "<html><body>502 Bad Gateway</body></html>", "not a valid sample line", id="html"
            ),
            pytest.param('{"error": "not found"}', "the body is JSON", id="json"),
            pytest.param(
                "# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.21\n",
                r"not a supported engine: no family of vLLM, SGLang, LMDeploy or TensorRT-LLM "
                r"found \(it shows node_\* \(1 samples\)\)",
                id="not-vllm",
            ),
            pytest.param(
                'vllm:num_requests_running{model_name="m"} 1\nthis is not metrics\n',
                "not a valid sample line",
                id="garbage-line",
            ),
            pytest.param(
                'vllm:num_requests_running{model_name="m"} abc\n', "not a number", id="bad-value"
            ),
            pytest.param(
                'vllm:num_requests_running{model_name="m} 1\n', "label", id="unclosed-quote"
            ),
            pytest.param(
                'vllm:num_requests_running{model_name="m"} 1\n'
                'vllm:num_requests_running{model_name="m"} 2\n',
                "duplicate series",
                id="duplicate",
            ),
            pytest.param('vllm:num_requests_running{model_name="m"}\n', "value", id="no-value"),
        ],
    )
    def test_unreadable_bodies_raise_parse_error(self, body: str, message: str) -> None:
        """Unreadable input is a ParseError that says what is wrong, never another exception."""
        with pytest.raises(ParseError, match=message):
            parse_snapshot(body, at=0.0)

    def test_binary_garbage(self) -> None:
        """A body that is not UTF-8 is refused as such."""
        with pytest.raises(ParseError, match="not UTF-8"):
            SnapshotParser(runtime_table()).parse_bytes(b"\xff\xfe\x00\x81garbage", at=0.0)

    def test_truncated_inside_a_label_set(self) -> None:
        """A body cut in the middle of a line (a dropped connection) is refused."""
        text = fixture_text(KVWARDEN)
        cut = text.index('vllm:inter_token_latency_seconds_bucket{engine="0",le="0.4"') + 45
        with pytest.raises(ParseError):
            parse_snapshot(text[:cut], at=0.0)

    def test_every_truncation_is_a_snapshot_or_a_parse_error(self) -> None:
        """Cutting a real payload anywhere never raises anything but ParseError."""
        text = fixture_text(KVWARDEN)
        parser = SnapshotParser(runtime_table())
        outcomes = {"snapshot": 0, "error": 0}
        for cut in range(1, len(text), 97):
            try:
                parser.parse(text[:cut], at=0.0)
                outcomes["snapshot"] += 1
            except ParseError:
                outcomes["error"] += 1
        assert outcomes["error"] > 0 and outcomes["snapshot"] > 0

    def test_histogram_without_inf_bucket_is_a_problem_not_a_crash(self) -> None:
        """A histogram that lost its +Inf bucket is left out and reported; the rest is kept."""
        text = re.sub(
            r'vllm:time_to_first_token_seconds_bucket\{engine="0",le="\+Inf".*\n',
            "",
            fixture_text(KVWARDEN),
        )
        snap = parse_snapshot(text, at=0.0)
        m = snap.models[LLAMA]
        assert m.ttft is None
        assert m.itl is not None
        assert any("ttft" in p and "+Inf" in p for p in snap.problems)

    def test_nan_gauge_is_a_problem(self) -> None:
        """A NaN gauge is left out and reported, not averaged into the window."""
        text = (
            'vllm:kv_cache_usage_perc{model_name="m"} NaN\n'
            'vllm:num_requests_running{model_name="m"} 2\n'
        )
        snap = parse_snapshot(text, at=0.0)
        assert snap.models["m"].kv_usage is None
        assert snap.models["m"].running == 2.0
        assert any("kv_usage" in p for p in snap.problems)

    def test_decreasing_buckets_are_a_problem(self) -> None:
        """Buckets that decrease with le are inconsistent; the histogram is left out."""
        text = (
            'vllm:time_to_first_token_seconds_bucket{le="1",model_name="m"} 5\n'
            'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 3\n'
            'vllm:time_to_first_token_seconds_count{model_name="m"} 3\n'
            'vllm:time_to_first_token_seconds_sum{model_name="m"} 1\n'
        )
        snap = parse_snapshot(text, at=0.0)
        assert snap.models["m"].ttft is None
        assert any("decrease" in p for p in snap.problems)

    @pytest.mark.parametrize(
        ("count", "total"),
        [("3", "-1"), ("3", "NaN"), ("3", "+Inf"), ("-3", "1")],
        ids=["negative-sum", "nan-sum", "infinite-sum", "negative-count"],
    )
    def test_a_negative_or_non_numeric_sum_or_count_is_a_problem(
        self, count: str, total: str
    ) -> None:
        """Durations and token counts are never negative: a histogram whose sum or count
        says otherwise is left out and said (read as the sum since a restart, it gave a
        negative mean), the rest of the scrape kept."""
        text = (
            'vllm:inter_token_latency_seconds_bucket{le="1",model_name="m"} 3\n'
            'vllm:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 3\n'
            f'vllm:inter_token_latency_seconds_count{{model_name="m"}} {count}\n'
            f'vllm:inter_token_latency_seconds_sum{{model_name="m"}} {total}\n'
            'vllm:num_requests_running{model_name="m"} 2\n'
        )
        snap = parse_snapshot(text, at=0.0)
        assert snap.models["m"].itl is None
        assert snap.models["m"].running == 2.0
        assert any("itl" in p and "left out" in p for p in snap.problems), snap.problems

    def test_label_escapes(self) -> None:
        """Escaped quotes and backslashes in label values are unescaped as the format says."""
        text = 'vllm:num_requests_running{model_name="a\\"b\\\\c"} 1\n'
        assert list(parse_snapshot(text, at=0.0).models) == ['a"b\\c']


class TestParserCache:
    def test_cache_is_bounded_and_changes_nothing(self) -> None:
        """The label-set memo never changes a result, and stays within its bound."""
        parser = SnapshotParser(runtime_table(), max_cached_label_sets=5)
        text = fixture_text(KVWARDEN)
        first = snapshot_models(parser.parse(text, at=0.0))
        second = snapshot_models(parser.parse(text, at=1.0))
        assert first == second == snapshot_models(parse_snapshot(text, at=0.0))
        assert len(parser._labels) <= 5


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=400))
def test_any_text_gives_a_snapshot_or_a_parse_error(text: str) -> None:
    """Whatever the text, the parser returns a Snapshot or raises ParseError."""
    try:
        snap = parse_snapshot(text, at=0.0)
    except ParseError as exc:
        assert str(exc)  # always a message to show
    else:
        assert snap.at == 0.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "vllm:num_requests_running",
                    "vllm:kv_cache_usage_perc",
                    "vllm:num_preemptions_total",
                ]
            ),
            st.sampled_from(["a", "b", "c/d"]),
            st.sampled_from(["0", "1"]),
            st.floats(allow_nan=True, allow_infinity=True),
        ),
        max_size=12,
    )
)
def test_generated_payloads_match_prometheus_client(
    rows: list[tuple[str, str, str, float]],
) -> None:
    """For generated gauge/counter payloads, our values equal the reference reader's."""
    seen: set[tuple[str, str, str]] = set()
    lines = []
    for name, model, engine, value in rows:
        if (name, model, engine) in seen:
            continue
        seen.add((name, model, engine))
        lines.append(f'{name}{{engine="{engine}",model_name="{model}"}} {value!r}')
    if not lines:
        return
    text = "\n".join(lines) + "\n"
    snap = parse_snapshot(text, at=0.0)
    ours = snapshot_models(snap)
    ref = reference_models(text)
    field_of = {
        "vllm:num_requests_running": "running",
        "vllm:kv_cache_usage_perc": "kv_usage",
        "vllm:num_preemptions_total": "preemptions",
    }
    values: dict[tuple[str, str], list[float]] = {}
    for line in lines:
        name_labels, raw = line.rsplit(" ", 1)
        name = name_labels.split("{")[0]
        model = name_labels.split('model_name="')[1].split('"')[0]
        values.setdefault((model, field_of[name]), []).append(float(raw))
    for (model, field), vs in values.items():
        usable = all(math.isfinite(v) and v >= 0 for v in vs)
        if usable:
            assert ours[model][field] == ref[model][field]
        else:
            assert field not in ours.get(model, {})
            assert any(field in p for p in snap.problems)
