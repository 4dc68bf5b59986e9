"""/metrics written fast: the same bytes as prometheus_client's text and OpenMetrics
writers, for the gauges and counters the daemon exports, at a fraction of their cost.

Fleet mode exports some fifty samples per server: at 10,000 servers half a million
samples a scrape. prometheus_client's writers check every label name and escape every
value character by character for each sample, and compress at gzip's level 9:
seconds of CPU per scrape at that size (bench/bench_fleet.py). Here each family's label
names are checked and ordered once, a value is escaped only when it holds a character
that needs it, numbers are written as prometheus_client writes them
(``floatToGoString``), and the answer is compressed at level 1.

A family that is not a plain gauge or counter with legacy names (a unit, a timestamp, an
exemplar, a histogram), and any scrape asking for the ``dots`` escaping, is written by
prometheus_client itself. ``tests/runtime/serve/test_serve_exposition.py`` holds the two to the same
bytes, on the daemon's own metrics and on generated edge cases.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

StartResponse = Callable[..., Any]
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_PLAIN = frozenset({"gauge", "counter"})
#: gzip level of the answer. On this text (the same few label values over and over)
#: level 1 costs half of level 6's CPU for 15 % more bytes (10,000 servers: 68 MB of text,
#: 0.10 s to 1.9 MB against 0.19 s to 1.6 MB), and level 9 (prometheus_client's) twice
#: level 6's for a few percent less: a scrape's bytes matter less than the replica's core.
GZIP_LEVEL = 1


def number(value: float) -> str:
    """A sample's value as prometheus_client writes it (its ``floatToGoString``)."""
    d = float(value)
    s = repr(d)
    dot = s.find(".")
    if -1 < dot <= 6:
        # The common value (finite, its point among the first seven characters), as
        # Python writes it: half a million a scrape at 10,000 servers.
        return s
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    # Go switches to exponents sooner than Python (for positive values).
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _escaped(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


#: A character that a label value must escape.
_SPECIAL = re.compile(r'[\\\n"]')


class _Compact:
    """A family whose samples are kept as label values and values, two lists side by
    side, until written: a fraction of a ``Sample``'s memory (a named tuple and a dict of
    labels each) and no tuple a row (a scrape at 10,000 servers holds some 200,000 rows of
    one collector's families at once), and what this module writes without building one.
    prometheus_client's writers and anything else that reads ``samples`` get them built on
    demand."""

    name: str
    _labelnames: tuple[str, ...]
    _labels: list[Sequence[str]]
    _values: list[float]
    _sample_name: str

    @property
    def samples(self) -> list[Sample]:
        names, shown = self._labelnames, self._sample_name
        return [
            Sample(shown, dict(zip(names, values, strict=True)), v)
            for values, v in zip(self._labels, self._values, strict=True)
        ]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        if value:  # Metric's constructor sets [], and nothing else may
            raise TypeError("a compact family takes its samples through add_metric")


# ``samples`` is a property here where prometheus_client's Metric has an attribute: on
# purpose (``_Compact``).
class Gauge(_Compact, GaugeMetricFamily):  # pyright: ignore[reportIncompatibleVariableOverride]
    """``GaugeMetricFamily``, kept compact (``_Compact``)."""

    def __init__(self, name: str, documentation: str, *, labels: Sequence[str] = ()) -> None:
        self._labels, self._values = [], []
        super().__init__(name, documentation, labels=labels)
        self._sample_name = self.name

    def add_metric(self, labels: Sequence[str], value: float, timestamp: Any = None) -> None:
        if timestamp is not None:
            raise TypeError("a compact gauge has no timestamps: use GaugeMetricFamily")
        self._labels.append(labels)
        self._values.append(value)


class Counter(_Compact, CounterMetricFamily):  # pyright: ignore[reportIncompatibleVariableOverride]
    """``CounterMetricFamily``, kept compact (``_Compact``)."""

    def __init__(self, name: str, documentation: str, *, labels: Sequence[str] = ()) -> None:
        self._labels, self._values = [], []
        super().__init__(name, documentation, labels=labels)
        self._sample_name = self.name + "_total"

    def add_metric(  # type: ignore[override]
        self, labels: Sequence[str], value: float
    ) -> None:
        self._labels.append(labels)
        self._values.append(value)


def _plain(metric: Metric) -> bool:
    """Whether this module writes ``metric`` (else prometheus_client does): a gauge, or
    a counter without ``_created``, of plain samples."""
    if metric.type not in _PLAIN or metric.unit or not _NAME.match(metric.name):
        return False
    if isinstance(metric, _Compact):
        return True
    name = metric.name + "_total" if metric.type == "counter" else metric.name
    return all(
        s.name == name and s.timestamp is None and s.exemplar is None and s.native_histogram is None
        for s in metric.samples
    )


#: Lines of a family written at a time: the largest family (a cause a row per server) is
#: some 10 MB of text at 10,000 servers, held three times over (its lines, their join,
#: the bytes) if written whole.
CHUNK_LINES = 4096


def _rows(metric: _Compact, out: list[str]) -> Iterator[str]:
    """A compact family's text after ``out`` (its head), ``CHUNK_LINES`` lines at a time:
    its label names ordered and checked once (``_NotPlainError`` before any text), the
    template made once."""
    names = metric._labelnames
    order = sorted(range(len(names)), key=names.__getitem__)
    if not all(_LABEL.match(n) for n in names):
        raise _NotPlainError
    shown = metric._sample_name
    if not names:
        out.extend(f"{shown} {number(v)}\n" for v in metric._values)
        yield "".join(out)
        return
    pairs = ",".join(f'{names[i]}="%s"' for i in order)
    template = f"{shown}{{{pairs}}} %s\n"
    # One search over every label value of the family, not one a row: a value that needs
    # escaping is rare (a peer's label), and only then is each row looked at.
    special = _SPECIAL.search("".join(chain.from_iterable(metric._labels)))
    sorted_already = order == list(range(len(names)))
    for labels, v in zip(metric._labels, metric._values, strict=True):
        if len(out) >= CHUNK_LINES:
            yield "".join(out)
            out.clear()
        values = labels if sorted_already else [labels[i] for i in order]
        if special is not None and _SPECIAL.search("".join(values)):
            values = [_escaped(x) for x in values]
        out.append(template % (*values, number(v)))
    yield "".join(out)


def _samples(metric: Metric, out: list[str]) -> None:
    """Each sample's line. A family's samples share their label names (the exporter's
    families are built with one tuple of them): the line's template is made once, and
    filled with the values, escaped only when one of them holds a character to escape."""
    keys: tuple[str, ...] = ()
    names: frozenset[str] | None = None
    template = ""
    for s in metric.samples:
        labels = s.labels
        if not labels:
            out.append(f"{s.name} {number(s.value)}\n")
            continue
        if labels.keys() != names:
            keys = tuple(sorted(labels))
            if not all(_LABEL.match(k) for k in keys):
                raise _NotPlainError
            names = frozenset(keys)
            pairs = ",".join(f'{k}="%s"' for k in keys)
            template = f"{s.name}{{{pairs}}} %s\n"
        values = [labels[k] for k in keys]
        if _SPECIAL.search("".join(values)):
            values = [_escaped(v) for v in values]
        values.append(number(s.value))
        out.append(template % tuple(values))


class _NotPlainError(Exception):
    """A family this module does not write: prometheus_client writes it."""


class _One:
    """A registry of one family, for prometheus_client's writers."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self.metric]


def _theirs(metric: Metric, open_metrics: bool) -> str:
    if open_metrics:
        om: bytes = openmetrics.generate_latest(_One(metric))  # type: ignore[no-untyped-call]
        return om.decode("utf-8").removesuffix("# EOF\n")
    text: bytes = exposition.generate_latest(_One(metric))
    return text.decode("utf-8")


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _families(registry: Collector, open_metrics: bool) -> Iterator[str]:
    """Each family's text, in order, in parts (``render`` joins them)."""
    for metric in registry.collect():
        if not _plain(metric):
            yield _theirs(metric, open_metrics)
            continue
        name = metric.name
        if open_metrics:
            help_text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            help_text = help_text.replace('"', r"\"")
            out = [f"# HELP {name} {help_text}\n# TYPE {name} {metric.type}\n"]
        else:
            shown = name + "_total" if metric.type == "counter" else name
            out = [f"# HELP {shown} {_help(metric.documentation)}\n# TYPE {shown} {metric.type}\n"]
        try:
            if isinstance(metric, _Compact):
                chunks = _rows(metric, out)
                first = next(chunks)  # the label names checked before any text goes out
            else:
                _samples(metric, out)
                chunks, first = iter(()), "".join(out)
        except _NotPlainError:
            yield _theirs(metric, open_metrics)
            continue
        yield first
        yield from chunks
    if open_metrics:
        yield "# EOF\n"


def render(registry: Collector, *, open_metrics: bool = False) -> bytes:
    """The registry's metrics in the text format (0.0.4) or OpenMetrics 1.0, as
    prometheus_client's ``generate_latest`` writes them."""
    return "".join(_families(registry, open_metrics)).encode("utf-8")


def _gzipped(parts: Iterable[str]) -> bytes:
    """``parts`` encoded and compressed a family at a time: the whole text is never held
    (at 10,000 servers it is some 60 MB, compressed a tenth of that)."""
    z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [z.compress(part.encode("utf-8")) for part in parts]
    out.append(z.flush())
    return b"".join(out)


def metrics_app(registry: Collector) -> Callable[[dict[str, Any], StartResponse], list[bytes]]:
    """/metrics as prometheus_client's WSGI app answers it (the format the scraper asks
    for, ``name[]`` to narrow it, gzip when accepted), written by ``render``."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        encoder, content_type = exposition.choose_encoder(environ.get("HTTP_ACCEPT", ""))
        params = parse_qs(environ.get("QUERY_STRING", ""))
        chosen: Any = registry
        if "name[]" in params:
            chosen = registry.restricted_registry(params["name[]"])  # type: ignore[attr-defined]
        gzipped = exposition.gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        if "escaping=dots" in content_type:
            parts: Iterable[str] = [encoder(chosen).decode("utf-8")]
        else:
            open_metrics = content_type.startswith("application/openmetrics-text")
            parts = _families(chosen, open_metrics)
        headers = [("Content-Type", content_type)]
        if gzipped:
            output = _gzipped(parts)
            headers.append(("Content-Encoding", "gzip"))
        else:
            output = "".join(parts).encode("utf-8")
        start_response("200 OK", headers)
        return [output]

    return app
