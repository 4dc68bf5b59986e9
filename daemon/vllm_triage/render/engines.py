"""Another engine's PromQL and panels, written from its runtime spec.

vLLM's signal rules are a template of their own (every naming era, written by hand); every
other engine's are generated here from ``rules/runtimes/<name>.yaml``: the same records
(``model:<engine>_ttft_seconds:p99_1m``, ...) over the engine's own families, with its
matchers, its data-parallel rank summed for the latencies and load and kept for the stall,
copies of one scheduler's series read once (``max`` over the copy labels), and the
engine's progress read from the series it writes as it steps (``moves_with_steps``). A
record the engine has nothing for (SGLang's prefill share, LMDeploy's preemptions) is not
written: the cause rules' ``and`` and ``unless`` find nothing there, which is what the
daemon does with a signal the engine does not export, and the header says so.

Pure: the spec and its document in, an ``EngineDialect`` out.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from vllm_triage.core.runtime import Family, RuntimeSpec
from vllm_triage.errors import ConfigError
from vllm_triage.render.templates import DECODE_FIX, VLLM_FIXES, EngineDialect

#: What a progress record reads besides ``moves_with_steps``: the scheduler's gauges
#: (vLLM's rules read them too; an engine writes them as it schedules).
PROGRESS_GAUGES = ("running", "waiting", "kv_usage")
#: The label the progress record tags each family's changes with (summed away).
SERIES = "triage_series"
HEALTH_NOTE = "an HTTP check of the API server does not see this"


def _label_list(labels: Iterable[str]) -> str:
    return ", ".join(labels)


class _Names:
    """One spec's PromQL: selectors and the aggregations over its ranks and copies."""

    def __init__(self, spec: RuntimeSpec, doc: Mapping[str, Any]) -> None:
        self.spec = spec
        self.prefix = spec.prefixes[0]
        self.copies = tuple(spec.copy_labels)
        self.rank = spec.rank_label
        # The labels that split a family beyond the model, the rank and the copies (is
        # the stream a streaming one, which mode, which priority): summed over.
        extra: set[str] = set()
        for entries in (doc.get("families") or {}).values():
            for entry in entries if isinstance(entries, list) else [entries]:
                extra.update((entry.get("labels") or {}).keys())
                extra.update((entry.get("match") or {}).keys())
        extra -= {spec.model_label, *(self.copies), *([self.rank] if self.rank else [])}
        self.extra = tuple(sorted(extra))

    def name(self, f: Family, suffix: str = "") -> str:
        return f"{self.prefix}{f.name}{suffix}"

    def selector(self, f: Family, suffix: str = "", more: Mapping[str, str] | None = None) -> str:
        matchers = [f'{k}="{v}"' for k, v in f.match]
        matchers += [f'{k}=~"{v}"' for k, v in (more or {}).items()]
        inner = ",".join(matchers)
        return f"{self.name(f, suffix)}{{{inner}}}" if inner else self.name(f, suffix)

    def families(self, field: str) -> tuple[Family, ...]:
        return self.spec.families_of(field)

    def has(self, field: str) -> bool:
        return bool(self.families(field))

    def _read_once(self, expr: str) -> str:
        return f"max without ({_label_list(self.copies)}) ({expr})" if self.copies else expr

    def model(self, agg: str, expr: str, also: tuple[str, ...] = ()) -> str:
        """``expr`` per server and model: ranks and splits aggregated, copies read once."""
        over = (*([self.rank] if self.rank else []), *self.extra, *also)
        inner = self._read_once(expr)
        return f"{agg} without ({_label_list(over)}) ({inner})" if over else inner

    def engine(self, agg: str, expr: str, also: tuple[str, ...] = ()) -> str:
        """``expr`` per rank: the splits aggregated, copies read once."""
        over = (*self.extra, *also)
        inner = self._read_once(expr)
        return f"{agg} without ({_label_list(over)}) ({inner})" if over else inner

    def any_of(self, field: str, build: Any) -> str:
        """One expression per family of ``field`` (an engine may have several), the first
        present."""
        parts = [build(f) for f in self.families(field)]
        return "\n  or ".join(parts)


