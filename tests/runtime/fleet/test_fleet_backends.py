"""Fleet mode on the query APIs people scale Prometheus with (daemon/vllm_triage/fleet/:
backend.py, answers.py, pieces.py, completeness.py, source.py), against a local query
API answering in VictoriaMetrics', Thanos' and Mimir's documented shapes
(tests/support/fake_query_api.py; the real VictoriaMetrics is in
tests/system/test_integration.py):

- each backend read right: its build info tells it (where it can), its parameters go
  with every request, its tenant header, its partial answers refused;
- an answer that may miss data (partial, a series count that collapsed, a server twice,
  a server in two pieces) judges nothing: no incident opens or resolves from it;
- server-side sharding: each replica asks only for its own buckets, in pieces whose
  answers stay far under the body bound; series without the bucket label divided by the
  name's hash as before;
- the query API's own credentials and TLS (a token file read each tick, a private CA,
  a client certificate), its secrets never said.
"""

from __future__ import annotations

import json
import math
import ssl
from pathlib import Path
from typing import Any, ClassVar

import pytest
import trustme
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from vllm_triage.config.load import load_settings
from vllm_triage.errors import ConfigError, ScrapeError
from vllm_triage.fleet.answers import label_values, query_answer
from vllm_triage.fleet.backend import backend, detect
from vllm_triage.fleet.completeness import REASONS, SeriesDrop
from vllm_triage.fleet.pieces import matcher, owned, plan
from vllm_triage.fleet.queries import QueryPlan
from vllm_triage.fleet.signals import MAX_BOUNDS, Fleet, totals
from vllm_triage.fleet.source import PrometheusSource, shard_of, target_name

from support.fake_query_api import (
    MODEL,
    NOW,
    STEP,
    STORE_WARNING,
    Fake,
    fleet_settings,
    piece_of,
    query_api,
    run_ticks,
    warm,
    window_at,
    without_progress,
)

TICKS = [NOW - 2 * STEP, NOW - STEP, NOW]


def causes(source: PrometheusSource) -> dict[str, list[str]]:
    return {n: [a.cause for a in t.evaluator.incidents.active()] for n, t in source.targets.items()}


def judged_at(source: PrometheusSource) -> dict[str, float | None]:
    """Each server's last judged evaluation time."""
    return {
        n: (t.state.view.evaluation.at if t.state.view is not None else None)
        for n, t in source.targets.items()
    }


def queries_sent(fake: Fake) -> list[dict[str, str]]:
    return [f for f in fake.seen if "query" in f]


class TestAnswers:
    def body(self, **extra: Any) -> bytes:
        doc = {"status": "success", "data": {"resultType": "vector", "result": []}, **extra}
        return json.dumps(doc).encode()

    def test_a_whole_answer(self) -> None:
        reading = query_answer("k", self.body())
        assert reading.partial is None and reading.rows == [] and reading.notes == ()

    def test_victoriametrics_is_partial(self) -> None:
        assert query_answer("k", self.body(isPartial=True)).partial == (
            "isPartial: a storage node did not answer"
        )
        assert query_answer("k", self.body(isPartial=False)).partial is None

    def test_a_thanos_store_warning_is_partial(self) -> None:
        reading = query_answer("k", self.body(warnings=[STORE_WARNING]))
        assert reading.partial is not None and "10.0.0.7:10901" in reading.partial

    def test_promql_annotations_are_notes_not_missing_data(self) -> None:
        said = "PromQL info: metric might not be a counter, name does not end in _total"
        reading = query_answer("k", self.body(warnings=[said]))
        assert reading.partial is None and reading.notes == (said,)
        both = query_answer("k", self.body(warnings=[said, STORE_WARNING]))
        assert both.partial is not None and both.notes == (said,)

    def test_warnings_of_another_shape_are_partial(self) -> None:
        assert query_answer("k", self.body(warnings={"a": 1})).partial is not None
        assert query_answer("k", self.body(warnings=[7])).partial is not None

    @pytest.mark.parametrize(
        "body",
        [
            # A lone surrogate escaped in one label value: pydantic's parser refuses it,
            # the standard library reads it, so the other rows are judged as before.
            b'{"status": "success", "data": {"resultType": "vector", "result": '
            b'[{"metric": {"pod": "\\ud800"}, "value": [1, "2"]}, '
            b'{"metric": {"pod": "a"}, "value": [1, "3"]}]}}',
            # Nesting past pydantic's depth limit, within the standard library's.
            b'{"status": "success", "data": {"resultType": "vector", "result": '
            b'[{"metric": {"pod": "a"}, "value": [1, "3"], "x": '
            + b"[" * 300
            + b"]" * 300
            + b"}]}}",
            # UTF-16, which the standard library detects.
            json.dumps(
                {"status": "success", "data": {"resultType": "vector", "result": []}}
            ).encode("utf-16"),
        ],
        ids=["lone-surrogate-label", "deep-nesting", "utf-16"],
    )
    def test_what_the_fast_parser_refuses_is_read_as_before(self, body: bytes) -> None:
        assert query_answer("k", body).rows == json.loads(body)["data"]["result"]

    @given(
        st.recursive(
            st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(st.text(max_size=8), inner, max_size=4)
            ),
            max_leaves=30,
        )
    )
    @settings(max_examples=200, deadline=None)
    def test_the_fast_parser_reads_what_the_standard_library_reads(self, rows: Any) -> None:
        doc = {"status": "success", "data": {"resultType": "vector", "result": [rows]}}
        body = json.dumps(doc).encode()
        got = query_answer("k", body).rows
        # NaN is not equal to itself: compare as the standard library writes them.
        assert json.dumps(got) == json.dumps(json.loads(body)["data"]["result"])

    def test_label_values_keep_strings_and_say_partial(self) -> None:
        doc = {"status": "success", "data": ["a", 3, "b"], "warnings": [STORE_WARNING]}
        reading = label_values("x", json.dumps(doc).encode())
        assert reading.rows == ["a", "b"] and reading.partial is not None
        with pytest.raises(ScrapeError, match="not a label values answer"):
            label_values("x", b'{"status": "success", "data": {}}')


