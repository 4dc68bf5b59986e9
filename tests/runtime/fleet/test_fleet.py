"""Fleet mode (daemon/vllm_triage/fleet/: source.py, queries.py, signals.py, hardware.py)
against a query API on 127.0.0.1 that answers each tagged row of the fleet's instant
queries from simulator recordings, windowed as the sidecar's own window does
(tests/support/fake_query_api.py). So the plumbing (rows -> totals -> signals ->
diagnosis, discovery, shards, hardware) is held to the sidecar exactly; the PromQL itself
runs against a real Prometheus in tests/system/test_integration.py. The backends' own
shapes (partial answers, duplicates, tenants, shard buckets) are test_fleet_backends.py's."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from vllm_triage.assemble import (
    build_fleet,
    build_hardware_resolver,
    build_rulebook,
    history,
)
from vllm_triage.config.load import load_settings
from vllm_triage.config.matchers import parse_matchers
from vllm_triage.core.diagnose import diagnose
from vllm_triage.errors import ConfigError
from vllm_triage.fleet.completeness import REASONS
from vllm_triage.fleet.hardware import Card, HardwareResolver
from vllm_triage.fleet.queries import NAMES, QueryPlan, duration, entries, names
from vllm_triage.fleet.source import PrometheusSource, shard_of
from vllm_triage.serve.status import live_document
from vllm_triage.store import StateStore

from support.fake_query_api import (
    MODEL,
    NOW,
    STEP,
    Fake,
    exposed,
    fleet_settings,
    query_api,
    run_ticks,
    totals_at,
    warm,
    window_at,
    without_progress,
)
from support.paths import CONFIGS, FIXTURES

LLAMA_8B = {"parameters_billion": 8.03, "dtype": "bfloat16"}


class TestQueries:
    def plan(self, **extra: Any) -> QueryPlan:
        return QueryPlan(
            selector='{job="vllm", namespace=~"llm-.*"}',
            identity=("job", "instance"),
            window_seconds=60,
            step_seconds=15,
            **extra,
        )

    def queries(self, present: frozenset[str] | None = None, **extra: Any) -> dict[str, str]:
        return {q.key: q.promql for q in self.plan(**extra).queries(present)}

    def test_one_query_per_signal(self) -> None:
        """Buckets of the three latency histograms, every sum and count, the counters,
        the gauges' statistics, engines, the pool; DCGM's two when it is on."""
        keys = set(self.queries())
        assert {"ttft_bucket", "itl_bucket", "iteration_tokens_bucket"} <= keys
        assert {"queue_time_sum", "queue_time_count", "decode_time_sum"} <= keys
        assert {"generation_tokens", "preemptions", "spec_drafts"} <= keys
        assert {"running_mean", "waiting_min", "kv_usage_busy_mean", "engines", "pool"} <= keys
        assert "requests_finished" not in keys and "dcgm_gpus" not in keys
        dcgm = self.queries(dcgm_selector="", dcgm_join=("namespace", "pod"))
        assert "count by (namespace, pod, modelName)" in dcgm["dcgm_gpus"]
        assert (
            "avg by (namespace, pod) (avg_over_time(DCGM_FI_PROF_DRAM_ACTIVE[" in dcgm["dcgm_dram"]
        )

    def test_every_naming_era_newest_first(self) -> None:
        """The current name, then the V0 name, then Ray Serve's prefix, first wins."""
        assert names("itl", "bucket") == [
            "vllm:inter_token_latency_seconds_bucket",
            "vllm:time_per_output_token_seconds_bucket",
            "ray_vllm:inter_token_latency_seconds_bucket",
            "ray_vllm:time_per_output_token_seconds_bucket",
        ]
        q = self.queries()["itl_bucket"]
        first, second = q.index("vllm:inter_token"), q.index("vllm:time_per_output")
        assert first < second
        assert " or on (job, instance, model_name) " in q
        assert 'vllm:inter_token_latency_seconds_bucket{job="vllm", namespace=~"llm-.*"}' in q
        assert "sum by (job, instance, model_name, le) (increase(" in q

    def test_only_the_names_the_fleet_exposes(self) -> None:
        """A fleet on one vLLM version gets plain queries; a field it does not expose
        (speculative decoding off) is not asked for."""
        present = exposed("healthy")
        q = self.queries(present)
        assert q["itl_bucket"] == (
            "sum by (job, instance, model_name, le) (increase(vllm:inter_token_latency_"
            'seconds_bucket{job="vllm", namespace=~"llm-.*"}[60000ms]))'
        )
        assert all(" or " not in promql for promql in q.values())
        assert "spec_drafts" not in q and "ttft_bucket" in q
        assert len(q) < len(self.queries())

    def test_window_and_step_in_milliseconds(self) -> None:
        """Prometheus 2 takes no decimal seconds in a duration."""
        assert duration(12.5) == "12500ms"
        q = self.queries()
        assert "[60000ms:15000ms]" in q["running_max"]
        assert "avg_over_time(vllm:num_requests_running" in q["running_mean"]

    def test_rule_and_join_labels_are_fetched(self) -> None:
        q = self.queries(server_labels=("namespace", "pod", "instance"))["engines"]
        assert q.startswith(
            "(count by (job, instance, model_name, namespace, pod) (last_over_time("
        )