def _record(name: str, expr: str) -> str:
    body = expr.strip("\n")
    if "\n" not in body and len(body) < 80:
        return f"      - record: {name}\n        expr: {body}\n"
    lines = "".join(f"          {line}\n" for line in body.splitlines())
    return f"      - record: {name}\n        expr: |\n{lines}"


def _signals(n: _Names, record: str) -> str:
    out: list[str] = []
    r = f"model:{record}"

    def rate(f: Family, suffix: str) -> str:
        return f"rate({n.selector(f, suffix)}[1m])"

    def hist_mean(field: str) -> str:
        return n.any_of(
            field,
            lambda f: f"{n.model('sum', rate(f, '_sum'))}\n  / {n.model('sum', rate(f, '_count'))}",
        )

    if n.has("ttft"):
        for q, tag in (("0.99", "p99"), ("0.50", "p50")):
            out.append(
                _record(
                    f"{r}_ttft_seconds:{tag}_1m",
                    n.any_of(
                        "ttft",
                        lambda f, q=q: (
                            f"histogram_quantile({q}, {n.model('sum', rate(f, '_bucket'))})"
                        ),
                    ),
                )
            )
        out.append(_record(f"{r}_ttft_seconds:mean_1m", hist_mean("ttft")))
    if n.has("itl"):
        out.append(
            _record(
                f"{r}_itl_seconds_bucket:rate1m",
                n.any_of("itl", lambda f: n.model("sum", rate(f, "_bucket"))),
            )
        )
        out.append(
            _record(
                f"{r}_itl_seconds:p99_1m",
                f"histogram_quantile(0.99, {r}_itl_seconds_bucket:rate1m)",
            )
        )
        out.append(
            _record(
                f"{r}_itl_seconds:p50_1m",
                f"histogram_quantile(0.50, {r}_itl_seconds_bucket:rate1m)",
            )
        )
        out.append(_record(f"{r}_itl_seconds:mean_1m", hist_mean("itl")))
        out.append(
            _record(f"{r}_decode_tokens_per_second:per_stream_1m", f"1 / {r}_itl_seconds:mean_1m")
        )
    if n.has("queue_time") and n.has("ttft"):
        out.append(
            _record(
                f"{r}_queue_time_ttft:ratio_1m",
                f"(\n{textwrap.indent(hist_mean('queue_time'), '  ')}\n)"
                f" / {r}_ttft_seconds:mean_1m",
            )
        )
    if n.has("prefill_time") and n.has("decode_time"):
        prefill = n.any_of("prefill_time", lambda f: n.model("sum", rate(f, "_sum")))
        decode = n.any_of("decode_time", lambda f: n.model("sum", rate(f, "_sum")))
        out.append(
            _record(
                f"{r}_prefill_time:ratio_1m",
                f"{prefill}\n  / (\n    {prefill}\n      + {decode}\n  )",
            )
        )
    for field, tag in (("waiting", "requests_waiting"), ("running", "requests_running")):
        if n.has(field):
            out.append(
                _record(
                    f"{r}_{tag}:avg_1m",
                    n.any_of(
                        field, lambda f: n.model("sum", f"avg_over_time({n.selector(f)}[1m])")
                    ),
                )
            )
    if n.has("kv_usage"):
        out.append(
            _record(
                f"{r}_kv_cache_usage:max_1m",
                n.any_of(
                    "kv_usage", lambda f: n.model("max", f"max_over_time({n.selector(f)}[1m])")
                ),
            )
        )
    for field, tag in (
        ("preemptions", "preemptions"),
        ("prompt_tokens", "prompt_tokens"),
        ("generation_tokens", "generation_tokens"),
    ):
        if n.has(field):
            out.append(
                _record(
                    f"{r}_{tag}:rate1m",
                    n.any_of(field, lambda f: n.model("sum", f"rate({n.selector(f)}[1m])")),
                )
            )
    progress = _progress_selector(n)
    out.append(
        "      # Engine progress: how many times the series the engine writes as it steps\n"
        "      # changed in the last minute (a counter reset, a restarted server, counts as a\n"
        "      # change: progress, not a stall).\n"
    )
    out.append(_record(f"{r}_engine_progress:changes1m", n.model("sum", progress, (SERIES,))))
    outstanding = _outstanding(n, n.model)
    if outstanding:
        out.append(_record(f"{r}_requests_outstanding:min_1m", outstanding))
    rank = n.rank or "none"
    out.append(
        f"      # The same, rank by rank ({rank}; an engine without data parallelism has one\n"
        "      # series, with or without the label).\n"
    )
    out.append(
        _record(
            f"engine:{record}_engine_progress:changes1m",
            n.engine("sum", progress, (SERIES,)),
        )
    )
    outstanding = _outstanding(n, n.engine)
    if outstanding:
        out.append(_record(f"engine:{record}_requests_outstanding:min_1m", outstanding))
    return "".join(out).rstrip("\n")


