"""Other engines' ``/metrics``: the simulated server rendered in each runtime's dialect.

SGLang, LMDeploy and TensorRT-LLM are rendered from their runtime specs
(``rules/runtimes/<name>.yaml``): each family the spec maps, under the engine's name, with
its help text, its bucket bounds and its label sets (the model's label, the data-parallel
rank's, the constant labels of the engine's series), in prometheus_client's text format as
all three serve it. What the engine measures is the spec's to say too: a counter or TTFT
that does not move with the engine's steps is written when a request finishes, an
inter-token histogram is per step, per token (SGLang: each gap over the tokens it
brought) or each request's mean at its end (TensorRT-LLM). vLLM's Rust frontend is vLLM's
V1 families in OpenMetrics, as its prometheus-client crate encodes them.

``tests/simulator/test_dialects.py`` holds each dialect to the engine's own fixture
(``tests/fixtures/runtimes/``): the same family names, label names and bucket bounds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_triage.rules import runtime_documents
from vllm_triage.simulator.engine import Engine
from vllm_triage.simulator.stats import Histogram
from vllm_triage.simulator.textformat import Labels, escape, format_value, header, sample

#: The dialects besides vLLM's own (``exposition``): the runtimes rendered from their
#: specs, and vLLM's Rust frontend.
SPEC_DIALECTS = ("sglang", "lmdeploy", "trtllm")
RUST = "vllm-rust"
DIALECTS = (*SPEC_DIALECTS, RUST)
#: The content type each dialect's /metrics answers with.
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

#: The fields the reference semantics move with the engine's steps (a spec without
#: ``moves_with_steps``): vLLM's.
_STEP_FIELDS = frozenset(
    {"generation_tokens", "prompt_tokens", "iterations", "preemptions", "ttft", "itl"}
)


#: Speculative decoding's counters: only on a server that drafts.
_SPEC_FIELDS = frozenset({"spec_drafts", "spec_draft_tokens", "spec_accepted_tokens"})
#: The engines' own cost estimates (an opt-in flag on each engine): not simulated, as
#: vLLM's V1 rendering leaves them out too.
_NOT_SIMULATED = frozenset({"estimated_read_bytes", "estimated_flops"})


def spec_document(name: str) -> Mapping[str, Any]:
    """A runtime's spec document by its name (a ``KeyError`` for an unknown one)."""
    for _where, doc in runtime_documents():
        if doc.get("name") == name:
            return dict(doc)
    raise KeyError(name)


