"""Exposition text -> ``Snapshot``: the series the diagnosis needs, for every vLLM naming era.

Why not ``prometheus_client.parser``: it builds an object for every sample of every
family (Python GC, process, HTTP middleware, dozens of vLLM families we never read) and is
the slowest stage of an evaluation. This reader checks every line against the text
format's grammar, but only builds values for the samples named in ``names.SAMPLES``.
``tests/test_parse.py`` proves that it yields exactly the values prometheus_client reads
from every fixture; ``make bench`` measures the difference.

What is an error and what is a problem:

- ``ParseError`` (the whole body is unreadable, as Prometheus would refuse the scrape): not
  UTF-8, empty, a line that breaks the grammar (a truncated body usually ends in one), a
  duplicated series, or no vLLM family at all.
- ``Snapshot.problems`` (one series unusable, the rest kept): a NaN or infinite gauge, a
  negative counter, a histogram without its +Inf bucket or ``_count``, buckets that
  decrease, or engines whose bucket bounds differ. The shell logs and counts them.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field

from daemon.core.model import Era, Histogram, KVPool, ModelSeries, Snapshot
from daemon.core.names import COUNTER_FIELDS, GAUGE_FIELDS, HISTOGRAM_FIELDS, PREFIXES, SAMPLES
from daemon.errors import ParseError

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_PAIR = r'[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\\n]|\\.)*"[ \t]*'
_LABELS = rf"(?:{_LABEL_PAIR}(?:,{_LABEL_PAIR})*,?)?[ \t]*"
_VALUE = r"[+-]?(?:[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+\.|Inf|inf|NaN|nan)"
#: One sample line of text format 0.0.4: name, optional labels, value, optional timestamp.
_SAMPLE_LINE = re.compile(rf"{_NAME}(?:\{{{_LABELS}\}})?[ \t]+{_VALUE}(?:[ \t]+-?[0-9]+)?[ \t]*")
_LABELS_FULL = re.compile(_LABELS)
_LABEL_FIND = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"')
_ESCAPES = re.compile(r"\\(.)")
_ESCAPED = {"n": "\n", "\\": "\\", '"': '"'}

LabelSet = dict[str, str]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _unescape(value: str) -> str:
    return _ESCAPES.sub(lambda m: _ESCAPED.get(m.group(1), "\\" + m.group(1)), value)


@dataclass(slots=True)
class _Acc:
    """Per (model, field, naming generation): values gathered while reading."""

    gauges: list[float] = field(default_factory=list)
    counter: float = 0.0
    counter_seen: bool = False
    buckets: dict[str, list[float]] = field(default_factory=dict)  # le -> [sum, series]
    hsum: float | None = None
    hcount: float | None = None
    hcount_series: int = 0
    problem: str | None = None


class SnapshotParser:
    """Reads exposition text from one target; keep one per target.

    It remembers the label sets it has parsed (they repeat in every scrape), which makes
    the next scrape of the same target cheaper. The memory is bounded by
    ``max_cached_label_sets``; when full it starts over. It never changes a result.
    """

    def __init__(self, *, max_cached_label_sets: int = 20_000) -> None:
        self._labels: dict[str, LabelSet] = {}
        # Lines of families we do not read whose name and labels already passed the
        # grammar: next time only their value needs checking.
        self._checked: set[str] = set()
        self._max_cached = max_cached_label_sets

    def parse_bytes(self, body: bytes, at: float) -> Snapshot:
        """Decode a scraped body (UTF-8, as the text format requires) and parse it."""
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(
                f"body is not UTF-8 text (byte {exc.start}): not a Prometheus /metrics payload"
            ) from exc
        return self.parse(text, at)

    def _label_set(self, section: str, lineno: int) -> LabelSet:
        cached = self._labels.get(section)
        if cached is not None:
            return cached
        if _LABELS_FULL.fullmatch(section) is None:
            raise ParseError(f"malformed label set {{{section[:80]}}}", line=lineno)
        labels: LabelSet = {}
        for key, raw in _LABEL_FIND.findall(section):
            labels[key] = _unescape(raw) if "\\" in raw else raw
        if len(self._labels) >= self._max_cached:
            self._labels.clear()
        self._labels[section] = labels
        return labels

    def parse(self, text: str, at: float) -> Snapshot:
        """Parse one payload scraped at ``at`` (unix seconds)."""
        if not text.strip():
            raise ParseError("empty body: the target returned no metrics")
        samples = SAMPLES
        accs: dict[tuple[str, str, str], _Acc] = {}
        pools: list[LabelSet] = []
        seen: set[tuple[str, str]] = set()
        prefix: str | None = None
        other_prefix_lines = 0
        any_vllm = False
        line_re = _SAMPLE_LINE

        if "\r" in text:
            text = text.replace("\r\n", "\n")
        checked = self._checked
        for lineno, line in enumerate(text.split("\n"), start=1):
            if not line or line[0] == "#":
                continue
            hit = None
            brace = line.find("{")
            if brace >= 0:
                hit = samples.get(line[:brace])
            else:
                space = line.find(" ")
                hit = samples.get(line[:space] if space >= 0 else line)
            if hit is None:
                # Not a series we read: check its grammar only, so that a garbled or
                # truncated body is refused rather than half-read.
                head, _, value_text = line.rpartition(" ")
                if head not in checked or not _is_number(value_text):
                    if line_re.fullmatch(line) is None:
                        raise ParseError(f"not a valid sample line: {line[:120]!r}", line=lineno)
                    if len(checked) >= self._max_cached:
                        checked.clear()
                    checked.add(head)
                if not any_vllm and line.startswith(PREFIXES):
                    any_vllm = True
                continue
            any_vllm = True
            line_prefix, spec = hit
            if brace >= 0:
                close = line.rfind("}")
                if close < brace:
                    raise ParseError(f"unclosed label set: {line[:120]!r}", line=lineno)
                section = line[brace + 1 : close]
                rest = line[close + 1 :]
                labels = self._label_set(section, lineno)
                key = (line[:brace], section)
            else:
                section = ""
                rest = line[space:] if space >= 0 else ""
                labels = {}
                key = (line if space < 0 else line[:space], "")
            parts = rest.split()
            if not parts or len(parts) > 2 or rest[:1] not in (" ", "\t"):
                raise ParseError(f"expected a value after the series: {line[:120]!r}", line=lineno)
            try:
                value = float(parts[0])
                if len(parts) == 2:
                    int(parts[1])
            except ValueError:
                raise ParseError(f"not a number: {line[:120]!r}", line=lineno) from None
            if key in seen:
                raise ParseError(f"duplicate series {key[0]}{{{key[1]}}}", line=lineno)
            seen.add(key)
            if prefix is None:
                prefix = line_prefix
            elif line_prefix != prefix:
                # Both vllm: and ray_vllm: in one body would count every request twice.
                other_prefix_lines += 1
                continue
            kind = spec.kind
            if kind == "info":
                pools.append(labels)
                continue
            model = labels.get("model_name", "")
            acc_key = (model, spec.field, spec.generation)
            acc = accs.get(acc_key)
            if acc is None:
                acc = accs[acc_key] = _Acc()
            if kind == "bucket":
                le = labels.get("le")
                if le is None:
                    raise ParseError(f"bucket without an le label: {line[:120]!r}", line=lineno)
                slot = acc.buckets.get(le)
                if slot is None:
                    acc.buckets[le] = [value, 1.0]
                else:
                    slot[0] += value
                    slot[1] += 1.0
            elif kind == "gauge":
                acc.gauges.append(value)
            elif kind == "counter":
                acc.counter += value
                acc.counter_seen = True
                if not 0.0 <= value < math.inf and acc.problem is None:
                    # Checked per engine: a sum could hide one engine's negative value.
                    acc.problem = f"counter is {value}"
            elif kind == "sum":
                acc.hsum = value if acc.hsum is None else acc.hsum + value
            else:  # count
                acc.hcount = value if acc.hcount is None else acc.hcount + value
                acc.hcount_series += 1

        if not any_vllm:
            raise ParseError(
                "no vLLM metrics found (no vllm: or ray_vllm: series): "
                "is this the vLLM server's /metrics endpoint?"
            )
        problems: list[str] = []
        if other_prefix_lines:
            problems.append(
                f"{other_prefix_lines} samples with a second vLLM prefix ignored "
                f"(kept {prefix!r} only, to avoid counting twice)"
            )
        return _assemble(at, accs, pools, prefix or PREFIXES[0], problems)


def parse_snapshot(text: str, at: float) -> Snapshot:
    """Parse one payload without a per-target parser (tests, one-off use)."""
    return SnapshotParser().parse(text, at)


def _era(accs: dict[tuple[str, str, str], _Acc]) -> Era:
    gens = {gen for (_, _, gen) in accs}
    if "new" in gens and "old" in gens:
        return "transitional"
    if "new" in gens:
        return "v1"
    if "old" in gens:
        return "v0"
    return "unknown"


def _pick(accs: dict[tuple[str, str, str], _Acc], model: str, name: str) -> tuple[_Acc | None, str]:
    """The newest naming's values for a field (new > unchanged > old)."""
    for gen in ("new", "both", "old"):
        acc = accs.get((model, name, gen))
        if acc is not None:
            return acc, gen
    return None, ""


