"""Tests for the runtime specs (``daemon/vllm_triage/core/runtime.py``, ``rules/runtimes/``)
and the one parser reading every engine's body: each engine's fixture (made by its own
metrics code, tests/fixtures/runtimes/SOURCES.md) is recognised as its engine and read
exactly as prometheus_client reads it through the spec; a named engine the body
contradicts, a JSON body and a body of no supported engine are errors that say so."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.core.model import Snapshot
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.core.runtime import RuntimeTable, spec_from_document
from vllm_triage.errors import ConfigError, ParseError

from support.captures import fixture_text, reference_series, snapshot_models
from support.parsing import RUNTIMES, parse_snapshot
from support.paths import RUNTIME_FIXTURES
from support.rulebooks import read_bundled, runtime_table

#: Each fixture, its engine, and the format it comes in.
FIXTURES = {
    "sglang/sglang-0.5.23.txt": ("sglang", "text"),
    "sglang/sglang-0.5.23-dp2-eagle.txt": ("sglang", "text"),
    "lmdeploy/lmdeploy-0.18.0.txt": ("lmdeploy", "text"),
    "trtllm/trtllm-serve.txt": ("trtllm", "text"),
    "vllm-rust/vllm-0.34.0-rust-frontend.txt": ("vllm", "openmetrics"),
}


def body(name: str) -> str:
    return (RUNTIME_FIXTURES / name).read_text(encoding="utf-8")


def read(name: str, **options: Any) -> Snapshot:
    return parse_snapshot(body(name), 1.0, **options)


class TestFixtures:
    @pytest.mark.parametrize(("name", "engine"), FIXTURES.items(), ids=list(FIXTURES))
    def test_each_engine_is_recognised_from_its_body(
        self, name: str, engine: tuple[str, str]
    ) -> None:
        snap = read(name)
        assert (snap.runtime.name, snap.format) == engine
        assert snap.problems == ()
        assert snap.models

    @pytest.mark.parametrize("name", FIXTURES, ids=list(FIXTURES))
    def test_every_value_is_what_prometheus_client_reads(self, name: str) -> None:
        """The fast parser and prometheus_client, read through the spec as written,
        agree on every field of every model."""
        runtime, fmt = FIXTURES[name]
        text = body(name)
        ref = reference_series(text, RUNTIMES.spec(runtime), openmetrics=fmt == "openmetrics")
        assert ref
        assert snapshot_models(read(name)) == ref

    @pytest.mark.parametrize("name", FIXTURES, ids=list(FIXTURES))
    def test_the_specs_buckets_and_help_are_the_engines(self, name: str) -> None:
        """Where a spec says a family's bucket bounds and help text (the simulator speaks
        them), they are what the engine's own code wrote."""
        runtime, fmt = FIXTURES[name]
        parse = om_families if fmt == "openmetrics" else text_string_to_metric_families
        found = {f.name: f for f in parse(body(name))}
        spec = RUNTIMES.spec(runtime)
        checked = 0
        for fam in spec.families:
            family = found.get(spec.prefixes[0] + fam.name.removesuffix("_total"))
            if family is None:
                continue
            if fam.help:
                assert family.documentation == fam.help, fam.name
                checked += 1
            if fam.buckets:
                bounds = sorted(
                    {float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")}
                )
                assert tuple(bounds[:-1]) == fam.buckets, fam.name  # +Inf last
                checked += 1
        assert checked or runtime == "vllm"


class TestSglang:
    """SGLang needs semantics, not only names."""

    def test_kv_is_the_full_pool_not_the_max_of_pools(self) -> None:
        text = body("sglang/sglang-0.5.23.txt").replace(
            'sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",'
            'pp_rank="0",tp_rank="0"} 0.71',
            'sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",'
            'pp_rank="0",tp_rank="0"} 0.99',
        )
        assert "} 0.99" in text  # the swa/mamba max is full now, the KV pool is not
        m = parse_snapshot(text, 1.0).models["Qwen/Qwen3-8B"]
        assert m.kv_usage == pytest.approx(0.71)

    def test_tokens_are_the_real_time_ones_and_passes_are_steps(self) -> None:
        """prompt_tokens_total and generation_tokens_total count finished requests; the
        tokens computed as the engine steps are realtime_tokens_total{mode}, and every
        forward pass (decode and prefill batches) is a step."""
        snap = read("sglang/sglang-0.5.23.txt")
        m = snap.models["Qwen/Qwen3-8B"]
        assert (m.prompt_tokens, m.generation_tokens) == (48_000, 57_000)
        assert m.iterations == 2400 + 120
        assert m.requests_finished == 40
        assert m.preemptions == 1  # retracted requests
        assert snap.kv_pool is not None and snap.kv_pool.tokens == 412_000
        assert m.tokens_per_step == 0.0  # no speculative decoding: SGLang reads 0

    def test_data_parallel_ranks_are_dp_rank(self) -> None:
        snap = read("sglang/sglang-0.5.23-dp2-eagle.txt")
        m = snap.models["Qwen/Qwen3-8B"]
        assert m.engines == 2 and m.running == 31 + 29
        assert set(m.per_engine) == {"0", "1"}
        assert m.per_engine["1"]["waiting"] == 1 and m.per_engine["0"]["iterations"] == 1155
        assert m.tokens_per_step == pytest.approx(2.61)
        assert snap.kv_pool is not None and snap.kv_pool.tokens == 2 * 412_000

    def test_copies_of_one_scheduler_are_read_once(self) -> None:
        """With metrics from every scheduler, each tensor-parallel rank repeats its
        scheduler's series under its own tp_rank: read once, never added up."""
        text = body("sglang/sglang-0.5.23.txt")
        copies = "\n".join(
            line.replace('tp_rank="0"', 'tp_rank="1"')
            for line in text.splitlines()
            if 'tp_rank="0"' in line and not line.startswith("#")
        )
        snap = parse_snapshot(text + copies + "\n", 1.0)
        assert snapshot_models(snap) == snapshot_models(read("sglang/sglang-0.5.23.txt"))


class TestTrtllmAndLmdeploy:
    def test_trtllm_steps_and_pool(self) -> None:
        snap = read("trtllm/trtllm-serve.txt")
        m = snap.models["undefined"]  # trtllm-serve labels every series model_name="undefined"
        assert m.step_seconds == pytest.approx(0.0172)
        assert m.tokens_per_step == 1.0
        assert m.requests_finished == 40
        assert m.iterations is None and m.preemptions is None
        assert snap.kv_pool is not None and snap.kv_pool.tokens == 6144 * 32

    def test_lmdeploy_reads_no_step_heartbeat_nor_preemptions(self) -> None:
        """Its iteration_tokens_total is per request output, not per step: not read."""
        m = read("lmdeploy/lmdeploy-0.18.0.txt").models["internlm/internlm3-8b-instruct"]
        assert m.iterations is None and m.iteration_tokens is None
        assert m.preemptions is None
        assert m.kv_usage == pytest.approx(0.58)
        assert m.itl is not None and m.itl.count == 10174


class TestRustFrontend:
    def test_openmetrics_whatever_was_asked_and_the_render_family_unknown(self) -> None:
        snap = read("vllm-rust/vllm-0.34.0-rust-frontend.txt")
        assert snap.format == "openmetrics" and snap.runtime.variant == "Rust frontend"
        assert snap.runtime.shown == "vLLM (Rust frontend)"
        assert "render_time" in snap.runtime.absent
        assert snap.runtime.limited("render_time") is not None
        m = snap.models["meta-llama/Llama-3.1-8B-Instruct"]
        assert m.render_time is None and m.generation_tokens is not None

    def test_exemplars_and_second_timestamps_are_read(self) -> None:
        series = 'vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct",'
        text = body("vllm-rust/vllm-0.34.0-rust-frontend.txt").replace(
            series + 'engine="0"} 24', series + 'engine="0"} 24 1796000000.5'
        )
        lines = text.splitlines()
        i = next(
            n for n, line in enumerate(lines) if line.startswith("vllm:prefix_cache_hits_total")
        )
        lines[i] += ' # {trace_id="abc"} 1.0 1796000000.25'
        snap = parse_snapshot("\n".join(lines) + "\n", 1.0)
        assert snap.models["meta-llama/Llama-3.1-8B-Instruct"].running == 24


class TestNamedAndUnknown:
    def test_a_named_engine_the_body_contradicts_is_an_error(self) -> None:
        with pytest.raises(
            ParseError, match=r"settings name the runtime vLLM, but its metrics are SGLang"
        ):
            read("sglang/sglang-0.5.23.txt", named="vllm")

    def test_a_named_engine_the_body_agrees_with(self) -> None:
        assert read("sglang/sglang-0.5.23.txt", named="sglang").runtime.name == "sglang"

    def test_an_unknown_name_is_a_config_error(self) -> None:
        with pytest.raises(ConfigError, match="runtime 'tgi' is not one vllm-triage knows"):
            SnapshotParser(RUNTIMES, named="tgi")

    def test_no_supported_engine_says_what_the_body_shows(self) -> None:
        tgi = "\n".join(f'tgi_request_count{{i="{i}"}} 1' for i in range(3)) + "\nprocess_cpu 1\n"
        with pytest.raises(ParseError, match=r"not a supported engine.*tgi_\* \(3 samples\)"):
            parse_snapshot(tgi, 1.0)
        with pytest.raises(ParseError, match=r"no family of TensorRT-LLM found"):
            parse_snapshot(tgi, 1.0, named="trtllm")

    def test_json_at_trtllm_serves_metrics_path_points_to_the_prometheus_one(self) -> None:
        with pytest.raises(ParseError, match=r"JSON.*/prometheus/metrics"):
            parse_snapshot('[{"iter": 3, "iterLatencyMS": 16.2}]', 1.0)

    def test_a_second_engines_families_in_one_body_are_counted_not_read(self) -> None:
        vllm = fixture_text("kvwarden-vllm-0.19.1-v1.txt")
        sglang = body("sglang/sglang-0.5.23.txt")
        snap = parse_snapshot(vllm + sglang, 1.0)
        assert snap.runtime.name == "vllm"
        assert any("SGLang's families ignored" in p for p in snap.problems)


class TestSpecs:
    def test_the_bundled_table(self) -> None:
        table = runtime_table()
        assert table.names == ("vllm", "sglang", "lmdeploy", "trtllm")
        assert table.spec("trtllm").metrics_path == "/prometheus/metrics"
        assert table.spec("sglang").runtime.itl_measures == "token"
        assert "generation_tokens" not in table.spec("trtllm").runtime.moves_with_steps

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            ({"families": {"running": {"type": "counter", "name": "x"}}}, "running is a gauge"),
            ({"families": {"nonsense": {"type": "gauge", "name": "x"}}}, "not a field"),
            ({"itl_measures": "tokens"}, "step, token or request_mean"),
            ({"judges": ["slow"]}, "causes are"),
            ({"prefixes": []}, "at least one prefix"),
            ({"colour": "red"}, "unknown keys"),
            (
                {"families": {"ttft": {"type": "histogram", "name": "x", "buckets": [2, 1]}}},
                "increase",
            ),
            ({"limits": [{"what": "x", "says": "y", "affects": ["slow"]}]}, "not causes"),
        ],
        ids=[
            "counter-for-a-gauge",
            "unknown-field",
            "itl-measure",
            "unknown-cause",
            "no-prefix",
            "unknown-key",
            "buckets-decrease",
            "limit-affects-no-cause",
        ],
    )
    def test_a_wrong_spec_says_what_and_where(self, change: dict[str, Any], message: str) -> None:
        doc = {**read_bundled("runtimes/sglang.yaml"), **change}
        with pytest.raises(ConfigError, match=message) as err:
            spec_from_document(doc, source="rules/runtimes/mine.yaml")
        assert "rules/runtimes/mine.yaml" in str(err.value)

    def test_two_specs_claiming_one_prefix_are_refused(self) -> None:
        doc = read_bundled("runtimes/sglang.yaml")
        with pytest.raises(ConfigError, match="both claim the prefix 'sglang:'"):
            RuntimeTable.of([("a.yaml", doc), ("b.yaml", {**doc, "name": "other"})])
