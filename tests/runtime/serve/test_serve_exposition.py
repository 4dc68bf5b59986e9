"""/metrics written by daemon/vllm_triage/serve/exposition.py is prometheus_client's own
bytes, in both formats: on the daemon's metrics (the golden file's registry, with the
process collector), on generated families of every awkward kind (label values with
quotes, backslashes and newlines, numbers of every size, NaN and infinities), on the
families it hands back to prometheus_client (histograms, units, timestamps, counters
with ``_created``), and through the WSGI app as scrapers ask (content negotiation,
``name[]``, gzip). Its speed is bench/bench_fleet.py's."""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import exposition, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from vllm_triage.serve.exposition import (
    CHUNK_LINES,
    Counter,
    Gauge,
    metrics_app,
    number,
    render,
)

from support import golden_metrics


class Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def theirs(registry: Any) -> tuple[bytes, bytes]:
    return exposition.generate_latest(registry), openmetrics.generate_latest(registry)


def ours(registry: Any) -> tuple[bytes, bytes]:
    return render(registry), render(registry, open_metrics=True)


def test_the_daemons_metrics_are_prometheus_clients_bytes() -> None:
    # Collected once: the process collector's figures change between two collections.
    registry = Families(list(golden_metrics.registry(process_metrics=True).collect()))
    text, om = ours(registry)
    assert (text, om) == theirs(registry)
    assert b"vllm_triage_diagnosis{" in text and om.endswith(b"# EOF\n")


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from([0.0, -0.0, 1e6, 1234567.0, 12345678.9, 1e-7, 0.1, 1e300, 5e-324]),
)
VALUES = st.text(alphabet=st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ['a"b', "a\\b", "a\nb", '\\"\n', ""]
)
LABEL = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,6}", fullmatch=True)


@st.composite
def families(draw: st.DrawFn) -> list[Metric]:
    out: list[Metric] = []
    for i in range(draw(st.integers(1, 4))):
        labels = draw(st.lists(LABEL, unique=True, max_size=3))
        kind = draw(st.sampled_from([GaugeMetricFamily, CounterMetricFamily]))
        doc = draw(st.text(max_size=20))
        family = kind(f"fam_{i}_{draw(LABEL)}", doc, labels=labels)
        for _ in range(draw(st.integers(0, 4))):
            values = [draw(VALUES) for _ in labels]
            family.add_metric(values, draw(NUMBERS))
        out.append(family)
    return out


@settings(max_examples=300, deadline=None)
@given(families())
def test_any_gauges_and_counters_are_written_alike(families: list[Metric]) -> None:
    registry = Families(families)
    assert ours(registry) == theirs(registry)


@settings(max_examples=200, deadline=None)
@given(families())
def test_compact_families_are_the_same_families(families: list[Metric]) -> None:
    """The exporter's compact gauges and counters: the same samples, written alike."""
    compact: list[Metric] = []
    for family in families:
        kind = Gauge if family.type == "gauge" else Counter
        twin = kind(family.name, family.documentation, labels=family._labelnames)  # type: ignore[attr-defined]
        for sample in family.samples:
            twin.add_metric([sample.labels[k] for k in family._labelnames], sample.value)  # type: ignore[attr-defined]
        assert twin.samples == family.samples
        compact.append(twin)
    assert ours(Families(compact)) == theirs(Families(families))


@pytest.mark.parametrize("rows", [0, CHUNK_LINES - 1, CHUNK_LINES, 2 * CHUNK_LINES + 7])
def test_families_longer_than_a_chunk_are_written_alike(rows: int) -> None:
    """A family is written a chunk of lines at a time: the same bytes at and across the
    chunks' edges, a value to escape in the last chunk, label names out of order."""
    for unlabelled in (False, True):
        labels = [] if unlabelled else ["zone", "model"]
        theirs_family = GaugeMetricFamily("wide", "many rows", labels=labels)
        ours_family = Gauge("wide", "many rows", labels=labels)
        for i in range(rows):
            values = [] if unlabelled else [f"z{i}", 'm"q' if i == rows - 1 else "m"]
            theirs_family.add_metric(values, i * 0.5)
            ours_family.add_metric(values, i * 0.5)
        assert ours(Families([ours_family])) == theirs(Families([theirs_family]))


@given(NUMBERS)
def test_numbers_are_written_as_prometheus_client_writes_them(value: float) -> None:
    assert number(value) == floatToGoString(value)


def test_what_it_does_not_write_prometheus_client_does() -> None:
    """A histogram, a gauge with a unit, a sample with a timestamp, a counter with its
    ``_created``, among plain families: the same bytes all the same."""
    hist = HistogramMetricFamily("h", "a histogram", labels=["x"])
    hist.add_metric(["1"], buckets=[("1", 2.0), ("+Inf", 3.0)], sum_value=4.0)
    unit = GaugeMetricFamily("g_seconds", "with a unit", unit="seconds")
    unit.add_metric([], 1.5)
    stamped = GaugeMetricFamily("t", "timestamped", labels=["a"])
    stamped.add_metric(["b"], 1.0, timestamp=1700000000.5)
    created = CounterMetricFamily("c", "created", labels=["a"], created=1700000000.0)
    created.add_metric(["b"], 3.0, created=1700000000.0)
    plain = GaugeMetricFamily("p", 'plain "doc"\\ here', labels=["q"])
    plain.add_metric(['v"1'], 2.0)
    registry = Families([hist, plain, unit, stamped, created, plain])
    assert ours(registry) == theirs(registry)


@pytest.mark.parametrize(
    "accept",
    [
        "",
        "application/openmetrics-text",
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        "text/plain;version=1.0.0;escaping=allow-utf-8",
        "application/openmetrics-text;version=1.0.0;escaping=dots",
    ],
)
@pytest.mark.parametrize("query", ["", "name[]=vllm_triage_target_up&name[]=vllm_triage_scrapes"])
def test_the_app_answers_as_prometheus_clients(accept: str, query: str) -> None:
    registry: CollectorRegistry = golden_metrics.registry()

    def call(app: Any) -> tuple[str, dict[str, str], bytes]:
        seen: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]]) -> None:
            seen.update(status=status, headers=dict(headers))

        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": "/metrics",
            "QUERY_STRING": query,
            "HTTP_ACCEPT": accept,
            "HTTP_ACCEPT_ENCODING": "gzip",
        }
        body = b"".join(app(environ, start_response))
        headers = seen["headers"]
        assert headers.get("Content-Encoding") == "gzip"
        return seen["status"], headers, gzip.decompress(body)

    status, headers, body = call(metrics_app(registry))
    want_status, want_headers, want_body = call(make_wsgi_app(registry))
    assert (status, headers["Content-Type"], body) == (
        want_status,
        want_headers["Content-Type"],
        want_body,
    )
    # (A registry without descriptions narrows to nothing: prometheus_client's rule.)
    assert (b"# HELP" in body) is not bool(query)