class TestEngines:
    """Every engine's series through the same queries: its names, its matchers, its
    copies read once, its rank as the engine, its own progress series. A fleet of vLLM
    alone gets exactly vLLM's queries (no question of which engine it is)."""

    def plan(self) -> QueryPlan:
        return QueryPlan(
            selector='{job="vllm"}',
            identity=("job", "instance"),
            window_seconds=60,
            step_seconds=15,
        )

    def queries(self, present: frozenset[str] | None) -> dict[str, str]:
        return {q.key: q.promql for q in self.plan().queries(present)}

    def test_a_vllm_fleet_asks_vllms_names_alone(self) -> None:
        q = self.queries(exposed("healthy"))
        assert "runtime" not in q and "step_seconds_busy_mean" not in q
        assert not any("sglang:" in x or "trtllm_" in x or "max without" in x for x in q.values())

    def test_sglang_through_its_spec(self) -> None:
        q = self.queries(
            frozenset(
                {
                    "sglang:num_running_reqs",
                    "sglang:num_queue_reqs",
                    "sglang:full_token_usage",
                    "sglang:realtime_tokens_total",
                    "sglang:cuda_graph_passes_total",
                    "sglang:max_total_num_tokens",
                    "sglang:spec_accept_length",
                }
            )
        )
        # The engine's matchers; the copies of one scheduler's series read once.
        assert q["generation_tokens"] == (
            "sum by (job, instance, model_name) (max without (tp_rank, pp_rank, moe_ep_rank, "
            'pid) (increase(sglang:realtime_tokens_total{job="vllm", mode="decode"}[60000ms])))'
        )
        assert 'sglang:num_queue_reqs{job="vllm", priority=""}' in q["waiting_mean"]
        # The KV pool only, never token_usage (the max of every pool).
        assert "sglang:full_token_usage" in q["kv_usage_max"]
        # dp_rank read as the engine; progress from its own step-driven series, each
        # family tagged so that two with the same labels do not collide.
        changes = q["engine_changes"]
        assert "label_replace(" in changes and '"engine", "$1", "dp_rank"' in changes
        assert '"triage_series", "sglang:cuda_graph_passes_total"' in changes
        assert "label_replace(count by (job, instance, model_name)" in q["runtime"]
        assert '"runtime", "sglang"' in q["runtime"]
        assert "sglang:spec_accept_length" in q["tokens_per_step_busy_mean"]
        assert "sglang:max_total_num_tokens" in q["pool_tokens"]

    def test_trtllm_progress_is_never_its_token_counters(self) -> None:
        """TensorRT-LLM writes its token counters when a request finishes: its stall
        watch reads the last iteration's latency, completions and the gauges."""
        q = self.queries(None)
        trt = q["engine_changes"].split(" or on (job, instance, model_name, engine) ")
        mine = next(part for part in trt if "trtllm_" in part)
        assert "trtllm_iteration_latency_seconds" in mine
        assert "trtllm_num_requests_completed_total" in mine
        assert "tokens_total" not in mine
        # Without the names API every engine is asked for, vLLM's names first.
        assert q["running_mean"].index("vllm:") < q["running_mean"].index("trtllm_")


class TestMatchers:
    @pytest.mark.parametrize(
        ("text", "labels", "hit"),
        [
            ('{namespace="llm"}', {"namespace": "llm"}, True),
            ('{namespace="llm"}', {"namespace": "llm2"}, False),
            ('{pod=~"llama-.*"}', {"pod": "llama-0"}, True),
            ('{pod=~"llama-.*"}', {"pod": "x-llama-0"}, False),  # anchored, as PromQL
            ('{pod!~"llama-.*"}', {"pod": "x"}, True),
            ('{zone!="a"}', {}, True),  # a missing label reads as ""
            ('{zone=""}', {}, True),
            ("{}", {"a": "b"}, True),
            ('{a="x\\"y"}', {"a": 'x"y'}, True),
        ],
        ids=[
            "equal",
            "equal-other-value",
            "regex",
            "regex-anchored",
            "negative-regex",
            "not-equal-missing-label",
            "empty-equals-missing-label",
            "empty-selector",
            "escaped-quote",
        ],
    )
    def test_prometheus_semantics(self, text: str, labels: dict[str, str], hit: bool) -> None:
        assert all(m.matches(labels) for m in parse_matchers(text)) is hit

    @pytest.mark.parametrize("bad", ["{a=b}", '{a="x"', '{a=~"("}', '{a="x" b="y"}', "a"])
    def test_bad_matchers_are_refused(self, bad: str) -> None:
        with pytest.raises(ValueError, match=r"\S"):
            parse_matchers(bad)

    def test_a_bad_rule_names_its_key(self) -> None:
        with pytest.raises(ConfigError, match=r"prometheus\.servers\.0\.match"):
            fleet_settings("http://127.0.0.1:9", servers=[{"match": "{a=b}"}])


class TestShards:
    def test_the_hash_is_stable(self) -> None:
        """Not Python's salted hash: the same shard on every replica and every start."""
        assert [shard_of(f"vllm/10.0.0.{i}:8000", 5) for i in range(8)] == [
            shard_of(f"vllm/10.0.0.{i}:8000", 5) for i in range(8)
        ]
        assert shard_of("vllm/10.0.0.1:8000", 1_000_003) == 7856

    def test_shards_partition_a_fleet(self) -> None:
        names = [f"llm/pod-{i}" for i in range(3000)]
        shards = [shard_of(n, 3) for n in names]
        assert set(shards) == {0, 1, 2}
        for k in range(3):
            assert 800 < shards.count(k) < 1200  # roughly even

    def test_index_below_count(self) -> None:
        with pytest.raises(ConfigError, match="index 2 must be below count 2"):
            fleet_settings("http://127.0.0.1:9", shard={"index": 2, "count": 2})


