"""Tests for daemon/vllm_triage/serve/exporter.py: the derived /metrics, rendered from real
evaluations.

Each target's state is built the way the scrape loop builds it, from a bundled
simulator scenario run through the same parser, window, classifier and incident tracker
(in virtual time: a minute of scrapes takes a fraction of a second), then rendered with
prometheus_client and read back with its reference parser.
"""

from __future__ import annotations

import asyncio
import dataclasses
import platform
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from vllm_triage import __version__
from vllm_triage.config.schema import ReceiverSettings
from vllm_triage.demo.offline import START_AT
from vllm_triage.notify.delivery import Delivery
from vllm_triage.notify.receivers import build_receiver
from vllm_triage.serve.exporter import build_registry
from vllm_triage.serve.status import live_document
from vllm_triage.state import ProbeStats, TargetState
from vllm_triage.store import Notification

from support.clirun import HANG_S
from support.watched import MODEL, watched

P = "vllm_triage_"
#: The state set's values: healthy, then the four causes.
DIAGNOSES = ("healthy", "stalled", "kv_pressure", "queue_bound", "prefill_bound", "decode_bound")
#: The per-model signal gauges, shown only while a target is up.
SIGNAL_FAMILIES = (
    "ttft_p50_seconds",
    "ttft_p90_seconds",
    "ttft_p99_seconds",
    "itl_p50_seconds",
    "itl_p99_seconds",
    "ttft_mean_seconds",
    "itl_mean_seconds",
    "queue_time_ttft_ratio",
    "prefill_time_ratio",
    "requests_waiting",
    "requests_running",
    "kv_cache_usage_ratio",
    "kv_cache_usage_max_ratio",
    "kv_headroom_requests",
    "preemptions_per_second",
    "decode_tokens_per_second",
    "decode_ceiling_tokens_per_second",
    "decode_ceiling_ratio",
    "decode_roofline_ratio",
    "decode_step_seconds",
    "decode_step_floor_seconds",
    "decode_tokens_per_step",
    "decode_step_tokens",
    "prompt_tokens_per_second",
    "generation_tokens_per_second",
    "decode_step_bytes",
    "decode_binding_resource",
    "no_progress_seconds",
    "last_progress_timestamp_seconds",
)


def render(states: Sequence[TargetState], deliveries: Sequence[Delivery] = ()) -> str:
    registry = build_registry(lambda: list(states), lambda: list(deliveries))
    return generate_latest(registry).decode("utf-8")


def samples(text: str, name: str, **labels: str) -> list[Sample]:
    """The samples called ``name`` (a sample name, ``_total`` included) with ``labels``."""
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def value(text: str, name: str, **labels: str) -> float:
    found = samples(text, name, **labels)
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0].value


@pytest.fixture(scope="module")
def kv() -> TargetState:
    state = watched("kv_pressure")
    assert state.view is not None and [a.cause for a in state.view.active] == ["kv_pressure"]
    return state


@pytest.fixture(scope="module")
def healthy() -> TargetState:
    state = watched("healthy")
    assert state.view is not None and not state.view.active
    return state


@pytest.fixture(scope="module")
def text(kv: TargetState, healthy: TargetState) -> str:
    return render([kv, healthy])


@pytest.fixture
def deliveries() -> Iterator[list[Delivery]]:
    client = httpx.AsyncClient()
    hook = ReceiverSettings(
        type="alertmanager_webhook", url="http://127.0.0.1:9/hook", queue_size=1
    )
    slack = ReceiverSettings(type="slack", url="http://127.0.0.1:9/slack")
    ops = Delivery(build_receiver("ops", hook, "http://127.0.0.1:9468"), client)
    chat = Delivery(build_receiver("chat", slack, "http://127.0.0.1:9468"), client)
    yield [ops, chat]
    asyncio.run(client.aclose())


class TestNaming:
    def test_every_family_is_ours_or_the_process(self, text: str) -> None:
        """Only vllm_triage_* and process_* families; the main ones are all there."""
        names = [f.name for f in text_string_to_metric_families(text)]
        assert names and all(n.startswith((P, "process_")) for n in names), names
        for expected in ("target_up", "diagnosis", "slo_breach", "build_info", *SIGNAL_FAMILIES):
            assert P + expected in names

    def test_counters_end_in_total_and_gauges_do_not(self, text: str) -> None:
        """Per the TYPE lines and the samples: _total for counters only."""
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE))
        counters = [n for n, t in types.items() if t == "counter"]
        assert f"{P}scrapes_total" in counters and f"{P}incidents_opened_total" in counters
        assert all(n.endswith("_total") for n in counters), counters
        others = [n for n, t in types.items() if t != "counter"]
        assert not [n for n in others if n.endswith("_total")], others
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if family.type == "counter":
                    assert s.name == family.name + "_total", s
                else:
                    assert not s.name.endswith("_total"), s

    def test_build_info(self, text: str) -> None:
        labels = {"version": __version__, "python_version": platform.python_version()}
        assert value(text, P + "build_info", **labels) == 1.0