class TestBackends:
    @pytest.mark.parametrize(
        ("data", "kind"),
        [
            ({"version": "2.42.0", "revision": "x"}, "prometheus"),
            ({}, "victoriametrics"),
            ({"application": "Grafana Mimir", "version": "2.14.0"}, "mimir"),
            ({"version": "0.36.1"}, "prometheus"),  # Thanos: not told apart
        ],
        ids=["prometheus", "victoriametrics", "mimir", "thanos"],
    )
    def test_the_build_info_tells_what_it_can(self, data: dict[str, str], kind: str) -> None:
        said, how = detect(json.dumps({"status": "success", "data": data}).encode())
        assert said == kind and how.startswith("build info")

    def test_an_unreadable_build_info_is_prometheus(self) -> None:
        assert detect(b"<html>")[0] == "prometheus"
        assert detect(b'{"data": [1]}')[0] == "prometheus"

    def test_each_backend_asks_for_what_it_needs(self) -> None:
        vm = backend("victoriametrics")
        assert ("nocache", "1") in vm.params and ("deny_partial_response", "1") in vm.params
        assert (vm.increase, vm.changes) == ("increase_prometheus", "changes_prometheus")
        thanos = backend("thanos", replica_labels=("replica", "prometheus_replica"))
        assert thanos.params == (
            ("partial_response", "false"),
            ("dedup", "true"),
            ("replicaLabels[]", "replica"),
            ("replicaLabels[]", "prometheus_replica"),
        )
        assert backend("mimir").params == backend("prometheus").params == ()

    def test_victoriametrics_queries_read_as_prometheus(self) -> None:
        """Prometheus' increase and changes, and ranges a millisecond longer (they are
        open on the left there); the offset to the window's start stays the window."""
        vm = backend("victoriametrics")
        plan_ = QueryPlan(
            selector='{job="vllm"}',
            identity=("job", "instance"),
            window_seconds=60,
            step_seconds=15,
            increase=vm.increase,
            changes=vm.changes,
            range_pad_seconds=vm.range_pad_seconds,
        )
        q = {x.key: x.promql for x in plan_.queries()}
        assert "increase_prometheus(vllm:time_to_first_token_seconds_bucket" in q["ttft_bucket"]
        assert "[60001ms]" in q["ttft_bucket"] and "increase(" not in q["ttft_bucket"]
        assert "changes_prometheus(" in q["engine_changes"] and "[60001ms]" in q["engine_changes"]
        assert "[60001ms:15000ms]" in q["running_max"]
        assert "[15000ms:15000ms] offset 60000ms" in q["waiting_first"]

    @pytest.mark.parametrize(
        ("prometheus", "said"),
        [
            ({"backend": "mimir"}, "X-Scope-OrgID"),
            ({"tenant": "a", "headers": {"x-scope-orgid": "b"}}, "not both"),
            ({"replica_labels": ["replica"]}, "set backend: thanos"),
            ({"bearer_token": "t", "bearer_token_file": "/t"}, "bearer_token, bearer_token_file"),
            ({"shard": {"count": 300, "buckets": 256}}, "count 300 is above buckets 256"),
            ({"tls": {"key_file": "/k"}}, "key_file needs its cert_file"),
            ({"tenant": "a\nb"}, "tenant"),
        ],
        ids=[
            "mimir-without-tenant",
            "tenant-twice",
            "replica-labels-not-thanos",
            "two-bearer-tokens",
            "more-replicas-than-buckets",
            "key-without-cert",
            "tenant-with-newline",
        ],
    )
    def test_settings_that_cannot_work_are_refused(
        self, prometheus: dict[str, Any], said: str
    ) -> None:
        with pytest.raises(ConfigError, match=said):
            fleet_settings("http://127.0.0.1:9", **prometheus)