def _progress_selector(n: _Names) -> str:
    """The changes of every series the engine writes as it steps (any label value: any of
    them moving is progress), each family tagged with its name (``SERIES``): ``changes``
    drops the metric's name, and two families with the same labels would collide. Joined
    by ``or``, so a family not yet written (a labelled counter before its first count)
    leaves the others' changes standing."""
    names: list[str] = []
    fields = [*sorted(n.spec.runtime.moves_with_steps), *PROGRESS_GAUGES]
    for field in fields:
        for f in n.families(field):
            name = n.name(f, "_count" if f.type == "histogram" else "")
            if name not in names:
                names.append(name)
    if not names:
        raise ConfigError(f"runtime {n.spec.name}: no series moves with its steps")
    return "\n  or ".join(
        f'label_replace(changes({name}[1m]), "{SERIES}", "{name}", "", "")' for name in names
    )


def _outstanding(n: _Names, agg: Any) -> str:
    parts = []
    for field in ("running", "waiting"):
        if n.has(field):
            parts.append(
                n.any_of(field, lambda f: agg("sum", f"min_over_time({n.selector(f)}[1m])"))
            )
    return "\n  + ".join(parts)


def _about(spec: RuntimeSpec, n: _Names, record: str) -> str:
    """The rules header's paragraph on the engine's names, ending mid-line (the template
    goes on with " Evaluate every 15 s ...")."""
    rt = spec.runtime
    versions = ", ".join(spec.versions) or "its current names"
    parts = [
        f"Works with {rt.title}'s names ({n.prefix}*, as {versions} writes them; read from "
        f"{spec.source or 'its metrics code'}), as rules/runtimes/{spec.name}.yaml maps "
        "them: the records and alerts are vLLM's, under "
        f"model:{record}_* and {_alert_prefix(spec)}*."
    ]
    if n.rank:
        parts.append(
            f"Data-parallel ranks ({n.rank}) are summed for the latencies and load and judged "
            "one by one for a stall."
        )
    if n.copies:
        parts.append(
            f"Series repeated by copies of one scheduler ({', '.join(n.copies)}) are read "
            "once (max)."
        )
    if n.extra:
        parts.append(f"Splits ({', '.join(n.extra)}) are summed.")
    parts.append(
        "Every other label (job, instance, pod, namespace, "
        f"{spec.model_label}) is kept, so each server and model is judged on its own."
    )
    missing = [
        label
        for field, label in (
            ("preemptions", "no preemption series (KV pressure from usage and waiting)"),
            ("prefill_time", "no prefill time (prefill share unknown)"),
            ("queue_time", "no queue time"),
        )
        if not n.has(field)
    ]
    if missing:
        parts.append("Not exported, so not judged from: " + "; ".join(missing) + ".")
    if rt.itl_measures == "request_mean":
        parts.append(
            "The inter-token histogram holds each request's mean gap: no ITL spike test "
            "(prefill interference) is written."
        )
    elif rt.itl_measures == "token":
        parts.append(
            "The inter-token histogram is per token (a step's gap over the tokens it "
            "brought), which is what a user's stream sees."
        )
    text = " ".join(parts)
    lines = textwrap.wrap(text, width=86)
    return "\n".join(f"# {line}" for line in lines) + "\n#"