class TestHardware:
    def resolver(self, **extra: Any) -> HardwareResolver:
        return build_hardware_resolver(fleet_settings("http://127.0.0.1:9", **extra))

    def test_dcgm_card_and_gpu_count(self) -> None:
        r = self.resolver(models={MODEL: LLAMA_8B})
        rb = r.resolve({"pod": "a"}, MODEL, Card({"NVIDIA H100 80GB HBM3": 2}))
        assert rb.roofline is not None and rb.ceiling is not None
        assert rb.roofline.gpu == "2x NVIDIA H100 SXM"
        assert rb.roofline.tensor_parallel_size == 2
        assert rb.roofline.memory_bandwidth_gb_s == 3350
        assert rb.provenance == {
            "gpu_source": "dcgm (NVIDIA H100 80GB HBM3)",
            "tensor_parallel_source": "dcgm (2 GPUs in the pod)",
            "model_source": "model table",
        }

    def test_a_rule_beats_dcgm_key_by_key(self) -> None:
        """The rule says the tensor-parallel size (pipeline parallelism doubles the
        pod's GPUs); the card still comes from DCGM; the rule's model wins the table."""
        r = self.resolver(
            servers=[
                {"match": '{namespace="other"}', "hardware": {"gpu": "L4"}},
                {
                    "match": '{namespace="llm", model_name=~".*8B.*"}',
                    "hardware": {"tensor_parallel_size": 1, "compute_tflops": 400},
                    "model": {"parameters_billion": 8.03, "dtype": "fp8"},
                },
            ],
            models={MODEL: LLAMA_8B},
        )
        rb = r.resolve({"namespace": "llm"}, MODEL, Card({"NVIDIA A100-SXM4-80GB": 2}))
        assert rb.roofline is not None
        assert rb.roofline.gpu == "NVIDIA A100 80GB SXM"
        assert rb.roofline.tensor_parallel_size == 1
        assert rb.roofline.compute_tflops == 400
        assert rb.roofline.weight_bytes == pytest.approx(8.03e9, rel=0.01)  # fp8: 1 byte
        assert rb.provenance == {
            "gpu_source": "dcgm (NVIDIA A100-SXM4-80GB)",
            "tensor_parallel_source": "rule 2",
            "model_source": "rule 2",
        }

    def test_a_rules_card_replaces_dcgms(self) -> None:
        r = self.resolver(
            servers=[{"match": '{pod=~"l4-.*"}', "hardware": {"gpu": "L4"}}],
            models={MODEL: LLAMA_8B},
        )
        rb = r.resolve({"pod": "l4-0"}, MODEL, Card({"NVIDIA H100 80GB HBM3": 1}))
        assert rb.ceiling is not None and rb.ceiling.gpu == "NVIDIA L4"
        assert rb.provenance["gpu_source"] == "rule 1"
        assert rb.provenance["tensor_parallel_source"] == "dcgm (1 GPU in the pod)"

    def test_defaults_when_nothing_is_known(self) -> None:
        r = self.resolver(top={"hardware": {"gpu": "A10G"}, "model": LLAMA_8B})
        rb = r.resolve({"pod": "x"}, "another-model", None)
        assert rb.ceiling is not None and rb.ceiling.gpu == "NVIDIA A10G"
        assert rb.provenance == {
            "gpu_source": "settings",
            "tensor_parallel_source": "settings",
            "model_source": "settings",
        }
        bare = self.resolver().resolve({}, MODEL, None)
        assert bare.ceiling is None and bare.provenance["gpu_source"] == "none"

    def test_an_unknown_card_falls_back_and_says_so(self) -> None:
        r = self.resolver(top={"hardware": {"gpu": "A10G"}}, models={MODEL: LLAMA_8B})
        rb = r.resolve({}, MODEL, Card({"NVIDIA Z9000": 1}))
        assert rb.ceiling is not None and rb.ceiling.gpu == "NVIDIA A10G"
        assert rb.provenance["gpu_source"] == (
            "settings (dcgm's 'NVIDIA Z9000' is not in rules/gpus.yaml)"
        )

    def test_rulebooks_are_shared(self) -> None:
        """A fleet of one kind of server builds its rulebook once."""
        r = self.resolver(models={MODEL: LLAMA_8B})
        card = Card({"NVIDIA L40S": 1})
        assert r.resolve({"pod": "a"}, MODEL, card) is r.resolve({"pod": "b"}, MODEL, card)

    def test_a_bad_table_entry_fails_at_start(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"prometheus\.models\['x'\]"):
            self.resolver(models={"x": {"config_json": str(tmp_path / "missing.json")}})
        with pytest.raises(
            ConfigError, match=r"prometheus\.servers\.0\.hardware\.gpu: unknown GPU"
        ):
            self.resolver(servers=[{"match": "{}", "hardware": {"gpu": "Voodoo 3"}}])

    def test_config_json_beside_the_settings(self, tmp_path: Path) -> None:
        (tmp_path / "llama.json").write_bytes((CONFIGS / "llama-3.1-8b.json").read_bytes())
        cfg = tmp_path / "triage.yaml"
        cfg.write_text(
            "source: prometheus\nprometheus:\n  url: http://127.0.0.1:9\n"
            f"  models:\n    {MODEL}: {{config_json: llama.json}}\n"
            "  servers:\n    - match: '{}'\n      model: {config_json: llama.json}\n"
        )
        prom = load_settings(cfg).prometheus
        assert prom is not None
        assert prom.models[MODEL].config_json == tmp_path / "llama.json"
        rule_model = prom.servers[0].model
        assert rule_model is not None and rule_model.config_json == tmp_path / "llama.json"