class TestPieces:
    def test_a_replica_owns_its_buckets_and_says_the_odd(self) -> None:
        mine, odd = owned(["0", "1", "2", "3", "10", "x", "-1", "", "007"], 1, 2)
        assert mine == [1, 3, 7] and odd == ["x", "-1", ""]
        every = [owned([str(b) for b in range(64)], k, 3)[0] for k in range(3)]
        assert sorted(b for m in every for b in m) == list(range(64))

    def test_the_matcher_lists_the_buckets(self) -> None:
        assert matcher("s", [3]) == 's="3"'
        assert matcher("s", [3, 7, 11]) == 's=~"3|7|11"'

    def test_pieces_hold_about_per_piece_servers(self) -> None:
        sizes = {b: 40 for b in range(0, 64, 2)}
        pieces = plan(range(0, 64, 2), sizes, "s", per_piece=100)
        assert [len(p.buckets) for p in pieces] == [2] * 16
        assert all(sum(sizes[b] for b in p.buckets) <= 100 for p in pieces)
        assert pieces[0].matcher == 's=~"0|2"'
        # Unknown buckets count as an eighth of a piece; a huge one is a piece alone.
        assert [len(p.buckets) for p in plan(range(20), {}, "s", per_piece=800)] == [8, 8, 4]
        big = plan([1, 2, 3], {2: 5000}, "s", per_piece=100)
        assert [p.buckets for p in big] == [(1,), (2,), (3,)]

    def test_a_server_in_two_pieces_is_split(self) -> None:
        fleet = Fleet(
            identity=("job", "instance"), name_of=lambda m: target_name(m, ["job", "instance"])
        )
        row = {"metric": {"job": "v", "instance": "a", "model_name": MODEL}, "value": [0, "1"]}
        fleet.read("running_mean", [row], piece=0)
        assert not fleet.servers["v/a"].split
        fleet.read("waiting_mean", [row], piece=3)
        assert fleet.servers["v/a"].split


def test_rows_missing_an_identity_label_are_read_as_their_own_server() -> None:
    """The row loop reads a row's identity in one call while every row has all of its
    labels; a row that misses one (a job label dropped by a relabel rule) is its own
    server, with None in the missing label's place, before and after it."""
    fleet = Fleet(
        identity=("job", "instance"), name_of=lambda m: target_name(m, ["job", "instance"])
    )
    rows = [
        {"metric": {"job": "v", "instance": "a", "model_name": MODEL}, "value": [0, "1"]},
        {"metric": {"instance": "b", "model_name": MODEL}, "value": [0, "2"]},
        {"metric": {"job": "v", "instance": "c", "model_name": MODEL}, "value": [0, "3"]},
        {"metric": {"job": "v", "instance": "b", "model_name": MODEL}, "value": [0, "4"]},
    ]
    fleet.read("running_mean", rows)
    one_by_one = Fleet(
        identity=("job", "instance"), name_of=lambda m: target_name(m, ["job", "instance"])
    )
    for row in rows:
        one_by_one.read("running_mean", [row])
    assert set(fleet.by_ident) == {("v", "a"), (None, "b"), ("v", "c"), ("v", "b")}
    seen = {n: s.models[MODEL].values["running_mean"] for n, s in fleet.servers.items()}
    assert seen == {
        n: s.models[MODEL].values["running_mean"] for n, s in one_by_one.servers.items()
    }
    assert fleet.rows == 4 and fleet.unusable == 0