class TestDiagnosis:
    def test_state_set_has_exactly_one_cause(self, text: str) -> None:
        """Per (target, model): one series per diagnosis, exactly one of them 1."""
        expected = {"kv_pressure": "kv_pressure", "healthy": "healthy"}
        for target, current in expected.items():
            found = samples(text, P + "diagnosis", target=target, model_name=MODEL)
            assert sorted(s.labels["diagnosis"] for s in found) == sorted(DIAGNOSES)
            ones = [s.labels["diagnosis"] for s in found if s.value == 1.0]
            assert ones == [current], (target, found)
            assert all(s.value in (0.0, 1.0) for s in found)

    def test_breaches_and_incidents_opened(self, text: str) -> None:
        """The KV-pressure target breaches its preemption SLO and opened one incident."""
        breach = {"target": "kv_pressure", "model_name": MODEL}
        assert value(text, P + "slo_breach", slo="kv_preemptions", **breach) == 1.0
        healthy = samples(text, P + "slo_breach", target="healthy")
        assert len(healthy) == 5 and all(s.value == 0.0 for s in healthy)
        opened = {"target": "kv_pressure", "diagnosis": "kv_pressure"}
        assert value(text, P + "incidents_opened_total", **opened) == 1.0
        assert not samples(text, P + "incidents_opened_total", target="healthy")


