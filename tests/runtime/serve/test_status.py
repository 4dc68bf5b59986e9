"""Tests for the status page's data: daemon/vllm_triage/serve/status.py, fed by real targets
(daemon/vllm_triage/target.py records each evaluation in the History of
daemon/vllm_triage/state.py), and served as ``/api/v1/series`` by
daemon/vllm_triage/serve/listener.py. The page itself runs in tests/system/test_browser.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from vllm_triage.assemble import build_scraped
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import TargetSettings
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.rules import runtime_table
from vllm_triage.serve.exporter import build_registry
from vllm_triage.serve.listener import HttpServer, bind
from vllm_triage.serve.routes import Endpoints
from vllm_triage.serve.status import live_document
from vllm_triage.state import ReceiverStats, TargetState
from vllm_triage.target import Target

from support.scenarios import recorded

START = 1_767_225_600.0
SECRET_URL = "http://watcher:S3CRET-pw@127.0.0.1:1/metrics?token=S3CRET-query"


def watched(scenario: str, name: str, url: str, duration_s: float) -> Target:
    """A real watcher, fed the simulated scenario's scrapes as ``scrape`` would feed it."""
    settings = load_settings(flags={"interval_seconds": 5.0})
    w = build_scraped(
        settings,
        TargetSettings(name=name, url=url),
        client=httpx.AsyncClient(),
        notifier=None,
        clock=lambda: START,
    ).target
    parser = SnapshotParser(runtime_table())
    for at, body in recorded(scenario, start_at=START, interval_s=5.0, duration_s=duration_s):
        w.state.attempted(at)
        w.consume(parser.parse(body, at))
    return w


@pytest.fixture(scope="module")
def kv() -> Target:
    return watched("kv_pressure", "kv", SECRET_URL, 300)


def test_a_section_per_target_and_model_with_its_last_hour(kv: Target) -> None:
    now = START + 300
    doc = live_document([kv.state], now=now)
    # Five minutes of data: the axis fits them, not a sliver at the right of an hour.
    assert doc["mode"] == "live" and doc["range"] == [START, now]
    (section,) = doc["sections"]
    assert section["title"] == "kv · meta-llama/Llama-3.1-8B-Instruct"
    assert section["evaluations"] == 61 and section["t"][0] == START and section["t"][-1] == now
    assert max(v for v in section["values"]["kv_usage_max"] if v is not None) > 0.9
    assert section["settings_values"]["slo.ttft_p99_seconds"] == 2.0
    assert [link[0] for link in doc["links"]][:2] == ["/metrics", "/api/v1/diagnoses"]


def test_the_axis_is_the_last_hour_once_there_is_one(kv: Target) -> None:
    """Once the data is older than an hour, the axis is the last hour (older points are
    no longer charted)."""
    later = START + 3 * 3600
    assert live_document([kv.state], now=later)["range"] == [later - 3600, later]


def test_receivers_say_whether_they_are_reached(kv: Target) -> None:
    """The page says whether alerts reach anyone: each receiver's sent, failed and
    pending, or that none is configured."""
    none = live_document([kv.state], now=START + 300, settings_rows=[])
    assert ["receivers", "none configured: incidents are shown, not sent"] in none["facts"]

    class Failing:
        name = "pager"
        stats = ReceiverStats(sent=2, failed=1, last_error="HTTP 500")
        pending = 3

    doc = live_document([kv.state], now=START + 300, receivers=[Failing()])
    [row] = [f for f in doc["facts"] if f[0] == "receiver pager"]
    assert row[1].startswith("FAILING: 2 sent, 1 failed, 3 pending") and "HTTP 500" in row[1]


def test_the_open_incident_and_the_state_now(kv: Target) -> None:
    doc = live_document([kv.state], now=START + 300)
    (section,) = doc["sections"]
    assert section["firing"] is True
    assert section["state_text"].startswith("now: kv_pressure firing since")
    open_ = [i for i in section["incidents"] if i["end"] is None]
    assert [i["cause"] for i in open_] == ["kv_pressure"]
    assert open_[0]["remediation"] and open_[0]["breach_began"] is not None
    assert any(t["event"] == "firing" for t in section["transitions"])


def test_only_the_last_hour(kv: Target) -> None:
    """An hour later, only the points of the last hour are sent (the ring may hold more)."""
    now = START + 3600 + 200
    (section,) = live_document([kv.state], now=now)["sections"]
    assert section["t"][0] >= now - 3600
    assert section["evaluations"] == 21


def test_a_long_incident_whose_firing_was_forgotten_still_shows(kv: Target) -> None:
    kept = list(kv.state.recent)
    kv.state.recent.clear()
    try:
        (section,) = live_document([kv.state], now=START + 300)["sections"]
    finally:
        kv.state.recent.extend(kept)
    (incident,) = section["incidents"]
    assert incident["cause"] == "kv_pressure" and incident["end"] is None
    assert incident["opened_because"] is None


def test_no_credentials_or_query_from_a_target_url(kv: Target) -> None:
    text = json.dumps(live_document([kv.state], now=START + 300))
    assert "S3CRET" not in text
    assert "http://127.0.0.1:1/metrics" in text


def test_a_target_not_scraped_yet() -> None:
    st = TargetState("later", "http://127.0.0.1:1/metrics", None)
    (section,) = live_document([st], now=START)["sections"]
    assert section["t"] == [] and section["state_text"] == "no model reported yet"
    assert "DOWN: not scraped yet" in section["note"]


@pytest.fixture(scope="module")
def api(kv: Target) -> Iterator[httpx.Client]:
    targets = [kv.state, watched("healthy", "calm", "http://127.0.0.1:2/metrics", 120).state]
    endpoints = Endpoints(
        build_registry(lambda: targets, list),
        lambda: targets,
        lambda: True,
        clock=lambda: START + 300,
    )
    server = HttpServer(bind("127.0.0.1:0"), endpoints)
    server.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.address[1]}", timeout=10) as client:
            yield client
    finally:
        server.stop()


def strict(text: str) -> Any:
    def refuse(token: str) -> None:
        raise AssertionError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_the_series_api_serves_the_document(api: httpx.Client) -> None:
    r = api.get("/api/v1/series")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.headers["cache-control"] == "no-store"
    doc = strict(r.text)
    assert [s["title"].split(" · ")[0] for s in doc["sections"]] == ["kv", "calm"]
    calm = doc["sections"][1]
    assert calm["incidents"] == [] and calm["state_text"] == "now: healthy"


def test_the_page_is_served_with_its_policy(api: httpx.Client) -> None:
    r = api.get("/")
    assert r.status_code == 200
    policy = r.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert r.headers["x-frame-options"] == "DENY"
    assert '"source":"api/v1/series"' in r.text
    assert api.post("/").status_code == 405 and api.post("/api/v1/series").status_code == 405