class TestBucketRows:
    """A tick holds every server's bucket rows at once: each row's ``le`` is read once a
    tick (one float every server shares), the rows kept as a list of bounds and an array of
    counts a histogram."""

    @staticmethod
    def fleet() -> Fleet:
        return Fleet(
            identity=("job", "instance"), name_of=lambda m: target_name(m, ["job", "instance"])
        )

    @staticmethod
    def rows(instance: str, buckets: list[tuple[Any, str]]) -> list[dict[str, Any]]:
        """One row per (le, value); ``le`` None: a row without one."""
        labels = {"job": "v", "instance": instance, "model_name": MODEL}
        return [
            {"metric": labels if le is None else {**labels, "le": le}, "value": [0, v]}
            for le, v in buckets
        ]

    def test_bounds_in_any_order_make_the_histogram_and_are_shared(self) -> None:
        fleet = self.fleet()
        for instance in ("a", "b"):
            # Prometheus answers in no particular order ("+Inf" sorts first as text).
            buckets = [("+Inf", "9"), ("0.5", "4"), ("0.1", "1")]
            fleet.read("ttft_bucket", self.rows(instance, buckets))
            fleet.read("ttft_sum", self.rows(instance, [(None, "2.5")]))
            fleet.read("ttft_count", self.rows(instance, [(None, "9")]))
        a, b = (totals(fleet.servers[f"v/{i}"], MODEL, 0.0, 60.0).histograms["ttft"] for i in "ab")
        assert a.bounds == (0.1, 0.5, math.inf) and a.cumulative == (1.0, 4.0, 9.0)
        assert (a.count, a.sum) == (9.0, 2.5)
        assert all(x is y for x, y in zip(a.bounds, b.bounds, strict=True))

    def test_a_bucket_whose_le_is_not_a_number_is_left_out_and_said(self) -> None:
        fleet = self.fleet()
        rows = [("x", "1"), (["0.1"], "2"), (None, "4"), ("+Inf", "3")]
        fleet.read("ttft_bucket", self.rows("a", rows))
        server = fleet.servers["v/a"]
        assert server.problems == ["ttft_bucket: a bucket without a numeric le; left out"] * 3
        bounds, counts = server.models[MODEL].buckets["ttft"]
        assert bounds == [math.inf] and list(counts) == [3.0]
        assert fleet.bounds == {"+Inf": math.inf}

    @pytest.mark.parametrize(("total", "count"), [("-1", "9"), ("2.5", "-9")], ids=["sum", "count"])
    def test_a_negative_sum_or_count_is_left_out_and_said(self, total: str, count: str) -> None:
        """As the parser does: a histogram that says it observed below zero gives no
        mean and no quantile, and the server says why."""
        fleet = self.fleet()
        fleet.read("itl_bucket", self.rows("a", [("0.1", "1"), ("+Inf", "9")]))
        fleet.read("itl_sum", self.rows("a", [(None, total)]))
        fleet.read("itl_count", self.rows("a", [(None, count)]))
        server = fleet.servers["v/a"]
        assert "itl" not in totals(server, MODEL, 0.0, 60.0).histograms
        assert "itl: a negative _sum or _count; left out" in server.problems

    def test_the_numbers_remembered_are_bounded(self) -> None:
        fleet = self.fleet()
        odd = [(f"{i}.5", "1") for i in range(MAX_BOUNDS + 50)]
        fleet.read("ttft_bucket", self.rows("a", odd))
        assert len(fleet.bounds) == MAX_BOUNDS
        assert len(fleet.servers["v/a"].models[MODEL].buckets["ttft"][0]) == MAX_BOUNDS + 50


class TestSeriesDrop:
    def test_a_drop_is_missing_data_until_it_holds(self) -> None:
        """Below half of the last judged tick's rows: held; the third such tick in a
        row is judged and is the new baseline; a fall to just above half is judged."""
        watch = SeriesDrop(ratio=0.5, ticks=3)
        assert [watch.dropped(n) for n in (1000, 1100, 560)] == [False, False, False]
        watch = SeriesDrop(ratio=0.5, ticks=3)
        said = [watch.dropped(n) for n in (1000, 400, 420, 410, 400)]
        assert said == [False, True, True, False, False]
        assert watch.baseline == 400 and watch.low == 0

    def test_a_recovery_ends_the_drop(self) -> None:
        watch = SeriesDrop(ratio=0.5, ticks=3)
        said = [watch.dropped(n) for n in (1000, 100, 990, 100, 100)]
        assert said == [False, True, False, True, True]


