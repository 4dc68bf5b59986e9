"""Tests for daemon/vllm_triage/serve/listener.py: the daemon's endpoint, on a real socket on
127.0.0.1.

The targets' states come from simulated scenarios run through the real core (see
``test_exporter.watched``); httpx talks to the server the way Prometheus and people do.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.core.evaluate import Evaluation
from vllm_triage.core.report import iso
from vllm_triage.serve.exporter import build_registry
from vllm_triage.serve.listener import HttpServer, bind, split_listen
from vllm_triage.serve.routes import ROUTES, Endpoints
from vllm_triage.state import TargetState, View

from support.watched import MODEL, watched

NOW = 1_767_230_000.0
METHODS = ("POST", "PUT", "DELETE", "HEAD", "PATCH")


@dataclasses.dataclass
class Served:
    targets: list[TargetState]
    ready: list[bool]
    client: httpx.Client


def serve(targets: list[TargetState], ready: list[bool]) -> HttpServer:
    endpoints = Endpoints(
        build_registry(lambda: targets, lambda: []),
        lambda: targets,
        lambda: ready[0],
        clock=lambda: NOW,
    )
    server = HttpServer(bind("127.0.0.1:0"), endpoints)
    server.start()
    return server


@pytest.fixture(scope="module")
def states() -> list[TargetState]:
    return [watched("kv_pressure"), watched("healthy")]


@pytest.fixture(scope="module")
def server(states: list[TargetState]) -> Iterator[Served]:
    """One server for the module (stopping one takes up to its 0.5 s poll interval)."""
    targets, ready = list(states), [True]
    server = serve(targets, ready)
    try:
        host, port = server.address
        assert host == "127.0.0.1" and port > 0
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as client:
            yield Served(targets, ready, client)
    finally:
        server.stop()


@pytest.fixture
def served(server: Served, states: list[TargetState]) -> Served:
    """The module's server, its targets and readiness as each test starts from."""
    server.targets[:] = states
    server.ready[0] = True
    return server


def get(served: Served, path: str, **kwargs: Any) -> httpx.Response:
    return served.client.get(path, **kwargs)


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, which JSON does not have."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


class TestRoutes:
    def test_metrics(self, served: Served) -> None:
        """The text format, with the targets' derived metrics in it."""
        r = get(served, "/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=")
        names = {f.name for f in text_string_to_metric_families(r.text)}
        assert {"vllm_triage_target_up", "vllm_triage_diagnosis"} <= names
        assert 'vllm_triage_target_up{target="kv_pressure"} 1.0' in r.text

    def test_metrics_in_openmetrics_when_asked(self, served: Served) -> None:
        r = get(served, "/metrics", headers={"Accept": "application/openmetrics-text"})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        assert r.text.endswith("# EOF\n")

    def test_healthz(self, served: Served) -> None:
        r = get(served, "/healthz")
        assert (r.status_code, r.text) == (200, "ok\n")

    def test_readyz_follows_ready(self, served: Served) -> None:
        """503 while not ready (starting, stopping), 200 once ready; asked on every request."""
        assert get(served, "/readyz").status_code == 200
        served.ready[0] = False
        assert get(served, "/readyz").status_code == 503
        assert get(served, "/healthz").status_code == 200  # liveness does not follow
        served.ready[0] = True
        assert get(served, "/readyz").status_code == 200

    def test_index_is_the_status_page_and_lists_the_routes(self, served: Served) -> None:
        """``/`` is the status page (tests/system/test_browser.py); while it loads, and for a
        reader without JavaScript, it links every other route."""
        r = get(served, "/")
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        assert "connect-src 'self'" in r.headers["content-security-policy"]
        assert all(f'href="{route[1:]}"' in r.text for route in ROUTES if route != "/")

    @pytest.mark.parametrize("path", ["/nope", "/metrics/", "/api/v1/diagnoses/x", "/METRICS"])
    def test_unknown_path_is_404(self, served: Served, path: str) -> None:
        assert get(served, path).status_code == 404

    def test_unknown_path_is_404_whatever_the_method(self, served: Served) -> None:
        r = served.client.post("/nope")
        assert r.status_code == 404

    @pytest.mark.parametrize("method", METHODS)
    def test_only_get_is_allowed(self, served: Served, method: str) -> None:
        """Every route refuses anything but GET with 405 and says what it allows."""
        for route in ROUTES:
            r = served.client.request(method, route)
            assert r.status_code == 405, (method, route)
            assert r.headers["allow"] == "GET", (method, route)