class TestSignals:
    def test_decode_ceiling_ratio_is_measured_over_ceiling(self, text: str) -> None:
        """Decode steps (a 48-token prompt now and then beside the streams): the measured
        per-stream rate over the ceiling; a CPU's 90 GB/s over an 8B model's 16 GB."""
        decoding = render([watched("decode_bound", duration_s=120.0)])
        labels = {"target": "decode_bound", "model_name": MODEL}
        measured = value(decoding, P + "decode_tokens_per_second", **labels)
        ceiling = value(decoding, P + "decode_ceiling_tokens_per_second", **labels)
        ratio = value(decoding, P + "decode_ceiling_ratio", **labels)
        assert 5 < ceiling < 6.5
        assert ratio == pytest.approx(measured / ceiling, rel=1e-4)

    def test_no_decode_rate_from_steps_that_carry_prefill(self, text: str) -> None:
        """The KV-pressure load recomputes preempted prompts in every other step: its
        inter-token gaps are mixed steps', so no decode rate (nor its ratio) is exported,
        while the ceiling itself is."""
        labels = {"target": "kv_pressure", "model_name": MODEL}
        assert not samples(text, P + "decode_tokens_per_second", **labels)
        assert not samples(text, P + "decode_ceiling_ratio", **labels)
        assert 100 < value(text, P + "decode_ceiling_tokens_per_second", **labels) < 150

    def test_decode_roofline_is_floor_over_step(self, text: str) -> None:
        """The step roofline, healthy or not: floor / mean ITL, its byte split (the weights,
        and the KV the running requests hold: the demo tells the daemon the model's KV bytes
        per token, and the pool's size comes from cache_config_info), and which resource
        binds."""
        for target in ("kv_pressure", "healthy"):
            labels = {"target": target, "model_name": MODEL}
            step = value(text, P + "decode_step_seconds", **labels)
            floor = value(text, P + "decode_step_floor_seconds", **labels)
            assert step == pytest.approx(value(text, P + "itl_mean_seconds", **labels), rel=1e-4)
            ratio = value(text, P + "decode_roofline_ratio", **labels)
            assert ratio == pytest.approx(floor / step, rel=1e-4)
            weights = value(text, P + "decode_step_bytes", part="weights", **labels)
            assert weights == pytest.approx(16.06e9)
            kv = value(text, P + "decode_step_bytes", part="kv", **labels)
            assert 0 < kv <= 32_768 * 131_072  # at most the whole pool
            assert value(text, P + "decode_binding_resource", resource="memory", **labels) == 1
            assert value(text, P + "decode_binding_resource", resource="compute", **labels) == 0
            assert value(text, P + "decode_tokens_per_step", **labels) == 1.0

    def test_quantile_gauges(self, text: str) -> None:
        """TTFT p50, p90, p99 and ITL p50, p99, one gauge each, ascending, per target."""
        for target in ("kv_pressure", "healthy"):
            for family, pcts in (("ttft", ["50", "90", "99"]), ("itl", ["50", "99"])):
                values = [
                    value(text, f"{P}{family}_p{pct}_seconds", target=target, model_name=MODEL)
                    for pct in pcts
                ]
                assert values == sorted(values) and values[0] > 0

    def test_the_kv_target_looks_like_kv_pressure(self, text: str) -> None:
        """Sanity of the numbers themselves: a nearly full pool against a nearly empty one."""
        kv = {"target": "kv_pressure", "model_name": MODEL}
        ok = {"target": "healthy", "model_name": MODEL}
        assert value(text, P + "kv_cache_usage_max_ratio", **kv) > 0.9
        assert value(text, P + "kv_cache_usage_ratio", **ok) < 0.1
        assert value(text, P + "preemptions_per_second", **kv) > 0
        assert value(text, P + "preemptions_per_second", **ok) == 0

    def test_ratios_are_fractions(self, text: str) -> None:
        """Every _ratio is within 0..1, except measured-over-ceiling decode and the load
        ratio (arrivals over capacity: above 1 is an overloaded server)."""
        ratios = [
            s
            for family in text_string_to_metric_families(text)
            if family.name.endswith("_ratio")
            for s in family.samples
        ]
        assert len(ratios) >= 7, ratios
        for s in ratios:
            if s.name in (
                P + "decode_ceiling_ratio",
                P + "decode_roofline_ratio",
                P + "load_ratio",
            ):
                assert s.value > 0, s
            else:
                assert 0.0 <= s.value <= 1.0, s

    def test_a_healthy_server_exports_what_its_page_charts(self) -> None:
        """One number, one source: a healthy server's derived gauges (KV headroom, the
        decode ceiling and roofline) are the numbers the status page charts for its last
        evaluation (``Evaluation.measurements``), not absent because the diagnosis holds
        no evidence while healthy."""
        state = watched("healthy", duration_s=120.0)
        view = state.view
        assert view is not None and not view.evaluation.transitions
        [(_model, d)] = view.evaluation.diagnoses.items()
        assert d.cause is None and not d.evidence.get("kv_headroom_requests")
        text = render([state])
        doc = live_document([state], now=view.evaluation.at)
        [section] = doc["sections"]
        pairs = {  # exported gauge -> charted key
            "kv_headroom_requests": "kv_headroom_requests",
            "decode_ceiling_ratio": "decode_ceiling_ratio",
            "decode_roofline_ratio": "decode_roofline_ratio",
        }
        for gauge, key in pairs.items():
            charted = section["values"][key][-1]
            exported = samples(text, P + gauge, target="healthy")
            if key == "decode_ceiling_ratio":
                # Its steps carry the prompts' prefill: no decode rate, charted or exported.
                assert charted is None and not exported, key
                continue
            assert charted is not None, key
            assert exported[0].value == pytest.approx(charted, rel=1e-3), gauge

    def test_an_unknown_number_is_absent_not_zero(self) -> None:
        """With no hardware or model facts there is no ceiling: no sample, rather than 0."""
        state = watched("healthy", duration_s=60.0, facts=False)
        text = render([state])
        for name in ("decode_ceiling_tokens_per_second", "decode_ceiling_ratio"):
            assert not samples(text, P + name, target="healthy")
        assert samples(text, P + "kv_headroom_requests", target="healthy")


class TestTargetHealth:
    def test_up_target(self, text: str, kv: TargetState) -> None:
        assert value(text, P + "target_up", target="kv_pressure") == 1.0
        assert value(text, P + "scrapes_total", target="kv_pressure") == kv.scrapes == 13
        assert value(text, P + "scrape_duration_seconds", target="kv_pressure") == 0.012
        last = value(text, P + "last_scrape_timestamp_seconds", target="kv_pressure")
        assert last == START_AT + 60

    def test_down_target_keeps_its_diagnosis_only(self, kv: TargetState) -> None:
        """A failed last scrape: target_up 0, no signals, the open incident still shown."""
        down = dataclasses.replace(kv, name="down", up=False)
        down.failures = down.failures + type(down.failures)({"connect": 2, "timeout": 1})
        text = render([down])
        assert value(text, P + "target_up", target="down") == 0.0
        for name in SIGNAL_FAMILIES:
            assert not samples(text, P + name), name
        state = samples(text, P + "diagnosis", target="down", model_name=MODEL)
        assert {s.labels["diagnosis"]: s.value for s in state}["kv_pressure"] == 1.0
        assert sum(s.value for s in state) == 1.0
        assert value(text, P + "scrape_failures_total", target="down", reason="connect") == 2
        assert value(text, P + "scrape_failures_total", target="down", reason="timeout") == 1

    def test_never_scraped_target(self) -> None:
        """Before the first scrape: down, zero scrapes, and nothing else about it."""
        text = render([TargetState("new", "http://127.0.0.1:1/metrics", None)])
        assert value(text, P + "target_up", target="new") == 0.0
        assert value(text, P + "scrapes_total", target="new") == 0.0
        for name in ("scrape_duration_seconds", "last_scrape_timestamp_seconds", "diagnosis"):
            assert not samples(text, P + name), name

    def test_collects_the_latest_state(self, kv: TargetState) -> None:
        """The collector reads the targets on every collection, not once."""
        current: list[TargetState] = []
        registry = build_registry(lambda: current, lambda: [])
        assert not samples(generate_latest(registry).decode(), P + "target_up")
        current.append(kv)
        assert value(generate_latest(registry).decode(), P + "target_up", target=kv.name) == 1