class TestVictoriaMetrics:
    def test_told_by_its_build_info_and_asked_without_its_latency_offset(self) -> None:
        """``auto``: the empty build info says VictoriaMetrics; every query then carries
        ``nocache=1`` (its "now" is the time asked, not 30 s before) and
        ``deny_partial_response=1``, and asks Prometheus' increase; the signals are the
        sidecar's."""
        fake = Fake(kind="victoriametrics", servers={"a:8000": "kv_pressure"})
        with query_api(fake) as url:
            source = run_ticks(fleet_settings(url), warm(fake, [NOW]), fake=fake)
        assert source.backend is not None and source.backend.kind == "victoriametrics"
        sent = queries_sent(fake)
        assert sent and all(f["nocache"] == "1" for f in sent)
        assert all(f["deny_partial_response"] == "1" for f in sent)
        assert any("increase_prometheus(" in f["query"] for f in sent)
        assert not any("increase(" in f["query"].replace("_prometheus(", "") for f in sent)
        view = source.targets["vllm/a:8000"].state.view
        assert view is not None
        assert view.evaluation.signals[MODEL] == without_progress(
            window_at("kv_pressure", NOW).signals(MODEL)
        )

    def test_a_storage_node_down_is_refused_and_judges_nothing(self) -> None:
        """Its cluster answers partial when a storage node is down; asked to deny that,
        it refuses: the tick fails as the API's (counted, said), nothing is judged."""
        fake = Fake(kind="victoriametrics", servers={"a:8000": "kv_pressure"})
        times = warm(fake, [*TICKS, NOW + STEP])

        def node_down(source: PrometheusSource, i: int) -> None:
            fake.node_down = i >= 2

        with query_api(fake) as url:
            source = run_ticks(fleet_settings(url), times, fake=fake, between=node_down)
        api = source.api.state
        assert api.failures["http_status"] == 1 and "partial response denied" in api.last_error
        assert judged_at(source) == {"vllm/a:8000": NOW}  # the failed tick judged nothing


class TestMimir:
    def test_without_a_tenant_it_says_x_scope_orgid(self) -> None:
        fake = Fake(kind="mimir", servers={"a:8000": "healthy"})
        with query_api(fake) as url, capture_logs() as logs:
            source = run_ticks(fleet_settings(url), warm(fake, [NOW]), fake=fake)
        api = source.api.state
        assert not api.up and not source.targets
        assert "HTTP 401" in api.last_error and "no org id" in api.last_error
        assert "prometheus.tenant (sent as X-Scope-OrgID)" in api.last_error
        said = [e for e in logs if e["event"] == "scrape_failed"]
        assert len(said) == 1 and "X-Scope-OrgID" in said[0]["err"]

    def test_with_its_tenant_every_request_carries_it(self) -> None:
        fake = Fake(kind="mimir", servers={"a:8000": "queue_bound"})
        with query_api(fake) as url:
            source = run_ticks(
                fleet_settings(url, tenant="team-a|team-b"), warm(fake, TICKS), fake=fake
            )
        assert source.backend is not None and source.backend.kind == "mimir"
        assert {h.get("X-Scope-OrgID") for h in fake.headers} == {"team-a|team-b"}
        assert causes(source) == {"vllm/a:8000": ["queue_bound"]}


