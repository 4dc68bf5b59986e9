"""The fault matrix: each row a fault on 127.0.0.1; the daemon keeps running, reports the
fault in its metrics and logs, and recovers.

Rows covered elsewhere: SIGTERM during a delivery and an invalid config
(tests/commands/test_run_cmd.py), a hanging target's skipped ticks
(tests/runtime/test_service.py), the Delivery-level receiver faults one by one
(tests/runtime/notify/test_delivery.py).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import httpx
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.serve.exporter import DIAGNOSES
from vllm_triage.simulator import Phase, Scenario, get_scenario

from support.clirun import HANG_S
from support.harness import (
    Answer,
    metrics_url,
    refused_port,
    running_daemon,
    simulated,
    target,
    wait_for,
)
from support.receiver import Receiver
from support.scenarios import recorded

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def bodies(scenario: str, n: int, *, naming: str = "v1", start_at: float = 0.0) -> list[bytes]:
    """``n`` scrapes of a scenario, 5 simulated seconds apart."""
    out = []
    for _, text in recorded(
        scenario,
        start_at=start_at,
        interval_s=5,
        duration_s=5 * (n - 1),
        naming=naming,  # type: ignore[arg-type]
    ):
        out.append(text.encode())
    return out


def settings_for(url: str, **extra: Any) -> Settings:
    return load_settings(
        flags={
            "listen": "127.0.0.1:0",
            "interval_seconds": 0.2,
            "scrape_timeout_seconds": 1.0,
            "targets": [{"name": "t", "url": url}],
            **extra,
        }
    )


def metric(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


GOOD = bodies("healthy", 2)[1]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        pytest.param({"delay": 3.0, "body": GOOD}, "timeout", id="target-hangs"),
        pytest.param({"status": 500, "body": b"oops"}, "http_status", id="http-500"),
        pytest.param({"truncate": True, "body": GOOD}, "http_error", id="truncated-body"),
        pytest.param({"body": bytes(range(256)) * 64}, "parse", id="binary-garbage"),
        pytest.param({"body": b"<html><body>login</body></html>"}, "parse", id="not-metrics"),
    ],
)
def test_a_bad_target_is_counted_logged_and_recovers(bad: dict[str, Any], reason: str) -> None:
    answer = Answer(**bad)
    with (
        target(answer) as url,
        structlog.testing.capture_logs() as logs,
        running_daemon(settings_for(url)) as daemon,
    ):
        state = daemon.targets[0].state
        wait_for(lambda: state.failures[reason] >= 2, timeout=HANG_S)
        down = httpx.get(daemon.url + "/metrics", timeout=HANG_S).text
        # The target heals: same URL, a good answer.
        answer.delay, answer.status, answer.truncate, answer.body = 0.0, 200, False, GOOD
        wait_for(lambda: state.up, timeout=HANG_S)
        healthz = httpx.get(daemon.url + "/healthz", timeout=HANG_S).status_code
    assert metric(down, "vllm_triage_target_up", target="t") == 0
    assert metric(down, "vllm_triage_scrape_failures_total", target="t", reason=reason) >= 2
    events = [e for e in logs if e.get("target") == "t"]
    assert any(e["event"] == "scrape_failed" and e["reason"] == reason for e in events)
    assert any(e["event"] == "scrape_recovered" for e in events)
    assert healthz == 200


def test_a_refusing_target_recovers_when_it_comes_up() -> None:
    url = f"http://127.0.0.1:{refused_port()}/metrics"
    with running_daemon(settings_for(url)) as daemon:
        state = daemon.targets[0].state
        wait_for(lambda: state.failures["connect"] >= 2, timeout=HANG_S)
        with simulated(get_scenario("healthy"), speed=1.0) as sim:
            # The simulator took another port: point the target at it, as a restarted
            # pod at a new address would be found again.
            daemon.scrapers[0].parts = dataclasses.replace(
                daemon.scrapers[0].parts, url=metrics_url(sim)
            )
            # Read while the simulator still serves: stopping it fails the next scrape.
            recovered = wait_for(lambda: state.up, timeout=HANG_S)
    assert state.failures["connect"] >= 2 and recovered


def test_a_50_mib_body_is_refused_without_being_read() -> None:
    """Past max_body_bytes (16 MiB by default) the scrape stops reading: the target
    cannot push 50 MiB through, so memory stays bounded by the limit."""
    answer = Answer(stream_bytes=50 * 2**20)
    with target(answer) as url, running_daemon(settings_for(url, interval_seconds=5.0)) as daemon:
        state = daemon.targets[0].state
        wait_for(lambda: state.failures["too_large"] >= 1, timeout=HANG_S)
        sent = answer.sent
        answer.stream_bytes, answer.body = 0, GOOD
    assert "larger than 16777216 bytes" in state.last_error
    assert sent < 30 * 2**20, f"the target pushed {sent} bytes"


def _poison(body: bytes) -> bytes:
    text = body.decode()
    text = re.sub(r"(vllm:num_requests_running\{[^}]*\}) \S+", r"\1 NaN", text)
    text = re.sub(r"(vllm:kv_cache_usage_perc\{[^}]*\}) \S+", r"\1 +Inf", text)
    text = re.sub(r"(vllm:num_preemptions_total\{[^}]*\}) \S+", r"\1 -5", text)
    return text.encode()


def test_nan_inf_and_negative_values_are_left_out_and_counted() -> None:
    answer = Answer(sequence=[_poison(b) for b in bodies("kv_pressure", 30)])
    with target(answer) as url, running_daemon(settings_for(url)) as daemon:
        state = daemon.targets[0].state

        def judged() -> bool:
            view = state.view
            return view is not None and view.evaluation.signals[MODEL].ttft_p99 is not None

        wait_for(judged, timeout=HANG_S)
        text = httpx.get(daemon.url + "/metrics", timeout=HANG_S).text
        api = httpx.get(daemon.url + "/api/v1/diagnoses", timeout=HANG_S)
    assert state.up and not state.failures
    assert metric(text, "vllm_triage_series_unusable_total", target="t") >= 3
    assert api.status_code == 200 and "NaN" not in api.text and "Infinity" not in api.text
    signals = state.view.evaluation.signals[MODEL]
    assert signals.running_mean is None and signals.kv_usage_mean is None
    assert signals.ttft_p99 is not None  # the rest of the scrape is still used


def _rates(state: Any) -> list[float]:
    s = state.view.evaluation.signals[MODEL]
    return [
        v
        for v in (
            s.generation_tokens_per_second,
            s.prompt_tokens_per_second,
            s.preemptions_per_second,
        )
        if v is not None
    ]


def test_a_counter_reset_never_gives_a_negative_rate() -> None:
    """vLLM restarts: every counter starts again from zero."""
    before, after = bodies("kv_pressure", 20), bodies("kv_pressure", 20)
    answer = Answer(sequence=before + after)
    seen: list[float] = []
    # Forty scrapes at 50 ms, not 200 ms: the pace is not the point, the reset is.
    with target(answer) as url, running_daemon(settings_for(url, interval_seconds=0.05)) as daemon:
        state = daemon.targets[0].state

        def through() -> bool:
            if state.view is not None:
                seen.extend(_rates(state))
            return answer.gets > 40

        wait_for(through, timeout=HANG_S, every=0.05)
    assert state.up and not state.failures
    assert seen and min(seen) >= 0


def test_the_naming_era_switching_mid_run_is_followed() -> None:
    """vLLM upgraded from a V0-era release to V1 between two scrapes."""
    old, new = bodies("kv_pressure", 15, naming="v0"), bodies("kv_pressure", 15)
    answer = Answer(sequence=old + new)
    eras: set[str] = set()
    # Thirty scrapes at 50 ms, not 200 ms: the pace is not the point, the switch is.
    with target(answer) as url, running_daemon(settings_for(url, interval_seconds=0.05)) as daemon:
        state = daemon.targets[0].state
        parser = daemon.scrapers[0].reader.parser

        def through() -> bool:
            if state.view is not None:
                eras.add(daemon.targets[0].evaluator.window.newest.era)  # type: ignore[union-attr]
            return answer.gets > 30

        wait_for(through, timeout=HANG_S, every=0.05)
    assert parser is not None and state.up and not state.failures
    assert {"v0", "v1"} <= eras
    assert MODEL in state.view.evaluation.diagnoses and min(_rates(state)) >= 0


def test_thousands_of_model_names_are_bounded_and_counted() -> None:
    lines = [
        f'vllm:num_requests_running{{model_name="m{i:05d}"}} 1\n'
        f'vllm:num_requests_waiting{{model_name="m{i:05d}"}} 0\n'
        for i in range(5000)
    ]
    answer = Answer(body="".join(lines).encode())
    with (
        target(answer) as url,
        structlog.testing.capture_logs() as logs,
        running_daemon(settings_for(url, max_models_per_target=50)) as daemon,
    ):
        state = daemon.targets[0].state
        wait_for(lambda: state.models_dropped >= 2 * 4950, timeout=HANG_S)
        text = httpx.get(daemon.url + "/metrics", timeout=HANG_S).text
    assert len(state.view.evaluation.diagnoses) == 50
    assert metric(text, "vllm_triage_models_dropped_total", target="t") >= 2 * 4950
    assert text.count("vllm_triage_diagnosis{") == 50 * len(DIAGNOSES)
    dropped = [e for e in logs if e["event"] == "models_dropped"]
    assert len(dropped) == 1  # rate-limited: once a minute, though every scrape drops
    assert dropped[0]["exposed"] == 5000 and dropped[0]["kept"] == 50


def test_missing_families_an_old_vllm_is_still_watched() -> None:
    body = (
        b'vllm:num_requests_running{model_name="m"} 2\n'
        b'vllm:num_requests_waiting{model_name="m"} 0\n'
    )
    with target(Answer(body=body)) as url, running_daemon(settings_for(url)) as daemon:
        state = daemon.targets[0].state
        wait_for(lambda: state.view is not None and state.scrapes >= 3, timeout=HANG_S)
        api = httpx.get(daemon.url + "/api/v1/diagnoses", timeout=HANG_S).json()
    model = api["targets"][0]["models"][0]
    assert model["diagnosis"] == "healthy" and model["breaches"] == []
    assert "ttft_p99" in model["signals"]["missing"]


@pytest.mark.parametrize(
    "behaviour",
    [
        pytest.param("refuses", id="receiver-refuses"),
        pytest.param({"delay": 3.0}, id="receiver-hangs"),
        pytest.param({"status": 500}, id="receiver-500"),
        pytest.param({"status": 429, "headers": {"Retry-After": "0.2"}}, id="receiver-429"),
    ],
)
def test_a_bad_receiver_is_retried_counted_and_catches_up(behaviour: Any) -> None:
    rx = Receiver()
    if behaviour != "refuses":
        rx.start()
        for key, value in behaviour.items():
            setattr(rx.behaviour, key, value)
    with simulated(get_scenario("kv_pressure"), speed=10.0) as sim:
        settings = load_settings(
            flags={
                "listen": "127.0.0.1:0",
                "interval_seconds": 0.5,
                "targets": [{"name": "kv", "url": metrics_url(sim)}],
                "receivers": [
                    {
                        "type": "alertmanager_webhook",
                        "name": "rx",
                        "url": rx.url,
                        "timeout_seconds": 1.0,
                        "retry_initial_seconds": 0.1,
                        "retry_max_seconds": 0.5,
                    }
                ],
            }
        )
        try:
            with running_daemon(settings) as daemon:
                delivery = daemon.notifier.deliveries[0]
                wait_for(lambda: delivery.stats.retried >= 2, timeout=HANG_S)
                # Scraping goes on while the receiver misbehaves: never blocked by it.
                state = daemon.targets[0].state
                scrapes = state.scrapes
                wait_for(lambda: state.scrapes >= scrapes + 3, timeout=HANG_S)
                # ... the notification still waiting for it all the while. (A receiver that
                # hangs may keep a body whose answer came too late: the delivery counts
                # the timeout, so the body is still pending.)
                assert delivery.pending >= 1
                text = httpx.get(daemon.url + "/metrics", timeout=HANG_S).text
                if behaviour == "refuses":
                    rx.start()
                else:
                    rx.behaviour = type(rx.behaviour)()
                wait_for(rx.bodies, timeout=HANG_S)
        finally:
            rx.stop()
    assert metric(text, "vllm_triage_notification_retries_total", receiver="rx") >= 2
    assert rx.bodies()[0]["alerts"][0]["labels"]["diagnosis"] == "kv_pressure"
    assert delivery.stats.failed == 0


def _fault_then_recovery() -> Scenario:
    """Healthy for 30 s, KV pressure for 90 s, then healthy again: one incident that
    fires and resolves."""
    kv = get_scenario("kv_pressure")
    light = dataclasses.replace(
        kv.phases[0].workload, arrival_rate_per_s=0.2, prompt_tokens=200, output_tokens=50
    )
    return dataclasses.replace(
        kv,
        name="kv_then_healthy",
        phases=(Phase(30, light), Phase(90, kv.phases[0].workload), Phase(10_000, light)),
    )


@pytest.mark.slow
def test_a_receiver_down_for_five_minutes_gets_everything_in_order() -> None:
    """In real time: the receiver is down for five minutes while an incident fires and
    resolves; once it is back, both notifications arrive, in order, none lost."""
    rx = Receiver()
    with simulated(_fault_then_recovery(), speed=1.0) as sim:
        settings = load_settings(
            flags={
                "listen": "127.0.0.1:0",
                "interval_seconds": 5.0,
                "targets": [{"name": "kv", "url": metrics_url(sim)}],
                "receivers": [
                    {
                        "type": "alertmanager_webhook",
                        "name": "rx",
                        "url": rx.url,
                        "retry_max_seconds": 10,
                    }
                ],
            }
        )
        with running_daemon(settings) as daemon:
            state, delivery = daemon.targets[0].state, daemon.notifier.deliveries[0]
            wait_for(lambda: state.transitions >= 2, timeout=HANG_S, every=1)
            wait_for(lambda: sim.live.t >= 300, timeout=HANG_S, every=1)
            assert delivery.pending == 2 and not rx.bodies()
            rx.start()
            try:
                wait_for(lambda: len(rx.bodies()) >= 2, timeout=HANG_S)
            finally:
                rx.stop()
    statuses = [
        (b["alerts"][0]["status"], b["alerts"][0]["labels"]["diagnosis"]) for b in rx.bodies()
    ]
    assert statuses == [("firing", "kv_pressure"), ("resolved", "kv_pressure")]
    assert delivery.stats.failed == 0 and delivery.stats.dropped == 0 and delivery.stats.sent == 2