class TestStalls:
    def test_a_hung_engine_shows_in_its_gauges(self) -> None:
        """The stalled scenario four minutes in (hung since 240 s): the diagnosis is
        stalled, and the time without progress counts from the last engine update."""
        state = watched("stalled", duration_s=300.0)
        text = render([state])
        labels = {"target": "stalled", "model_name": MODEL}
        assert value(text, P + "diagnosis", diagnosis="stalled", **labels) == 1.0
        assert value(text, P + "slo_breach", slo="no_progress", **labels) == 1.0
        assert value(text, P + "no_progress_seconds", **labels) == 60.0
        assert value(text, P + "last_progress_timestamp_seconds", **labels) == START_AT + 240

    def test_a_stepping_engine_shows_zero(self, text: str) -> None:
        assert value(text, P + "no_progress_seconds", target="kv_pressure", model_name=MODEL) == 0

    def test_probe_counts_only_for_targets_with_a_probe(self, kv: TargetState) -> None:
        probed = dataclasses.replace(kv, name="probed")
        probed.probe = ProbeStats(url="http://127.0.0.1:1/v1/completions", probes=7)
        probed.probe.failures.update({"timeout": 2, "http_status": 1})
        probed.probe.last_seconds = 0.042
        text = render([kv, probed])
        assert value(text, P + "probes_total", target="probed") == 7
        assert value(text, P + "probe_failures_total", target="probed", reason="timeout") == 2
        assert value(text, P + "probe_failures_total", target="probed", reason="http_status") == 1
        assert value(text, P + "probe_seconds", target="probed") == 0.042
        assert not samples(text, P + "probes_total", target="kv_pressure")


class TestNotifications:
    def test_delivery_stats_per_receiver(self, deliveries: list[Delivery]) -> None:
        ops, chat = deliveries
        ops.stats.sent, ops.stats.retried, ops.stats.failed = 5, 3, 1
        chat.stats.sent = 2
        ops.submit(Notification(b"{}", "first"))
        ops.submit(Notification(b"{}", "second"))  # queue_size 1: the first is dropped
        text = render([], deliveries)
        expected = {
            ("ops", "notifications_sent_total"): 5,
            ("ops", "notification_retries_total"): 3,
            ("ops", "notifications_failed_total"): 1,
            ("ops", "notifications_dropped_total"): 1,
            ("ops", "notifications_pending"): 1,
            ("chat", "notifications_sent_total"): 2,
            ("chat", "notification_retries_total"): 0,
            ("chat", "notifications_failed_total"): 0,
            ("chat", "notifications_dropped_total"): 0,
            ("chat", "notifications_pending"): 0,
        }
        for (receiver, name), want in expected.items():
            assert value(text, P + name, receiver=receiver) == want, (receiver, name)


def promtool_findings(text: str) -> tuple[int, list[str]]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: install Debian's prometheus package")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )
    findings = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    return result.returncode, findings


def full_text(kv: TargetState, healthy: TargetState, deliveries: list[Delivery]) -> str:
    """Every family with samples: an up, a healthy and a failing target, and receivers."""
    down = dataclasses.replace(kv, name="down", up=False)
    down.failures = type(kv.failures)({"connect": 1})
    deliveries[0].stats.sent = 1
    return render([kv, healthy, down], deliveries)


@pytest.mark.prometheus
def test_promtool_check_metrics_is_clean(
    kv: TargetState, healthy: TargetState, deliveries: list[Delivery]
) -> None:
    """promtool reads the exposition and flags nothing about names, units, counters,
    labels or help texts: it exits 0 and says nothing."""
    rc, findings = promtool_findings(full_text(kv, healthy, deliveries))
    assert (rc, findings) == (0, [])