class TestThanos:
    SERVERS: ClassVar[dict[str, str]] = {
        "a:8000": "kv_pressure",
        "b:8000": "healthy",
        "c:8000": "queue_bound",
    }
    WANT: ClassVar[dict[str, list[str]]] = {
        "vllm/a:8000": ["kv_pressure"],
        "vllm/b:8000": [],
        "vllm/c:8000": ["queue_bound"],
    }

    def test_named_it_deduplicates_and_refuses_partial_answers(self) -> None:
        """An HA pair behind the querier: asked with ``dedup`` and the pair's replica
        label, it answers each server once, and the verdicts are the sidecar's."""
        fake = Fake(kind="thanos", servers=dict(self.SERVERS), ha_pair=True)
        with query_api(fake) as url:
            settings = fleet_settings(url, backend="thanos", replica_labels=["replica"])
            source = run_ticks(settings, warm(fake, TICKS), fake=fake)
        sent = queries_sent(fake)
        assert all(f["partial_response"] == "false" and f["dedup"] == "true" for f in sent)
        assert all(f["replicaLabels[]"] == "replica" for f in sent)
        assert causes(source) == self.WANT
        assert source.api.state.cannot_tell == dict.fromkeys(REASONS, 0)

    def test_an_ha_pair_not_deduplicated_changes_no_verdict(self) -> None:
        """The querier loses its replica label: every server's series come twice, its
        sums doubled. Each is "cannot tell (duplicated)": nothing resolves, nothing new
        opens, the verdicts stand; counted, said once with the fix, and judged again
        once the answers are whole."""
        fake = Fake(kind="thanos", servers=dict(self.SERVERS))
        times = warm(fake, [NOW - 7 * STEP + STEP * i for i in range(8)])
        before: dict[str, Any] = {}

        def pair(source: PrometheusSource, i: int) -> None:
            fake.ha_pair = i in (2, 3, 4, 5)  # ticks 3 to 6 read duplicated answers
            if i == 2:
                before.update(causes=causes(source), at=judged_at(source))
            if i == 5:
                assert causes(source) == before["causes"]
                assert judged_at(source) == before["at"]
                assert source.api.state.cannot_tell == {
                    **dict.fromkeys(REASONS, 0),
                    "duplicated": 3,
                }

        with query_api(fake) as url, capture_logs() as logs:
            source = run_ticks(
                fleet_settings(url, backend="prometheus"), times, fake=fake, between=pair
            )
        assert before["causes"] == self.WANT and causes(source) == self.WANT
        said = [e for e in logs if e["event"] == "fleet_cannot_tell"]
        assert len(said) == 1 and said[0]["servers"] == {"duplicated": 3}
        assert "replica_labels" in said[0]["hint"]
        assert [e["event"] for e in logs if e["event"] == "fleet_answers_whole"] == [
            "fleet_answers_whole"
        ]
        assert set(judged_at(source).values()) == {times[-1]}

    def test_a_failed_store_named_thanos_fails_the_tick(self) -> None:
        fake = Fake(kind="thanos", servers=dict(self.SERVERS))
        times = warm(fake, [*TICKS, NOW + STEP])

        def store(source: PrometheusSource, i: int) -> None:
            fake.store_down = i >= 2

        with query_api(fake) as url:
            settings = fleet_settings(url, backend="thanos")
            source = run_ticks(settings, times, fake=fake, between=store)
        api = source.api.state
        assert not api.up and api.failures["http_status"] == 1
        assert "HTTP 422" in api.last_error and "10.0.0.7:10901" in api.last_error
        assert set(judged_at(source).values()) == {NOW}
        assert causes(source) == self.WANT

    def test_a_partial_answer_changes_no_verdict(self) -> None:
        """Read as Prometheus (partial responses are Thanos' default): the store's
        warning comes with half the servers missing. Every server is "cannot tell
        (partial)": the missing ones are not marked down, the open incidents stay open,
        nothing new opens; counted, one log line, until the answers are whole."""
        fake = Fake(kind="thanos", servers=dict(self.SERVERS))
        times = warm(fake, [NOW - 7 * STEP + STEP * i for i in range(8)])

        def store(source: PrometheusSource, i: int) -> None:
            fake.store_down = i in (2, 3, 4, 5)  # ticks 3 to 6 read partial answers
            if i == 5:
                assert causes(source) == self.WANT
                assert set(judged_at(source).values()) == {times[2]}
                assert all(t.state.up for t in source.targets.values())
                assert source.api.state.cannot_tell["partial"] == 3

        with query_api(fake) as url, capture_logs() as logs:
            source = run_ticks(fleet_settings(url), times, fake=fake, between=store)
        api = source.api.state
        assert api.up and api.partial_answers == 4 * len(source.queries)
        said = [e for e in logs if e["event"] == "fleet_cannot_tell"]
        assert len(said) == 1 and said[0]["servers"] == {"partial": 3}  # one of them unseen
        assert "10.0.0.7:10901" in said[0]["partial"]
        assert set(judged_at(source).values()) == {times[-1]}
        assert causes(source) == self.WANT


class TestSeriesDropThroughTheApi:
    def test_servers_gone_without_a_word_are_held_until_the_drop_holds(self) -> None:
        """Three of four servers vanish from the answers with no warning (a store that
        answered empty): two ticks judge nobody and mark nobody down; the third such
        tick is a scale-down, the new baseline: the three are marked down."""
        servers = {
            "a:8000": "kv_pressure",
            "b:8000": "healthy",
            "c:8000": "healthy",
            "d:8000": "healthy",
        }
        fake = Fake(servers=dict(servers))
        times = warm(fake, [NOW - 5 * STEP + STEP * i for i in range(6)])
        seen: list[tuple[int, int]] = []

        def vanish(source: PrometheusSource, i: int) -> None:
            if i == 2:
                fake.servers = {"a:8000": "kv_pressure"}
            held = (source.api.state.cannot_tell or {}).get("series_drop", -1)
            seen.append((held, sum(t.state.up for t in source.targets.values())))

        with query_api(fake) as url:
            source = run_ticks(fleet_settings(url), times, fake=fake, between=vanish)
        # (servers held as "cannot tell", servers up) after each tick
        assert seen == [(0, 4), (0, 4), (0, 4), (4, 4), (4, 4), (0, 1)]
        assert causes(source)["vllm/a:8000"] == ["kv_pressure"]


