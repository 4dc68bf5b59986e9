"""Fleet mode (daemon/fleet.py) against a query API on 127.0.0.1 that answers
``query_range`` from simulator recordings, as Prometheus would after scraping them.
The real-Prometheus version is in tests/test_integration.py."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.core.names import SAMPLES
from daemon.core.parse import parse_snapshot
from daemon.fleet import PrometheusSource, exposition, series_query, target_name
from daemon.settings import Settings, load_settings
from daemon.simulator import get_scenario, record

STEP = 5.0
NOW = 1_767_226_200.0  # a multiple of STEP: the fleet's step grid ends here
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@functools.cache
def recorded(
    scenario: str,
) -> tuple[tuple[float, tuple[tuple[str, dict[str, str], float], ...]], ...]:
    """The scenario scraped every STEP seconds up to NOW: (time, parser samples) each."""
    out = []
    for at, body in record(
        get_scenario(scenario), start_at=NOW - 400, interval_s=STEP, duration_s=400
    ):
        samples = tuple(
            (s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(body)
            for s in family.samples
            if s.name in SAMPLES
        )
        out.append((at, samples))
    return tuple(out)


def matrix(servers: dict[str, str], start: float, end: float) -> list[dict[str, Any]]:
    """What Prometheus' query_range gives for the parser's series of ``servers``
    ({instance: scenario}) between ``start`` and ``end``."""
    series: dict[tuple[tuple[str, str], ...], list[list[Any]]] = {}
    for instance, scenario in servers.items():
        for at, samples in recorded(scenario):
            if not start <= at <= end:
                continue
            for name, labels, value in samples:
                full = {"__name__": name, **labels, "job": "vllm", "instance": instance}
                series.setdefault(tuple(sorted(full.items())), []).append([at, repr(value)])
    return [{"metric": dict(k), "values": v} for k, v in series.items()]


@contextmanager
def query_api(
    servers: dict[str, str], *, status: int = 200, raw: bytes | None = None
) -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            params = {k: v[0] for k, v in parse_qs(parts.query).items()}
            seen.append(params)
            if raw is not None or status != 200:
                body = raw or b'{"status":"error","error":"boom"}'
            else:
                result = matrix(servers, float(params["start"]), float(params["end"]))
                doc = {"status": "success", "data": {"resultType": "matrix", "result": result}}
                body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def fleet_settings(url: str, **extra: Any) -> Settings:
    return load_settings(
        flags={
            "source": "prometheus",
            "interval_seconds": STEP,
            "prometheus": {"url": url, "selector": '{job="vllm"}', **extra},
        }
    )


def run_ticks(settings: Settings, clock_values: list[float]) -> PrometheusSource:
    async def go() -> PrometheusSource:
        clock = iter(clock_values)
        async with httpx.AsyncClient() as client:
            source = PrometheusSource(
                settings, client=client, notifier=None, clock=lambda: next(clock)
            )
            for _ in clock_values:
                await source.tick()
        return source

    return asyncio.run(go())


class TestQuery:
    def test_selects_every_name_the_parser_reads_and_the_users_matchers(self) -> None:
        q = series_query('{job="vllm", namespace=~"llm-.*"}')
        assert q.startswith('{__name__=~"') and q.endswith(', job="vllm", namespace=~"llm-.*"}')
        for name in SAMPLES:
            assert name.replace(":", r"\:") in q or name in q
        assert series_query("") == '{__name__=~"' + q.split('"')[1] + '"}'

    @pytest.mark.parametrize(
        ("labels", "name"),
        [
            ({"job": "vllm", "instance": "10.0.0.5:8000"}, "vllm/10.0.0.5:8000"),
            ({"job": "vllm"}, "vllm"),
            ({"instance": "pod a b"}, "pod_a_b"),
            ({}, "unlabelled"),
            ({"job": "-x"}, "t-x"),
        ],
    )
    def test_target_names(self, labels: dict[str, str], name: str) -> None:
        assert target_name(labels, ["job", "instance"]) == name

    def test_exposition_round_trips_through_the_parser(self) -> None:
        """Samples as the query API returns them, written back as text, parse to the same
        snapshot as the scrape they came from."""
        *_, (at, body) = record(
            get_scenario("kv_pressure"), start_at=0, interval_s=5, duration_s=60
        )
        samples = [
            ({"__name__": s.name, **s.labels, "instance": 'a"b\\c'}, repr(s.value))
            for family in text_string_to_metric_families(body)
            for s in family.samples
            if s.name in SAMPLES
        ]
        direct, rebuilt = parse_snapshot(body, at), parse_snapshot(exposition(samples), at)
        assert rebuilt.models == direct.models and rebuilt.kv_pool == direct.kv_pool


class TestTicks:
    def test_discovers_each_server_and_diagnoses_it(self) -> None:
        servers = {"a:8000": "kv_pressure", "b:8000": "healthy"}
        with query_api(servers) as (url, seen):
            clock = [NOW - 300 + STEP * i for i in range(61)]
            source = run_ticks(fleet_settings(url), clock)
        assert set(source.watchers) == {"vllm/a:8000", "vllm/b:8000"}
        kv, healthy = source.watchers["vllm/a:8000"], source.watchers["vllm/b:8000"]
        assert [a.cause for a in kv.evaluator.incidents.active()] == ["kv_pressure"]
        assert healthy.evaluator.incidents.active() == []
        assert healthy.state.view is not None and healthy.state.up
        # The first tick reached back one window; later ones continue on the grid.
        assert float(seen[0]["end"]) - float(seen[0]["start"]) == 60
        assert all(float(b["start"]) == float(a["end"]) + STEP for a, b in itertools.pairwise(seen))
        assert source.api.state.up and source.api.state.scrapes == 61

    @pytest.mark.parametrize(
        ("status", "raw", "reason"),
        [
            (500, None, "http_status"),
            (200, b"<html>not json</html>", "parse"),
            (200, b'{"status":"error","error":"bad query"}', "parse"),
        ],
    )
    def test_a_broken_query_api_is_a_counted_failure(
        self, status: int, raw: bytes | None, reason: str
    ) -> None:
        with query_api({}, status=status, raw=raw) as (url, _):
            source = run_ticks(fleet_settings(url), [NOW, NOW + STEP])
        api = source.api.state
        assert not api.up and api.failures[reason] == 2 and not source.watchers

    def test_a_dead_query_api_is_a_counted_failure(self) -> None:
        with query_api({}) as (url, _):
            pass  # closed again: connections are refused
        source = run_ticks(fleet_settings(url, timeout_seconds=2), [NOW])
        assert source.api.state.failures["connect"] == 1

    def test_a_server_that_disappears_is_marked_down(self) -> None:
        servers = {"a:8000": "healthy"}
        with query_api(servers) as (url, _):
            settings = fleet_settings(url)

            async def go() -> PrometheusSource:
                times = iter([NOW - 100, NOW - 95])
                async with httpx.AsyncClient() as client:
                    source = PrometheusSource(
                        settings, client=client, notifier=None, clock=lambda: next(times)
                    )
                    await source.tick()
                    servers.clear()
                    await source.tick()
                return source

            source = asyncio.run(go())
        state = source.watchers["vllm/a:8000"].state
        assert not state.up and state.failures["absent"] == 1