class TestDiagnosesApi:
    def test_all_targets(self, served: Served) -> None:
        r = get(served, "/api/v1/diagnoses")
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        doc = strict_json(r.text)
        assert doc["generated_at"] == iso(NOW)
        by_name = {t["target"]: t for t in doc["targets"]}
        assert list(by_name) == ["kv_pressure", "healthy"]
        kv = by_name["kv_pressure"]
        assert kv["up"] is True
        [model] = kv["models"]
        assert model["model_name"] == MODEL
        assert model["diagnosis"] == "kv_pressure"
        assert model["incident_state"] == "firing"
        assert model["evidence"]["kv_usage_max"] > 0.9
        assert model["evidence"]["gpu"] == "NVIDIA A100 80GB SXM"
        assert model["signals"]["ttft_p99"]["q"] == 0.99
        [healthy] = by_name["healthy"]["models"]
        assert (healthy["diagnosis"], healthy["current_cause"]) == ("healthy", None)

    def test_target_filter(self, served: Served) -> None:
        doc = strict_json(get(served, "/api/v1/diagnoses", params={"target": "healthy"}).text)
        assert [t["target"] for t in doc["targets"]] == ["healthy"]
        nope = get(served, "/api/v1/diagnoses", params={"target": "nope"})
        assert nope.status_code == 404
        assert nope.headers["content-type"] == "application/json"
        assert nope.json() == {
            "error": "no target named 'nope'",
            "targets": ["healthy", "kv_pressure"],
        }

    def test_nan_never_reaches_the_json(self, served: Served) -> None:
        """A broken target's NaN or infinity in evidence and signals becomes null."""
        kv = served.targets[0]
        assert kv.view is not None
        ev = kv.view.evaluation
        diagnoses = {
            m: dataclasses.replace(
                d, evidence={**d.evidence, "kv_usage_max": math.nan, "odd": -math.inf}
            )
            for m, d in ev.diagnoses.items()
        }
        signals = {
            m: dataclasses.replace(s, ttft_mean=math.nan, waiting_mean=math.inf)
            for m, s in ev.signals.items()
        }
        broken = Evaluation(
            at=ev.at, accepted=True, signals=signals, diagnoses=diagnoses, transitions=[]
        )
        served.targets[0] = dataclasses.replace(
            kv, view=View(broken, kv.view.states, kv.view.active)
        )
        r = get(served, "/api/v1/diagnoses")
        assert r.status_code == 200
        [model] = strict_json(r.text)["targets"][0]["models"]
        assert model["evidence"]["kv_usage_max"] is None
        assert model["evidence"]["odd"] is None
        assert model["signals"]["ttft_mean"] is None
        assert model["signals"]["waiting_mean"] is None
        assert get(served, "/metrics").status_code == 200  # NaN is fine in the text format


class TestServer:
    def test_stop_frees_the_port(self) -> None:
        server = serve([], [True])
        host, port = server.address
        assert httpx.get(f"http://{host}:{port}/healthz", timeout=5.0).status_code == 200
        server.stop()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{host}:{port}/healthz", timeout=2.0)

    def test_stop_without_start(self) -> None:
        """Binding happens in the constructor; stopping a server never started is fine."""
        server = HttpServer(bind("127.0.0.1:0"), Endpoints(build_registry(list, list), list, bool))
        assert server.address[1] > 0
        server.stop()

    @pytest.mark.parametrize(
        ("listen", "expected"),
        [
            ("127.0.0.1:9468", ("127.0.0.1", 9468)),
            (":9468", ("0.0.0.0", 9468)),
            ("[::1]:9468", ("::1", 9468)),
        ],
        ids=["ipv4", "every-interface", "ipv6"],
    )
    def test_split_listen(self, listen: str, expected: tuple[str, int]) -> None:
        assert split_listen(listen) == expected