def _stall_header(n: _Names) -> str:
    """The header's line on the stall: which series are the engine's progress."""
    names: list[str] = []
    for field in [*sorted(n.spec.runtime.moves_with_steps), *PROGRESS_GAUGES]:
        for f in n.families(field):
            if n.name(f) not in names:
                names.append(n.name(f))
    text = (
        "requests running or waiting and, for a whole minute, none of the series "
        f"{n.spec.runtime.title} writes as it steps moved ({', '.join(names)}), so a hung "
        "engine freezes them all while /metrics still answers. The other causes are "
        "judged only when it does not hold."
    )
    lines = textwrap.wrap(text, width=70)
    first = f"#     stalled        {lines[0]}\n"
    return first + "".join(f"#                    {line}\n" for line in lines[1:])


def _pool_note(n: _Names) -> str:
    pool = [n.name(f) for field in ("pool_tokens", "pool_blocks") for f in n.families(field)]
    if pool:
        return f"(the daemon counts headroom in requests from the pool size in\n# {pool[0]})"
    return (
        f"(as the daemon's too: {n.spec.runtime.title} exports no pool size to\n# count "
        "headroom in requests from)"
    )


def _alert_prefix(spec: RuntimeSpec) -> str:
    return "".join(p.capitalize() for p in re.split(r"[^A-Za-z0-9]+", spec.name) if p)


def _raw(n: _Names) -> tuple[str, str, str, str]:
    model = n.spec.model_label
    var = {model: "$model_name"}
    ttft = next(iter(n.families("ttft")), None)
    waiting = next(iter(n.families("waiting")), None)
    kv = next(iter(n.families("kv_usage")), None)
    if ttft is None or waiting is None or kv is None:
        raise ConfigError(f"runtime {n.spec.name}: the dashboard needs ttft, waiting and kv_usage")
    raw_ttft = (
        f"histogram_quantile(0.99, sum by (le, {model}) (rate("
        f"{n.selector(ttft, '_bucket', var)}[$__rate_interval])))"
    )
    raw_waiting = f"sum by (instance, {model}) ({n._read_once(n.selector(waiting, '', var))})"
    raw_kv = f"max by (instance, {model}) ({n.selector(kv, '', var)})"
    description = (
        f"{n.spec.runtime.title}'s own gauge ({n.name(kv)}), the KV pool's usage as a fraction."
    )
    return raw_ttft, raw_waiting, raw_kv, description


def engine_dialect(spec: RuntimeSpec, doc: Mapping[str, Any]) -> EngineDialect:
    """The rules' and the dashboard's names for ``spec``'s engine (not vLLM's: its are
    ``templates.vllm_dialect``)."""
    n = _Names(spec, doc)
    record = re.sub(r"[^a-z0-9_]", "_", spec.name.lower())
    fixes = {cause: VLLM_FIXES[cause] for cause in VLLM_FIXES}
    for cause, texts in spec.runtime.remediation:
        fixes[cause] = texts[0]
    if "decode_bound" not in dict(spec.runtime.remediation):
        fixes["decode_bound"] = DECODE_FIX
    raw_ttft, raw_waiting, raw_kv, raw_kv_description = _raw(n)
    return EngineDialect(
        runtime=spec.name,
        title=spec.runtime.title,
        record=record,
        alert=_alert_prefix(spec),
        rank_by=n.rank or "",
        rank_label=n.rank or "engine",
        signals=_signals(n, record),
        about=_about(spec, n, record),
        asleep="",
        health_note=HEALTH_NOTE,
        fixes=fixes,
        spike=spec.runtime.itl_measures != "request_mean",
        model=spec.model_label,
        stall_header=_stall_header(n),
        pool_note=_pool_note(n),
        tested=(
            f"# Tested with promtool: rules/prometheus/tests/scenarios-{spec.name}.test.yaml "
            "replays the\n# simulator's scenarios in this engine's dialect and checks that "
            "each fires exactly its\n# alert."
        ),
        raw_ttft=raw_ttft,
        raw_waiting=raw_waiting,
        raw_kv=raw_kv,
        raw_kv_description=raw_kv_description,
    )