def bucket_fleet(labelled: int, unlabelled: int, buckets: int) -> Fake:
    """A fleet of healthy servers: ``labelled`` of them with a shard bucket (spread over
    ``buckets``), ``unlabelled`` without."""
    fake = Fake()
    for i in range(labelled + unlabelled):
        fake.servers[f"s{i}:8000"] = "healthy"
        if i < labelled:
            fake.buckets[f"s{i}:8000"] = i % buckets
    return fake


class TestServerSideShards:
    def test_each_replica_asks_only_for_its_own_buckets(self) -> None:
        """Twelve servers in eight buckets and four without the label, two replicas: each
        asks the query API only for its own buckets (and for the unlabelled series,
        divided by the name's hash as before); together they judge every server once."""
        fake = bucket_fleet(12, 4, 8)
        names = {f"vllm/{i}" for i in fake.servers}
        judged = []
        for k in (0, 1):
            fake.seen.clear()
            with query_api(fake) as url:
                settings = fleet_settings(url, shard={"index": k, "count": 2, "buckets": 8})
                source = run_ticks(settings, warm(fake, [NOW]), fake=fake)
            mine = {
                f"vllm/{i}"
                for i in fake.servers
                if (
                    fake.buckets[i] % 2 == k if i in fake.buckets else shard_of(f"vllm/{i}", 2) == k
                )
            }
            assert set(source.targets) == mine
            asked = set().union(*(piece_of(f["query"])[1] or {"*"} for f in queries_sent(fake)))
            assert asked == {str(b) for b in range(k, 8, 2)} | {""}
            # Its answers held its own labelled servers and every unlabelled one.
            assert source.seen == len([i for i in fake.servers if fake.buckets.get(i, k) % 2 == k])
            judged.append(set(source.targets))
        assert judged[0] | judged[1] == names and not judged[0] & judged[1]

    def test_pieces_keep_every_answer_far_under_the_bound(self) -> None:
        """A bound that 48 servers' largest answer would pass: after one tick the replica
        knows each bucket's servers and its largest answer per server, and the next
        ticks' pieces keep every answer under a quarter of max_body_bytes."""
        fake = bucket_fleet(48, 0, 48)
        bound = 64 * 1024
        with query_api(fake) as url:
            settings = fleet_settings(url, shard={"buckets": 48}, top={"max_body_bytes": bound})
            source = run_ticks(settings, warm(fake, TICKS), fake=fake)
        assert source.api.state.up, source.api.state.last_error
        assert len(source.targets) == 48
        first = max(n for at, n in fake.sizes if at == TICKS[0])
        later = max(n for at, n in fake.sizes if at > TICKS[0])
        assert first > bound / 4 >= later, (first, later)
        assert 1 < source.per_piece < 48 and len(source.pieces) > 4

    def test_a_partial_piece_holds_only_its_own_servers(self) -> None:
        """A store holding bucket 3 fails: its piece's servers cannot be told; the
        other piece's are judged."""
        fake = bucket_fleet(16, 0, 16)
        fake.store_down, fake.failing_buckets = True, {3}
        with query_api(fake) as url:
            source = run_ticks(
                fleet_settings(url, shard={"buckets": 16}), warm(fake, [NOW]), fake=fake
            )
        pieces = [p for p in source.pieces if p.buckets]
        assert len(pieces) == 2 and 3 in pieces[0].buckets
        held = {f"vllm/{i}" for i, b in fake.buckets.items() if b in pieces[0].buckets}
        assert set(source.targets) == {f"vllm/{i}" for i in fake.servers} - held
        assert source.api.state.cannot_tell is not None
        assert 0 < source.api.state.cannot_tell["partial"] <= len(held)