@dataclass(frozen=True, slots=True)
class _Dialect:
    """What a spec says about rendering: labels and what moves with the steps."""

    doc: Mapping[str, Any]
    moves: frozenset[str]
    itl_measures: str
    model: str
    rank: str | None
    rank_always: bool
    constant: Labels
    rank_constant: Labels
    gauge_constant: Labels

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> _Dialect:
        labels = doc.get("labels") or {}
        moves = doc.get("moves_with_steps")
        return cls(
            doc=doc,
            moves=_STEP_FIELDS if moves is None else frozenset(moves),
            itl_measures=str(doc.get("itl_measures", "step")),
            model=str(labels.get("model", "model_name")),
            rank=labels.get("rank"),
            rank_always=bool(labels.get("rank_always", False)),
            constant={k: str(v) for k, v in (labels.get("constant") or {}).items()},
            rank_constant={k: str(v) for k, v in (labels.get("rank_constant") or {}).items()},
            gauge_constant={k: str(v) for k, v in (labels.get("gauge_constant") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class _Hist:
    """A histogram as rendered: cumulative counts at ``bounds`` then +Inf, sum, count."""

    cumulative: list[float]
    sum: float
    count: float

    @classmethod
    def of(cls, h: Histogram, bounds: tuple[float, ...]) -> _Hist:
        return cls([float(c) for c in h.cumulative(bounds)], h.sum, float(h.count))

    def __add__(self, other: _Hist) -> _Hist:
        return _Hist(
            [a + b for a, b in zip(self.cumulative, other.cumulative, strict=True)],
            self.sum + other.sum,
            self.count + other.count,
        )

    def __sub__(self, other: _Hist) -> _Hist:
        return _Hist(
            [a - b for a, b in zip(self.cumulative, other.cumulative, strict=True)],
            self.sum - other.sum,
            self.count - other.count,
        )


def _gauge(field_name: str, e: Engine) -> float:
    stats, spec = e.stats, e.spec
    values: dict[str, Callable[[], float]] = {
        "running": lambda: e.num_running,
        "waiting": lambda: e.num_waiting,
        "kv_usage": lambda: e.kv_usage,
        "step_seconds": lambda: stats.last_step_s,
        "tokens_per_step": lambda: (
            1.0 + stats.spec_accepted_tokens / stats.spec_drafts if stats.spec_drafts else 1.0
        ),
        "pool_tokens": lambda: spec.num_gpu_blocks * spec.block_size,
        "pool_blocks": lambda: spec.num_gpu_blocks,
        "pool_block_size": lambda: spec.block_size,
    }
    return values[field_name]()


def _counter(field_name: str, e: Engine, d: _Dialect, match: Mapping[str, str]) -> float:
    stats = e.stats
    moves = field_name in d.moves
    if field_name == "prompt_tokens":
        if match.get("mode") == "prefill_compute":
            return stats.prefill_computed  # the tokens the steps computed, recomputation too
        return stats.prompt_tokens if moves else stats.prompt_tokens_finished
    if field_name == "generation_tokens":
        return stats.generation_tokens if moves else stats.generation_tokens_finished
    values: dict[str, Callable[[], float]] = {
        "preemptions": lambda: stats.preemptions,
        "requests_finished": lambda: sum(stats.finished.values()),
        "iterations": lambda: stats.steps,
        "spec_drafts": lambda: stats.spec_drafts,
        "spec_draft_tokens": lambda: stats.spec_draft_tokens,
        "spec_accepted_tokens": lambda: stats.spec_accepted_tokens,
    }
    return values[field_name]()


def _histogram(field_name: str, e: Engine, d: _Dialect, bounds: tuple[float, ...]) -> _Hist:
    stats = e.stats
    if field_name == "itl":
        if d.itl_measures == "request_mean":
            return _Hist.of(stats.tpot, bounds)
        plain = _Hist.of(stats.itl, bounds)
        if d.itl_measures == "token":
            # Each gap of several tokens is observed as that many gaps of a token each.
            return plain - _Hist.of(stats.itl_multi, bounds) + _Hist.of(stats.itl_per_token, bounds)
        return plain
    sources: dict[str, Histogram] = {
        "ttft": stats.ttft if "ttft" in d.moves else stats.ttft_finish,
        "queue_time": stats.queue_start if "queue_time" in d.moves else stats.queue,
        "prefill_time": stats.prefill,
        "decode_time": stats.decode,
        "prompt_length": stats.request_prompt_tokens,
        "generation_length": stats.request_generation_tokens,
        "iteration_tokens": stats.iteration_tokens,
    }
    return _Hist.of(sources[field_name], bounds)


@dataclass(slots=True)
class _Family:
    """One exposed family's lines, gathered over the fields that feed it."""

    name: str
    help: str
    kind: str
    lines: list[str] = field(default_factory=list)


def _entries(doc: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """Each (field, family entry) of a spec, the old naming era left out."""
    for field_name, entries in (doc.get("families") or {}).items():
        for entry in entries if isinstance(entries, list) else [entries]:
            if entry.get("era", "both") != "old" and entry.get("type") not in ("info", "state"):
                yield field_name, entry


def render_spec_dialect(name: str, series: Sequence[tuple[str, Engine]]) -> str:
    """``(model_name, engine)`` pairs at their engines' instant, in ``name``'s dialect.
    A model listed several times is one data-parallel deployment: its engines are its
    ranks, in list order."""
    d = _Dialect.of(spec_document(name))
    prefix = str(d.doc["prefixes"][0])
    ranks: list[tuple[str, str, Engine, bool]] = []  # model, rank, engine, several ranks
    per_model: dict[str, int] = {}
    for model, _engine in series:
        per_model[model] = per_model.get(model, 0) + 1
    seen: dict[str, int] = {}
    for model, engine in series:
        index = seen.get(model, 0)
        seen[model] = index + 1
        ranks.append((model, str(index), engine, per_model[model] > 1))
    families: dict[str, _Family] = {}
    drafting = any(e.spec.num_speculative_tokens > 0 for _m, _r, e, _s in ranks)
    for field_name, entry in _entries(d.doc):
        if field_name in _NOT_SIMULATED or (field_name in _SPEC_FIELDS and not drafting):
            continue  # created at their first draft, as prometheus_client's children are
        kind = str(entry["type"])
        full = prefix + str(entry["name"])
        fam = families.setdefault(full, _Family(full, str(entry.get("help", "")), kind))
        match = {k: str(v) for k, v in (entry.get("match") or {}).items()}
        extra = {k: str(v) for k, v in (entry.get("labels") or {}).items()}
        shown = {k: v for k, v in match.items() if v}  # "" matches the label's absence
        server = entry.get("scope") == "server"
        for model, group in _groups(ranks, server):
            labels: Labels = {d.model: model, **d.constant, **extra, **shown}
            if not server:
                rank, several = group[0][0], group[0][2]
                if d.rank is not None and (several or d.rank_always):
                    labels[d.rank] = rank
                labels.update(d.rank_constant)
            engines = [e for _rank, e, _several in group]
            if kind == "gauge":
                values = [_gauge(field_name, e) for e in engines]
                fam.lines.append(sample(full, {**labels, **d.gauge_constant}, sum(values)))
            elif kind == "counter":
                value = sum(_counter(field_name, e, d, match) for e in engines)
                fam.lines.append(sample(full, labels, value))
            else:
                bounds = tuple(float(b) for b in entry.get("buckets") or ())
                hists = [_histogram(field_name, e, d, bounds) for e in engines]
                total = hists[0]
                for more in hists[1:]:
                    total = total + more
                fam.lines.extend(_histogram_lines(full, labels, bounds, total))
    return "".join(header(f.name, f.help, f.kind) + "".join(f.lines) for f in families.values())


def _groups(
    ranks: list[tuple[str, str, Engine, bool]], server: bool
) -> Iterable[tuple[str, list[tuple[str, Engine, bool]]]]:
    """Rank by rank, or (a server's series) each model's ranks together."""
    if not server:
        for model, rank, engine, several in ranks:
            yield model, [(rank, engine, several)]
        return
    models: dict[str, list[tuple[str, Engine, bool]]] = {}
    for model, rank, engine, several in ranks:
        models.setdefault(model, []).append((rank, engine, several))
    yield from models.items()


def _histogram_lines(name: str, labels: Labels, bounds: tuple[float, ...], h: _Hist) -> list[str]:
    out = [
        sample(f"{name}_bucket", {**labels, "le": format_value(b)}, c)
        for b, c in zip((*bounds, float("inf")), h.cumulative, strict=True)
    ]
    out.append(sample(f"{name}_count", labels, h.count))
    out.append(sample(f"{name}_sum", labels, h.sum))
    return out


# --- vLLM's Rust frontend: V1's families as its prometheus-client crate encodes them ---

_SAMPLE = re.compile(r"^([^{ ]+)(?:\{(.*)\})? (\S+)$")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
#: Gauges the Rust frontend keeps as integers.
_INTEGER_GAUGES = frozenset(
    {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:engine_sleep_state"}
)
#: The families the Rust frontend does not have (vLLM 0.34's binary).
_RUST_ABSENT = frozenset({"vllm:request_render_duration_seconds"})


def _dtoa(value: float) -> str:
    """The dtoa crate's shortest round-trip form: Python's repr, its exponent without '+'."""
    return repr(float(value)).replace("e+", "e")


def _om_labels(pairs: list[tuple[str, str]], *, bucket: bool) -> str:
    """The crate's order: ``le`` first on a bucket, then the family's own labels
    (``model_name`` before ``engine``), the rest as they came."""
    order = {"le": -2, "model_name": -1, "engine": 0} if bucket else {"model_name": -1, "engine": 0}
    ranked = sorted(pairs, key=lambda kv: order.get(kv[0], 1))
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in ranked) + "}" if ranked else ""


def openmetrics_from_v1(text: str) -> str:
    """vLLM's V1 body re-encoded as the Rust frontend serves it: OpenMetrics 1.0, the
    ``_created`` families and the families the frontend lacks left out (see the module's
    note)."""
    out: list[str] = []
    kind = name = ""
    skip = False
    pending_help = ""
    histogram: list[str] = []

    def flush() -> None:
        if histogram:
            # The crate writes _sum, then _count, then the buckets.
            sums = [h for h in histogram if "_sum{" in h or "_sum " in h]
            counts = [h for h in histogram if "_count{" in h or "_count " in h]
            out.extend(sums + counts + [h for h in histogram if h not in sums + counts])
            histogram.clear()

    for line in text.splitlines():
        if line.startswith("# HELP "):
            flush()
            _, _, rest = line.partition("# HELP ")
            name, _, pending_help = rest.partition(" ")
            continue
        if line.startswith("# TYPE "):
            kind = line.rsplit(" ", 1)[1]
            skip = name.endswith("_created") or name in _RUST_ABSENT
            if not skip:
                base = name.removesuffix("_total") if kind == "counter" else name
                out.append(f"# HELP {base} {pending_help.rstrip('.')}.")
                out.append(f"# TYPE {base} {kind}")
            continue
        if skip or not line:
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        sample_name, inner, value = m.group(1), m.group(2) or "", float(m.group(3))
        pairs = _PAIR.findall(inner)
        bucket = sample_name.endswith("_bucket")
        whole = kind in ("counter",) or bucket or sample_name.endswith("_count")
        whole = whole or (kind == "gauge" and (name in _INTEGER_GAUGES or name.endswith("_info")))
        shown = str(round(value)) if whole else _dtoa(value)
        rendered = f"{sample_name}{_om_labels(pairs, bucket=bucket)} {shown}"
        if kind == "histogram":
            histogram.append(rendered)
        else:
            out.append(rendered)
    flush()
    out.append("# EOF")
    return "\n".join(out) + "\n"