def _histogram(acc: _Acc, where: str, problems: list[str]) -> Histogram | None:
    if "+Inf" not in acc.buckets:
        problems.append(f"{where}: no +Inf bucket (truncated histogram); left out")
        return None
    if acc.hcount is None or acc.hsum is None:
        problems.append(f"{where}: no _count or _sum (truncated histogram); left out")
        return None
    series = {slot[1] for slot in acc.buckets.values()}
    if len(series) != 1 or series.pop() != acc.hcount_series:
        problems.append(f"{where}: engines expose different bucket bounds; left out")
        return None
    try:
        pairs = sorted((float(le), slot[0]) for le, slot in acc.buckets.items())
    except ValueError:
        problems.append(f"{where}: a bucket bound is not a number; left out")
        return None
    bounds = tuple(b for b, _ in pairs)
    cumulative = tuple(c for _, c in pairs)
    if any(math.isnan(c) or c < 0 for c in cumulative) or math.isnan(acc.hcount):
        problems.append(f"{where}: NaN or negative bucket counts; left out")
        return None
    if any(later < earlier for earlier, later in itertools.pairwise(cumulative)):
        problems.append(f"{where}: bucket counts decrease with le; left out")
        return None
    return Histogram(bounds=bounds, cumulative=cumulative, count=acc.hcount, sum=acc.hsum)