class TestCredentials:
    def test_a_token_file_is_read_each_tick_and_never_said(self, tmp_path: Path) -> None:
        """A rotated token (Kubernetes rewrites the file) is the next tick's; a file that
        is gone fails the tick as ``auth``, naming the file, not the token."""
        token = tmp_path / "token"
        token.write_text("FIRST-S3CRET-token\n")
        fake = Fake(servers={"a:8000": "healthy"})

        def rotate(source: PrometheusSource, i: int) -> None:
            if i == 0:
                token.write_text("SECOND-S3CRET-token")
            if i == 1:
                token.unlink()

        with query_api(fake) as url, capture_logs() as logs:
            settings = fleet_settings(url, bearer_token_file=str(token))
            source = run_ticks(settings, warm(fake, TICKS), fake=fake, between=rotate)
        sent = [h.get("Authorization") for h in fake.headers]
        assert sent[0] == "Bearer FIRST-S3CRET-token" and sent[-1] == "Bearer SECOND-S3CRET-token"
        api = source.api.state
        assert api.failures["auth"] == 1 and str(token) in api.last_error
        assert "S3CRET" not in json.dumps(logs, default=str) + api.last_error

    def test_basic_auth_and_a_gateways_headers_go_with_every_request(self) -> None:
        fake = Fake(servers={"a:8000": "healthy"})
        with query_api(fake) as url:
            settings = fleet_settings(
                url,
                basic_auth={"username": "triage", "password": "S3CRET-pw"},
                headers={"X-Gateway-Key": "S3CRET-key"},
            )
            run_ticks(settings, warm(fake, [NOW]), fake=fake)
        assert {h.get("Authorization") for h in fake.headers} == {"Basic dHJpYWdlOlMzQ1JFVC1wdw=="}
        assert {h.get("X-Gateway-Key") for h in fake.headers} == {"S3CRET-key"}
        shown = repr(settings.prometheus) + settings.model_dump_json()
        assert "S3CRET" not in shown

    def test_a_relative_token_or_tls_file_is_beside_the_settings(self, tmp_path: Path) -> None:
        cfg = tmp_path / "triage.yaml"
        cfg.write_text(
            "source: prometheus\nprometheus:\n  url: https://127.0.0.1:9\n"
            "  bearer_token_file: secrets/token\n"
            "  tls: {ca_file: ca.pem, cert_file: /abs/client.pem}\n"
        )
        prom = load_settings(cfg).prometheus
        assert prom is not None
        assert prom.bearer_token_file == tmp_path / "secrets" / "token"
        assert prom.tls.ca_file == tmp_path / "ca.pem"
        assert prom.tls.cert_file == Path("/abs/client.pem")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def tls_server(ca: trustme.CA, *, client_cert: bool) -> ssl.SSLContext:
    """A server context for 127.0.0.1 signed by ``ca``; with ``client_cert`` it asks for
    a client certificate signed by ``ca`` too (mutual TLS)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    if client_cert:
        ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class TestTls:
    def test_a_private_ca_and_a_client_certificate(self, tmp_path: Path, ca: trustme.CA) -> None:
        ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        client = ca.issue_cert("vllm-triage@example.com")
        client.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "client.pem"))
        fake = Fake(servers={"a:8000": "kv_pressure"})
        tls = {"ca_file": str(tmp_path / "ca.pem"), "cert_file": str(tmp_path / "client.pem")}
        with query_api(fake, tls=tls_server(ca, client_cert=True)) as url:
            assert url.startswith("https://")
            source = run_ticks(fleet_settings(url, tls=tls), warm(fake, TICKS), fake=fake)
            without = run_ticks(fleet_settings(url, tls={"ca_file": tls["ca_file"]}), [NOW])
        assert source.api.state.up and causes(source) == {"vllm/a:8000": ["kv_pressure"]}
        assert not without.api.state.up and not without.targets
        assert "wants a client certificate" in without.api.state.last_error

    def test_an_untrusted_certificate_is_said(self, ca: trustme.CA) -> None:
        with query_api(Fake(), tls=tls_server(ca, client_cert=False)) as url:
            source = run_ticks(fleet_settings(url), [NOW])
        api = source.api.state
        assert not api.up and "certificate is not trusted" in api.last_error
        insecure = {"insecure_skip_verify": True}
        fake = Fake()
        with query_api(fake, tls=tls_server(ca, client_cert=False)) as url:
            assert run_ticks(fleet_settings(url, tls=insecure), [NOW], fake=fake).api.state.up

    def test_a_missing_file_fails_at_start_naming_it(self, tmp_path: Path) -> None:
        settings = fleet_settings("https://127.0.0.1:9", tls={"ca_file": str(tmp_path / "no.pem")})
        with pytest.raises(ConfigError, match=r"prometheus\.tls\.ca_file: cannot read .*no\.pem"):
            run_ticks(settings, [NOW])
        settings = fleet_settings(
            "https://127.0.0.1:9", tls={"cert_file": str(tmp_path / "client.pem")}
        )
        with pytest.raises(ConfigError, match=r"prometheus\.tls\.cert_file: cannot load"):
            run_ticks(settings, [NOW])