class TestTicks:
    def test_each_server_gets_the_sidecars_signals_and_diagnosis(self) -> None:
        """Rows -> totals -> signals gives exactly what the sidecar's window gives."""
        fake = Fake()
        fake.servers = {"a:8000": "kv_pressure", "b:8000": "healthy", "c:8000": "queue_bound"}
        with query_api(fake) as url:
            settings = fleet_settings(url)
            source = run_ticks(
                settings, warm(fake, [NOW - 4 * STEP + STEP * i for i in range(5)]), fake=fake
            )
        assert set(source.targets) == {"vllm/a:8000", "vllm/b:8000", "vllm/c:8000"}
        rulebook = build_rulebook(settings)
        for instance, scenario in fake.servers.items():
            view = source.targets[f"vllm/{instance}"].state.view
            assert view is not None
            sidecar = without_progress(window_at(scenario, NOW).signals(MODEL))
            assert view.evaluation.signals[MODEL] == sidecar
            assert view.evaluation.diagnoses[MODEL].cause == diagnose(sidecar, rulebook).cause
        causes = {
            n: [a.cause for a in w.evaluator.incidents.active()] for n, w in source.targets.items()
        }
        assert causes == {
            "vllm/a:8000": ["kv_pressure"],
            "vllm/b:8000": [],
            "vllm/c:8000": ["queue_bound"],
        }
        # Instant queries on the step grid, POSTed, after one names call a tick (and one
        # build-info probe, the first tick: ``backend: auto``); the query API counted as
        # a target.
        asked = [f for f in fake.seen if "time" in f]
        assert {float(f["time"]) % STEP for f in asked} == {0.0}
        assert len(fake.seen) == 1 + 5 * (len(source.queries) + 1)
        assert {q.key for q in source.queries} >= {"dcgm_gpus", "ttft_bucket"}
        assert source.api.state.up and source.api.state.scrapes == 5

    def test_each_servers_alerts_carry_its_identity_labels(self, tmp_path: Path) -> None:
        """The alert-label contract: a fleet server's alerts name it by the labels
        ``identity_labels`` name (job and instance here), as the rules' alerts do."""
        fake = Fake()
        fake.servers = {"a:8000": "kv_pressure", "b:8000": "kv_pressure"}
        with query_api(fake) as url:
            settings = fleet_settings(url, top={"state_dir": str(tmp_path)})
            store = StateStore.open(tmp_path)
            assert store is not None
            run_ticks(
                settings,
                warm(fake, [NOW - 60 + STEP * i for i in range(13)]),
                fake=fake,
                store=store,
            )
            store.close()
        store = StateStore.open(tmp_path)
        assert store is not None
        labels = sorted(
            (a.labels["target"], a.labels["job"], a.labels["instance"])
            for a in store.restored.alerts.values()
        )
        store.close()
        assert labels == [("vllm/a:8000", "vllm", "a:8000"), ("vllm/b:8000", "vllm", "b:8000")]

    def test_each_data_parallel_engines_balance_is_the_sidecars(self) -> None:
        """Two engines, one of them hung (its gauges frozen): each engine's window means
        of waiting and KV usage reach fleet mode's signals as the sidecar has them."""
        fake = Fake()
        fake.servers = {"a:8000": str(FIXTURES / "scenarios" / "dp_one_engine_hung.yaml")}
        with query_api(fake) as url:
            source = run_ticks(fleet_settings(url), warm(fake, [NOW - STEP, NOW]), fake=fake)
        view = source.targets["vllm/a:8000"].state.view
        assert view is not None
        got = view.evaluation.signals[MODEL]
        want = without_progress(window_at(fake.servers["a:8000"], NOW).signals(MODEL))
        assert set(got.engine_waiting_mean) == set(got.engine_kv_usage_mean) == {"0", "1"}
        assert got.engine_waiting_mean == want.engine_waiting_mean
        assert got.engine_kv_usage_mean == want.engine_kv_usage_mean
        # The rest as well, but the pool's labels: this fake answers the merged pool as
        # one engine's ``cache_config_info`` row.
        assert dataclasses.replace(got, kv_cache=want.kv_cache) == want

    def test_one_engine_holding_the_queue_is_named_in_fleet_mode(self) -> None:
        """A queue-bound server whose queue Prometheus says is all engine 1's: the fleet's
        diagnosis names the engine and puts the balancer's fixes first, as the sidecar's
        does on the same signals."""
        fake = Fake()
        fake.servers = {"a:8000": "queue_bound"}
        queue = totals_at("queue_bound", NOW)[0][0].waiting.mean
        assert queue is not None and queue > 4
        fake.engine_rows = {"engine_waiting_mean": {"0": 0.5, "1": queue}}
        with query_api(fake) as url:
            settings = fleet_settings(url)
            source = run_ticks(settings, warm(fake, [NOW - STEP, NOW]), fake=fake)
        view = source.targets["vllm/a:8000"].state.view
        assert view is not None
        d = view.evaluation.diagnoses[MODEL]
        assert d.cause == "queue_bound"
        assert "engine 1 of 2 carries it" in d.summary, d.summary
        balancer = build_rulebook(settings).kind_remediation["dp_imbalance"]
        assert d.remediation[: len(balancer)] == balancer

    def test_dcgm_gives_each_server_its_card_and_memory_activity(self) -> None:
        fake = Fake()
        fake.servers = {"a:8000": "decode_bound", "b:8000": "decode_bound"}
        fake.labels = {
            "a:8000": {"namespace": "llm", "pod": "a-0"},
            "b:8000": {"namespace": "llm", "pod": "b-0"},
        }
        fake.dcgm = {
            "a:8000": ("NVIDIA L40S", 1, 0.72),
            "b:8000": ("NVIDIA H100 80GB HBM3", 2, 0.31),
        }
        with query_api(fake) as url:
            settings = fleet_settings(url, models={MODEL: LLAMA_8B})
            source = run_ticks(settings, warm(fake, [NOW - STEP, NOW]), fake=fake)
        a, b = (source.targets[f"vllm/{x}:8000"].state for x in "ab")
        assert a.ceiling is not None and b.ceiling is not None
        assert (a.ceiling.gpu, b.ceiling.gpu) == ("NVIDIA L40S", "2x NVIDIA H100 SXM")
        for st, dram, source_text in ((a, 0.72, "NVIDIA L40S"), (b, 0.31, "NVIDIA H100")):
            assert st.view is not None
            assert st.view.evaluation.signals[MODEL].dram_active_mean == dram
            evidence = st.view.evaluation.diagnoses[MODEL].evidence
            assert str(evidence["gpu_source"]).startswith(f"dcgm ({source_text}")
            assert evidence["model_source"] == "model table"

    def test_two_shards_diagnose_every_server_once(self) -> None:
        fake = Fake()
        fake.servers = {f"s{i}:8000": "healthy" for i in range(12)}
        with query_api(fake) as url:
            shards = [
                run_ticks(
                    fleet_settings(url, shard={"index": k, "count": 2}),
                    warm(fake, [NOW]),
                    fake=fake,
                )
                for k in (0, 1)
            ]
        first, second = (set(s.targets) for s in shards)
        assert first and second and not first & second
        assert first | second == {f"vllm/s{i}:8000" for i in range(12)}
        assert all(s.seen == 12 for s in shards)
        assert shards[0].owned + shards[1].owned == 12

    @pytest.mark.parametrize(
        ("status", "raw", "reason"),
        [
            (500, None, "http_status"),
            (200, b"<html>not json</html>", "parse"),
            (200, b'{"status":"error","error":"bad query"}', "parse"),
            (200, b'{"status":"success","data":{"resultType":"matrix","result":[]}}', "parse"),
        ],
    )
    def test_a_broken_query_api_is_a_counted_failure(
        self, status: int, raw: bytes | None, reason: str
    ) -> None:
        fake = Fake()
        fake.status, fake.raw = status, raw
        with query_api(fake) as url:
            source = run_ticks(fleet_settings(url), [NOW, NOW + STEP])
        api = source.api.state
        assert not api.up and api.failures[reason] == 2 and not source.targets

    def test_without_the_names_api_every_naming_is_asked_for(self) -> None:
        fake = Fake()
        fake.servers, fake.names_api = {"a:8000": "queue_bound"}, False
        with query_api(fake) as url:
            source = run_ticks(fleet_settings(url), warm(fake, [NOW]), fake=fake)
        assert source.present is None
        assert any(" or on " in q.promql for q in source.queries)
        st = source.targets["vllm/a:8000"].state
        assert st.view is not None
        want = without_progress(window_at("queue_bound", NOW).signals(MODEL))
        assert st.view.evaluation.signals[MODEL] == want

    def test_a_names_call_over_too_many_series_asks_only_the_engines_running(self) -> None:
        """VictoriaMetrics refuses the names call over every series of a large fleet; the
        running gauges (one series per engine) still say which engines run, so only
        their namings are asked for: the stall watch's query then stays within
        VictoriaMetrics' bound on a query's length, and the judgement is the same."""
        running = entries("running", "gauge", None)
        fake = Fake()
        fake.servers, fake.names_limit = {"a:8000": "queue_bound"}, len(running)
        with query_api(fake) as url:
            source = run_ticks(fleet_settings(url), warm(fake, [NOW]), fake=fake)
        vllm = {e.name for e in NAMES if e.runtime.name == "vllm"}
        assert source.present == vllm
        asked = " ".join(q.promql for q in source.queries)
        assert not any(e.name in asked for e in NAMES if e.runtime.name != "vllm")
        every = QueryPlan(
            selector="", identity=("job", "instance"), window_seconds=60, step_seconds=STEP
        ).queries(None)
        longest = max(len(q.promql) for q in source.queries)
        assert longest < max(len(q.promql) for q in every) / 2
        st = source.targets["vllm/a:8000"].state
        assert st.view is not None
        want = without_progress(window_at("queue_bound", NOW).signals(MODEL))
        assert st.view.evaluation.signals[MODEL] == want

    def test_a_names_call_refused_even_for_the_running_gauges_asks_every_naming(
        self,
    ) -> None:
        fake = Fake()
        fake.servers, fake.names_limit = {"a:8000": "queue_bound"}, 1
        with query_api(fake) as url:
            source = run_ticks(fleet_settings(url), warm(fake, [NOW]), fake=fake)
        assert source.present is None
        st = source.targets["vllm/a:8000"].state
        assert st.view is not None
        want = without_progress(window_at("queue_bound", NOW).signals(MODEL))
        assert st.view.evaluation.signals[MODEL] == want

    def test_a_names_call_that_gets_no_answer_is_not_asked_again(self) -> None:
        """Only a refusal (an HTTP status) is followed by the narrower names call: one
        that timed out would only wait out its timeout a second time in the same tick."""
        fake = Fake()
        fake.servers, fake.names_delay = {"a:8000": "queue_bound"}, 3.0
        with query_api(fake) as url:
            source = run_ticks(fleet_settings(url, timeout_seconds=1), [NOW])
        names_calls = [f for f in fake.seen if "/api/v1/label/__name__/" in f.get("names", "")]
        assert len(names_calls) == 1, names_calls
        assert source.present is None

    def test_a_dead_query_api_is_a_counted_failure(self) -> None:
        with query_api(Fake()) as url:
            pass  # closed again: connections are refused
        source = run_ticks(fleet_settings(url, timeout_seconds=2), [NOW])
        assert source.api.state.failures["connect"] == 1

    def test_unusable_rows_are_left_out_and_said(self) -> None:
        """A NaN row is a problem of its server, counted; the rest of it is judged."""
        fake = Fake()
        fake.servers = {"a:8000": "healthy"}
        answer = fake.answer

        def with_nan(query: str, at: float, **kw: Any) -> list[dict[str, Any]]:
            rows = answer(query, at, **kw)
            for row in rows:
                if row["key"] == "waiting_mean":
                    row["value"] = [at, "NaN"]
            return rows

        fake.answer = with_nan
        with query_api(fake) as url:
            source = run_ticks(fleet_settings(url), warm(fake, [NOW]), fake=fake)
        st = source.targets["vllm/a:8000"].state
        assert st.series_problems == 1 and st.view is not None
        assert st.view.evaluation.signals[MODEL].waiting_mean is None

    def test_a_server_that_disappears_is_marked_down(self) -> None:
        """The whole fleet gone from the answers is a drop of every row: missing data
        until it holds (``series_drop_ticks``, 3), then the server is marked down."""
        fake = Fake()
        fake.servers = {"a:8000": "healthy"}
        with query_api(fake) as url:
            settings = fleet_settings(url)

            async def go() -> tuple[PrometheusSource, list[bool]]:
                times = iter(warm(fake, [NOW - 100, NOW - 95, NOW - 95, NOW - 90, NOW - 85]))
                up: list[bool] = []
                async with httpx.AsyncClient() as client:
                    source = build_fleet(
                        settings, client=client, notifier=None, clock=lambda: next(times)
                    )
                    fake.learn(source)
                    await source.tick()
                    fake.servers.clear()
                    for _ in range(4):  # the second: the same step again, not asked twice
                        await source.tick()
                        up.append(source.targets["vllm/a:8000"].state.up)
                return source, up

            source, up = asyncio.run(go())
        state = source.targets["vllm/a:8000"].state
        assert up == [True, True, True, False]
        assert not state.up and state.failures["absent"] == 1
        assert len([f for f in fake.seen if "names" in f and "__name__" in f["names"]]) == 4
        assert source.api.state.cannot_tell == dict.fromkeys(REASONS, 0)

    def test_a_shard_lets_go_of_restored_incidents_now_anothers(self, tmp_path: Path) -> None:
        """After the replica count changed, restored incidents of servers now owned by
        another shard are forgotten here (and their alerts resolved): that shard
        diagnoses them now."""
        fake = Fake()
        fake.servers = {f"s{i}:8000": "kv_pressure" for i in range(6)}
        with query_api(fake) as url:
            store, before = fired_and_restored(fake, url, tmp_path)
            half = fleet_settings(url, shard={"index": 0, "count": 2})
            source = run_ticks(half, warm(fake, [NOW + STEP]), fake=fake, store=store)
            mine = {n for n in before if shard_of(n, 2) == 0}
            assert 0 < len(mine) < 6
            assert set(source.targets) == mine
            assert store.restored.incidents == {}
            store.close()
        store = reopened(tmp_path)
        assert set(store.restored.incidents) == mine  # the others' records are gone
        store.close()

    def test_one_replica_lets_go_of_restored_incidents_of_servers_gone(
        self, tmp_path: Path
    ) -> None:
        """Before: with one replica, the incidents and alerts of servers gone while the
        daemon was down were restored and kept for ever (their alerts re-sent, nothing to
        resolve them). Now the first whole tick tells them gone: their records are
        forgotten and their alerts resolved; the servers still there keep theirs."""
        fake = Fake()
        fake.servers = {f"s{i}:8000": "kv_pressure" for i in range(4)}
        with query_api(fake) as url:
            one = fleet_settings(url, top={"state_dir": str(tmp_path)})
            store, before = fired_and_restored(fake, url, tmp_path)
            gone = {"vllm/s0:8000", "vllm/s3:8000"}
            del fake.servers["s0:8000"], fake.servers["s3:8000"]
            with capture_logs() as logs:
                source = run_ticks(one, warm(fake, [NOW + STEP]), fake=fake, store=store)
            assert set(source.targets) == before - gone
            store.close()
        (line,) = [e for e in logs if e.get("event") == "fleet_server_gone"]
        assert line["parts"] == 2 and {p["target"] for p in line["first"]} == gone
        store = reopened(tmp_path)
        assert set(store.restored.incidents) == before - gone
        assert {a.labels["target"] for a in store.restored.alerts.values()} == before - gone
        store.close()

    def test_servers_left_out_by_max_servers_keep_their_restored_incidents(
        self, tmp_path: Path
    ) -> None:
        """A server past ``max_servers`` is in the answers: neither gone nor another
        replica's, so the first whole tick lets go of nothing of it."""
        fake = Fake()
        fake.servers = {f"s{i}:8000": "kv_pressure" for i in range(4)}
        with query_api(fake) as url:
            store, before = fired_and_restored(fake, url, tmp_path)
            two = fleet_settings(url, max_servers=2, top={"state_dir": str(tmp_path)})
            source = run_ticks(two, warm(fake, [NOW + STEP]), fake=fake, store=store)
            assert len(source.targets) == 2 and source.api.state.servers_left_out == 2
            store.close()
        store = reopened(tmp_path)
        assert set(store.restored.incidents) == before
        assert {a.labels["target"] for a in store.restored.alerts.values()} == before
        store.close()


