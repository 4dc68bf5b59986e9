"""End to end on 127.0.0.1: simulated vLLM servers -> the daemon -> a webhook receiver.

The simulators run faster than real time and the daemon's clock runs at the same speed
(as in the live demo), so a 14-minute tour takes about half a minute while the window,
the scrape interval and the incident rules keep their real-time meaning.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.config.load import load_settings
from vllm_triage.demo.live import demo_settings, scaled_clock
from vllm_triage.simulator import get_scenario

from support.harness import metrics_url, running_daemon, simulated, wait_for
from support.paths import ALERTMANAGER
from support.receiver import Receiver

CAUSES = ("prefill_bound", "decode_bound", "queue_bound", "kv_pressure")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FIXTURES = ALERTMANAGER


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def alerts_of(bodies: list[Any]) -> list[tuple[str, str, str]]:
    """(status, target, diagnosis) of every alert delivered, in order."""
    return [
        (a["status"], a["labels"]["target"], a["labels"]["diagnosis"])
        for b in bodies
        for a in b["alerts"]
    ]


#: Label and annotation sets: maps of strings whose keys are the alert's own.
STRING_MAPS = {"labels", "annotations", "groupLabels", "commonLabels", "commonAnnotations"}


def shape(value: Any, key: str = "") -> Any:
    """Keys in order and value types, recursively: the payload's shape, not its values."""
    if key in STRING_MAPS:
        assert isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        return "map[string]string"
    if isinstance(value, dict):
        return [(k, shape(v, k)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


class TestTheWholePipeline:
    @pytest.mark.e2e
    def test_every_cause_fires_and_resolves_and_metrics_show_it(self) -> None:
        """The tour fires each of the four causes, in its order, and resolves each; while
        it is decode-bound, /metrics shows the state and the decode rate against its
        card's ceiling; every payload has the shape of a real Alertmanager 0.25 webhook."""
        speed = 25.0
        scenarios = {"tour": get_scenario("tour")}
        with Receiver() as rx, simulated(scenarios["tour"], speed=speed) as tour:
            settings = demo_settings(
                None,
                scenarios=scenarios,
                urls={"tour": metrics_url(tour)},
                speed=speed,
                listen="127.0.0.1:0",
                sink_url=rx.url,
            )
            assert settings.slo.itl_p99_seconds == 0.024  # the tour's own SLO
            with running_daemon(settings, clock=scaled_clock(speed)) as daemon:
                key = (("model_name", MODEL), ("runtime", "vllm"), ("target", "tour"))

                def decode_firing() -> str | None:
                    text = httpx.get(daemon.url + "/metrics", timeout=5).text
                    state = samples(text, "vllm_triage_diagnosis")
                    return text if state.get((("diagnosis", "decode_bound"), *key)) else None

                text = wait_for(decode_firing, timeout=60, every=0.5)
                ratio = samples(text, "vllm_triage_decode_ceiling_ratio")
                rate = samples(text, "vllm_triage_decode_tokens_per_second")
                ceiling = samples(text, "vllm_triage_decode_ceiling_tokens_per_second")
                # The tour's card is told to the daemon: 3,350 GB/s / 16.06 GB of weights.
                assert abs(ceiling[key] - 3350 / 16.06) < 0.5, ceiling
                assert abs(ratio[key] - rate[key] / ceiling[key]) < 1e-3
                states = samples(text, "vllm_triage_diagnosis")
                per_model = [v for k, v in states.items() if ("target", "tour") in k]
                assert sorted(per_model) == [0, 0, 0, 0, 0, 1]  # one state per cause, and healthy
                # The tour ends healthy: wait for its last incident to resolve.
                wait_for(
                    lambda: ("resolved", "tour", "kv_pressure") in alerts_of(rx.bodies()),
                    timeout=120,
                    every=0.5,
                )
                api = httpx.get(daemon.url + "/api/v1/diagnoses?target=tour", timeout=5).json()
        delivered = alerts_of(rx.bodies())
        tour_alerts = [(status, cause) for status, target, cause in delivered if target == "tour"]
        for cause in CAUSES:
            fired = tour_alerts.index(("firing", cause))
            assert ("resolved", cause) in tour_alerts[fired:], (cause, tour_alerts)
        # Each cause fired once, in the tour's order, and resolved: nothing else fired.
        opened = [c for s, c in tour_alerts if s == "firing"]
        closed = [c for s, c in tour_alerts if s == "resolved"]
        assert opened == list(CAUSES) and closed == list(CAUSES), tour_alerts
        assert api["targets"][0]["models"][0]["diagnosis"] == "healthy"
        real = json.loads((FIXTURES / "alertmanager-0.25-webhook-v4-firing.json").read_text())
        for body in rx.bodies():
            assert shape(body) == shape(real)
            assert body["version"] == "4"
            assert body["receiver"] == "demo-receiver"

    def test_a_dead_receiver_does_not_stop_scraping_and_gets_everything_once_back(
        self,
    ) -> None:
        speed = 10.0
        rx = Receiver()  # not started: connections are refused
        with simulated(get_scenario("kv_pressure"), speed=speed) as sim:
            settings = load_settings(
                flags={
                    "listen": "127.0.0.1:0",
                    "interval_seconds": 5 / speed,
                    "targets": [{"name": "kv", "url": metrics_url(sim)}],
                    "receivers": [
                        {
                            "type": "alertmanager_webhook",
                            "name": "down",
                            "url": rx.url,
                            "retry_initial_seconds": 0.1,
                            "retry_max_seconds": 0.3,
                        }
                    ],
                }
            )
            with running_daemon(settings, clock=scaled_clock(speed)) as daemon:
                delivery = daemon.notifier.deliveries[0]
                state = daemon.targets[0].state
                wait_for(lambda: delivery.stats.retried >= 3, timeout=30)
                scrapes = state.scrapes
                wait_for(lambda: state.scrapes >= scrapes + 5, timeout=10)
                assert state.up and delivery.pending == 1 and not rx.bodies()
                rx.start()
                try:
                    wait_for(rx.bodies, timeout=10)
                    text = httpx.get(daemon.url + "/metrics", timeout=5).text
                finally:
                    rx.stop()
        assert alerts_of(rx.bodies())[0] == ("firing", "kv", "kv_pressure")
        assert delivery.stats.sent >= 1 and delivery.stats.failed == 0
        retries = samples(text, "vllm_triage_notification_retries_total")
        assert retries[(("receiver", "down"),)] >= 3