def _steps(accs: dict[tuple[str, str, str], _Acc], model: str) -> float | None:
    """Engine steps so far: the iteration histogram's ``_count`` (one observation per step).

    Read even when the histogram's buckets are unusable: the count alone says whether the
    engine is stepping, which is what a stall is judged on.
    """
    acc, _ = _pick(accs, model, "iteration_tokens")
    return acc.hcount if acc is not None else None


def _kv_pool(pools: list[LabelSet], problems: list[str]) -> KVPool | None:
    if not pools:
        return None
    try:
        block = {int(p["block_size"]) for p in pools}
        blocks = sum(int(p["num_gpu_blocks"]) for p in pools)
    except (KeyError, ValueError):
        # vLLM prints "None" before the pool is profiled; not a fault of the target.
        return None
    if len(block) != 1 or blocks <= 0:
        problems.append("cache_config_info: engines disagree on block_size; pool size unknown")
        return None
    return KVPool(block_size=block.pop(), num_gpu_blocks=blocks)


def _assemble(
    at: float,
    accs: dict[tuple[str, str, str], _Acc],
    pools: list[LabelSet],
    prefix: str,
    problems: list[str],
) -> Snapshot:
    models: dict[str, ModelSeries] = {}
    for model in sorted({m for (m, _, _) in accs}):
        gauges: dict[str, float] = {}
        kv_usage: float | None = None
        kv_usage_max: float | None = None
        engines = 1
        for name in GAUGE_FIELDS:
            acc, _ = _pick(accs, model, name)
            if acc is None or not acc.gauges:
                continue
            bad = [v for v in acc.gauges if not math.isfinite(v) or v < 0]
            if bad:
                problems.append(f"{model or '(no model_name)'}: {name} gauge is {bad[0]}; left out")
                continue
            engines = max(engines, len(acc.gauges))
            if name == "kv_usage":
                kv_usage = sum(acc.gauges) / len(acc.gauges)
                kv_usage_max = max(acc.gauges)
            else:
                gauges[name] = sum(acc.gauges)
        counters: dict[str, float] = {}
        for name in COUNTER_FIELDS:
            acc, _ = _pick(accs, model, name)
            if acc is None or not acc.counter_seen:
                continue
            if acc.problem is not None:
                problems.append(f"{model}: {name} {acc.problem}; left out")
                continue
            counters[name] = acc.counter
        hists: dict[str, Histogram] = {}
        for name in HISTOGRAM_FIELDS:
            acc, _ = _pick(accs, model, name)
            if acc is None:
                continue
            hist = _histogram(acc, f"{model}: {name}", problems)
            if hist is not None:
                hists[name] = hist
        models[model] = ModelSeries(
            model_name=model,
            engines=engines,
            running=gauges.get("running"),
            waiting=gauges.get("waiting"),
            kv_usage=kv_usage,
            kv_usage_max=kv_usage_max,
            preemptions=counters.get("preemptions"),
            prompt_tokens=counters.get("prompt_tokens"),
            generation_tokens=counters.get("generation_tokens"),
            requests_finished=counters.get("requests_finished"),
            iterations=_steps(accs, model),
            ttft=hists.get("ttft"),
            itl=hists.get("itl"),
            queue_time=hists.get("queue_time"),
            prefill_time=hists.get("prefill_time"),
            decode_time=hists.get("decode_time"),
            prompt_length=hists.get("prompt_length"),
            generation_length=hists.get("generation_length"),
            spec_drafts=counters.get("spec_drafts"),
            spec_draft_tokens=counters.get("spec_draft_tokens"),
            spec_accepted_tokens=counters.get("spec_accepted_tokens"),
            iteration_tokens=hists.get("iteration_tokens"),
        )
    return Snapshot(
        at=at,
        era=_era(accs),
        prefix=prefix,
        models=models,
        kv_pool=_kv_pool(pools, problems),
        problems=tuple(problems),
    )