def fired_and_restored(fake: Fake, url: str, tmp_path: Path) -> tuple[StateStore, set[str]]:
    """Every server of ``fake`` firing in a state directory, then the store opened again
    as a restarted daemon opens it: the store, and the servers with restored incidents."""
    every = fleet_settings(url, top={"state_dir": str(tmp_path)})
    store = StateStore.open(tmp_path)
    assert store is not None
    run_ticks(every, warm(fake, [NOW - 60 + STEP * i for i in range(13)]), fake=fake, store=store)
    store.close()
    store = StateStore.open(tmp_path)
    assert store is not None
    before = set(store.restored.incidents)
    assert len(before) == len(fake.servers)
    assert {a.labels["target"] for a in store.restored.alerts.values()} == before
    return store, before


def reopened(tmp_path: Path) -> StateStore:
    store = StateStore.open(tmp_path)
    assert store is not None
    return store


class TestHostileAnswers:
    """What a proxy, a middleware or a too-broad selector can put in the query API's
    answers: each is counted and said, and never stops the other servers' judgement."""

    def test_a_row_whose_label_is_a_number_is_left_out_not_the_tick(self) -> None:
        """Before: one row with ``"model_name": 7`` raised TypeError naming the server: no
        server was judged, nothing counted, ``target_up`` kept its last value. Now the row
        is unusable (counted on the query API's ``series_unusable_total``, one log line a
        minute), and every server is judged."""
        fake = Fake()
        fake.servers = {"a:8000": "healthy", "b:8000": "queue_bound"}
        answer = fake.answer

        def one_bad_row(query: str, at: float, **kw: Any) -> list[dict[str, Any]]:
            rows = answer(query, at, **kw)
            if rows and rows[0]["key"] == "running_mean":
                rows.append({"metric": {"instance": "c:8000", "model_name": 7}, "value": [at, "1"]})
            return rows

        fake.answer = one_bad_row  # type: ignore[method-assign]
        times = warm(fake, [NOW - 2 * STEP, NOW - STEP, NOW])
        with query_api(fake) as url, capture_logs() as logs:
            source = run_ticks(fleet_settings(url), times, fake=fake)
        api = source.api.state
        said = [e for e in logs if e["event"] == "fleet_rows_unusable"]
        assert api.up and api.scrapes == 3 and not api.failures
        assert api.series_problems == 3 and len(said) == 1
        for name in ("vllm/a:8000", "vllm/b:8000"):
            assert source.targets[name].state.view is not None
        causes = {
            n: [a.cause for a in t.evaluator.incidents.active()] for n, t in source.targets.items()
        }
        assert causes["vllm/b:8000"] == ["queue_bound"]

    def test_a_dcgm_card_name_of_a_megabyte_costs_a_label_value(self) -> None:
        """Before: a 1 MB ``modelName`` that changed each tick wrote a 1 MB log line per
        tick, rode into the evidence, the API and the store, and grew memory by about 5 MB
        a tick (caches keyed by it never forgot). Now it is cut to the label bound where it
        is read, and the caches keyed by it have a size."""
        fake = Fake()
        fake.servers = {"a:8000": "decode_bound"}
        fake.labels = {"a:8000": {"namespace": "llm", "pod": "a-0"}}
        times = warm(fake, [NOW - 60 + STEP * i for i in range(13)])
        cards = iter(f"{i:04d}" + "X" * 2**20 for i in range(len(times) * 2))
        answer = fake.answer

        def new_name_each_tick(query: str, at: float, **kw: Any) -> list[dict[str, Any]]:
            if fake.key_of(query)[0] == "dcgm_gpus":
                fake.dcgm["a:8000"] = (next(cards), 1, 0.5)
            return answer(query, at, **kw)

        fake.answer = new_name_each_tick  # type: ignore[method-assign]
        fake.dcgm["a:8000"] = ("first", 1, 0.5)
        with query_api(fake) as url, capture_logs() as logs:
            tracemalloc.start()
            source = run_ticks(fleet_settings(url, models={MODEL: LLAMA_8B}), times, fake=fake)
            held_mb = tracemalloc.get_traced_memory()[0] / 2**20
            tracemalloc.stop()
        st = source.targets["vllm/a:8000"].state
        assert st.view is not None
        evidence = json.dumps(st.view.evaluation.diagnoses[MODEL].evidence, default=str)
        longest_log = max(len(json.dumps(e, default=str)) for e in logs)
        print(f"FIGURE dcgm-name: held_mb={held_mb:.1f} longest_log={longest_log}")
        assert "X" * 200 not in evidence and longest_log < 2000
        # 13 ticks of a new 1 MB name: what stays is bounded by the caches, not the ticks.
        assert held_mb < 6, f"{held_mb:.1f} MB held after 13 ticks"

    def test_a_fleet_over_max_servers_judges_that_many_and_says_so_once(self) -> None:
        """Before: no bound (20,000 servers: 1.4 GB, 20,000 alerts, a 128 MB API document).
        Now at most ``max_servers`` (the ones already judged first, then by name); the rest
        are counted (``vllm_triage_fleet_servers_left_out``) and said once."""
        fake = Fake()
        fake.servers = {f"s{i}:8000": "healthy" for i in range(8)}
        times = warm(fake, [NOW - STEP, NOW])
        with query_api(fake) as url, capture_logs() as logs:
            source = run_ticks(fleet_settings(url, max_servers=5), times, fake=fake)
        said = [e for e in logs if e["event"] == "fleet_servers_left_out"]
        assert set(source.targets) == {f"vllm/s{i}:8000" for i in range(5)}
        assert source.api.state.servers_left_out == 3
        assert len(said) == 1 and said[0]["left_out"] == 3 and said[0]["judged"] == 5


class TestOneServerNeverBlindsTheRest:
    """Whatever one server's rows set off is that server's failure: the servers sorting
    after it are judged on the same tick."""

    def test_a_400_digit_pool_label_is_an_unknown_pool_not_a_stopped_tick(self) -> None:
        """Before: ``num_gpu_blocks`` of 400 digits raised OverflowError in the tick's
        loop over servers: every server sorting after it froze (24 evaluations of a
        healthy neighbour against 60). Now its pool is unknown, said in its problems, and
        every server is judged on every tick."""
        fake = Fake()
        fake.servers = {"a:8000": "queue_bound", "b:8000": "healthy", "c:8000": "queue_bound"}
        answer = fake.answer

        def hostile_pool(query: str, at: float, **kw: Any) -> list[dict[str, Any]]:
            rows = answer(query, at, **kw)
            for row in rows:
                if row["key"] == "pool" and row["metric"]["instance"] == "a:8000":
                    row["metric"].update(num_gpu_blocks="9" * 400, kv_cache_size_tokens="None")
            return rows

        fake.answer = hostile_pool  # type: ignore[method-assign]
        times = warm(fake, [NOW - 2 * STEP, NOW - STEP, NOW])
        with query_api(fake) as url, capture_logs():
            source = run_ticks(fleet_settings(url), times, fake=fake)
        for name in ("vllm/a:8000", "vllm/b:8000", "vllm/c:8000"):
            st = source.targets[name].state
            assert st.scrapes == 3 and st.up and not st.failures, (name, st.failures)
            assert st.view is not None and st.view.evaluation.at == NOW
        a = source.targets["vllm/a:8000"].state
        assert a.series_problems >= 3
        assert a.view is not None and any(
            "beyond what any card" in p for p in a.view.evaluation.problems
        )

    def test_an_exception_from_one_servers_rows_is_its_counted_failure(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A bug that one server's rows find (here: resolving its card raises) fails that
        server alone, under ``evaluate``, logged once; the others are judged."""
        fake = Fake()
        fake.servers = {"a:8000": "healthy", "b:8000": "queue_bound", "c:8000": "healthy"}
        times = warm(fake, [NOW - 2 * STEP, NOW - STEP, NOW])
        resolve = HardwareResolver.resolve

        def fails_for_b(self: HardwareResolver, labels: Any, *rest: Any) -> Any:
            if labels.get("instance") == "b:8000":
                raise OverflowError("int too large to convert to float")
            return resolve(self, labels, *rest)

        monkeypatch.setattr(HardwareResolver, "resolve", fails_for_b)
        with query_api(fake) as url, capture_logs() as logs:
            source = run_ticks(fleet_settings(url), times, fake=fake)
        b = source.targets["vllm/b:8000"].state
        assert b.failures == {"evaluate": 3} and not b.up and "OverflowError" in b.last_error
        said = [e for e in logs if e["event"] == "scrape_failed" and e["target"] == "vllm/b:8000"]
        assert len(said) == 1
        for name in ("vllm/a:8000", "vllm/c:8000"):
            st = source.targets[name].state
            assert st.up and not st.failures and st.view is not None
            assert st.view.evaluation.at == NOW
        assert source.api.state.up and not source.api.state.failures

    def test_a_clock_that_goes_back_is_judged_from_there(self) -> None:
        """Before: a tick timed before the last was skipped, every tick until the clock
        caught up, the query API still up. Now it is judged, each server's window
        starting again (said once per server)."""
        fake = Fake()
        fake.servers = {"a:8000": "queue_bound"}
        times = warm(fake, [NOW - STEP, NOW, NOW - 300, NOW - 300 + STEP])
        with query_api(fake) as url, capture_logs() as logs:
            source = run_ticks(fleet_settings(url), times, fake=fake)
        st = source.targets["vllm/a:8000"].state
        assert st.view is not None and st.view.evaluation.at == NOW - 300 + STEP
        assert st.clock_steps_back == 1
        assert len([e for e in logs if e["event"] == "clock_went_back"]) == 1

    def test_many_servers_alike_make_one_line_per_event(self) -> None:
        """Before: each server discovered, failing or with unusable rows said its own line:
        2,000 servers made 6,000 lines on the first tick. Now one line per event a tick,
        with how many servers said it and the first few."""
        fake = Fake()
        fake.servers = {f"s{i}:8000": "healthy" for i in range(40)}
        answer = fake.answer

        def a_bad_row_each(query: str, at: float, **kw: Any) -> list[dict[str, Any]]:
            rows = answer(query, at, **kw)
            if fake.key_of(query)[0] == "running_mean":
                rows += [
                    {"metric": {**r["metric"], "le": "x"}, "value": [at, "NaN"]} for r in list(rows)
                ]
            return rows

        fake.answer = a_bad_row_each  # type: ignore[method-assign]
        times = warm(fake, [NOW - STEP, NOW])
        with query_api(fake) as url, capture_logs() as logs:
            source = run_ticks(fleet_settings(url), times, fake=fake)
        events = [e["event"] for e in logs]
        assert len(source.targets) == 40
        assert events.count("fleet_target_discovered") == 1
        (found,) = [e for e in logs if e["event"] == "fleet_target_discovered"]
        assert found["parts"] == 40 and len(found["first"]) == 5
        (unusable,) = [e for e in logs if e["event"] == "series_unusable"]
        assert unusable["parts"] == 40
        assert len(logs) <= 6, events


class TestStatusPageHistory:
    """Each server's status-page hour, one point per ``history_step_seconds``."""

    def test_a_point_per_step_and_the_page_says_so(self) -> None:
        fake = Fake()
        fake.servers = {"a:8000": "kv_pressure"}
        # Five ticks 5 s apart from a step's start: the four in it make one point.
        start = NOW - NOW % 60.0
        with query_api(fake) as url:
            source = run_ticks(
                fleet_settings(url, history_step_seconds=20),
                warm(fake, [start + STEP * i for i in range(1, 6)]),
                fake=fake,
            )
        state = source.targets["vllm/a:8000"].state
        assert state.history is not None
        assert state.history.step_seconds == 20.0
        window = state.history.windows(since=0.0)[MODEL]
        assert window.times == [start + 20.0, start + 25.0]
        assert window.step == 20.0
        doc = live_document([state], now=start + 25.0)
        assert dict(map(tuple, doc["facts"]))["chart points"].startswith("one per 20 s")

    def test_the_setting_and_its_bounds(self) -> None:
        settings = fleet_settings("http://127.0.0.1:9")
        assert settings.prometheus.history_step_seconds == 60.0
        rulebook = build_rulebook(settings)
        h = history(settings, rulebook)
        assert (h.step_seconds, h.capacity) == (60.0, 61)
        # Every server keeps the settings' names: one copy of each between them.
        other = history(settings, rulebook)
        assert h.settings_values == other.settings_values != {}
        assert all(a is b for a, b in zip(h.settings_values, other.settings_values, strict=True))
        # The sidecar keeps a point per evaluation whatever the fleet setting says.
        sidecar = load_settings(
            flags={"prometheus": {"url": "http://127.0.0.1:9", "history_step_seconds": 60}}
        )
        assert history(sidecar, build_rulebook(sidecar)).step_seconds == 0.0
        for bad in (-1, 3601):
            with pytest.raises(ConfigError, match=r"prometheus\.history_step_seconds"):
                fleet_settings("http://127.0.0.1:9", history_step_seconds=bad)
