"""Exposition text -> ``Snapshot``: the series the diagnosis needs, for every vLLM naming era.

Why not ``prometheus_client.parser``: it builds an object for every sample of every
family (Python GC, process, HTTP middleware, dozens of vLLM families we never read) and is
the slowest stage of an evaluation. This reader checks every line against the text
format's grammar, but only builds values for the samples named in ``names.SAMPLES``.
``tests/core/test_parse.py`` proves that it yields exactly the values prometheus_client reads
from every fixture; ``make bench`` measures the difference.

What is an error and what is a problem:

- ``ParseError`` (the whole body is unreadable, as Prometheus would refuse the scrape): not
  UTF-8, empty, a line that breaks the grammar (a truncated body usually ends in one), a
  duplicated series, or no vLLM family at all.
- ``TooCostlyError`` (a ``ParseError``: the body may be valid, but reading it would cost
  more than one scrape may): more lines than ``ParseLimits.max_lines``, a line longer than
  ``max_line_length``, a label value longer than ``max_label_value_length``. Like
  Prometheus' ``sample_limit`` and ``label_value_length_limit``, the whole scrape is
  refused rather than half-read.
- ``Snapshot.problems`` (one series unusable, the rest kept): a NaN or infinite gauge, a
  negative counter, a histogram without its +Inf bucket or ``_count``, buckets that
  decrease, or engines whose bucket bounds differ. The shell logs and counts them.

Cost: every regular expression here is linear in its input (no two parts of a pattern can
match the same characters, so a failing match never retries a split; Python's ``re`` holds
the GIL for a whole match, so one quadratic pattern on a 40,000-digit value would freeze
every thread for a minute). With the line count and line length bounded, one parse is
bounded. ``model_name`` values beyond ``max_models`` are skipped while reading (the ones
in ``keep`` first), so a target exposing 200,000 of them costs no more than its lines.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Collection, Generator
from dataclasses import dataclass, field
from typing import TypeVar

from vllm_triage.core.model import Era, Histogram, KVPool, ModelSeries, Snapshot
from vllm_triage.core.names import (
    COUNTER_FIELDS,
    GAUGE_FIELDS,
    HISTOGRAM_FIELDS,
    MAX_ENGINES,
    PER_ENGINE,
    PREFIXES,
    SAMPLES,
)
from vllm_triage.core.roofline.kvpool import beyond_bounds, parse_cache_config, read_pool
from vllm_triage.errors import ParseError, TooCostlyError

_T = TypeVar("_T")

# Written so that no two parts can match the same text (whitespace belongs to the
# separators only; a quoted string is the "unrolled loop" form; a number's digits can
# be split one way only): a failing match is then linear, not quadratic.
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_QUOTED = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
_LABEL_PAIR = rf"[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*{_QUOTED}"
_LABELS = rf"[ \t]*(?:{_LABEL_PAIR}[ \t]*(?:,[ \t]*{_LABEL_PAIR}[ \t]*)*(?:,[ \t]*)?)?"
_HEX = r"0[xX](?:[0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+"
_VALUE = rf"[+-]?(?:{_HEX}|(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|Inf|inf|NaN|nan)"
#: One sample line of text format 0.0.4: name, optional labels, value, optional timestamp.
_SAMPLE_LINE = re.compile(rf"{_NAME}(?:\{{{_LABELS}\}})?[ \t]+{_VALUE}(?:[ \t]+-?[0-9]+)?[ \t]*")
_LABELS_FULL = re.compile(_LABELS)
_LABEL_FIND = re.compile(rf"([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*({_QUOTED})")
_ESCAPES = re.compile(r"\\(.)")
_ESCAPED = {"n": "\n", "\\": "\\", '"': '"'}

LabelSet = dict[str, str]


def number(text: str) -> float:
    """A sample's value as Prometheus reads it (Go's ``ParseFloat``): decimal, ``Inf``,
    ``NaN``, and hexadecimal floats (``0x1p3`` is 8.0), which Python's ``float`` refuses.
    ``ValueError`` if it is none of them."""
    try:
        return float(text)
    except ValueError:
        if "x" not in text and "X" not in text:
            raise
        return float.fromhex(text)


def _is_number(text: str) -> bool:
    try:
        number(text)
    except ValueError:
        return False
    return True


def _unescape(value: str) -> str:
    return _ESCAPES.sub(lambda m: _ESCAPED.get(m.group(1), "\\" + m.group(1)), value)


#: What one scrape may cost by default (``Settings`` can change each): room for the
#: default 100 models of vLLM 0.19's ~350 samples each with 40 % to spare (a parse costs
#: about 10 microseconds a line), lines a hundred times the longest vLLM writes, and
#: model names (paths included) well below a kilobyte.
DEFAULT_MAX_LINES = 50_000
DEFAULT_MAX_LINE_LENGTH = 65_536
DEFAULT_MAX_LABEL_VALUE_LENGTH = 1024
DEFAULT_MAX_MODELS = 100
#: The parser's memos hold at most this many characters (a label set of a 64 KiB line
#: counts 64 Ki), so that hostile bodies cannot grow them scrape after scrape.
MAX_CACHED_CHARS = 4 * 1024 * 1024
#: ``SnapshotParser.steps`` pauses after this many lines (a few milliseconds of work).
STEP_LINES = 1000


@dataclass(frozen=True, slots=True)
class ParseLimits:
    """Bounds on what one body may cost to read (see the module docstring)."""

    max_lines: int = DEFAULT_MAX_LINES
    max_line_length: int = DEFAULT_MAX_LINE_LENGTH
    max_label_value_length: int = DEFAULT_MAX_LABEL_VALUE_LENGTH
    #: Distinct ``model_name`` values read; the others' lines are skipped and counted.
    max_models: int = DEFAULT_MAX_MODELS


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


class _Admission:
    """Which ``model_name`` values one parse reads: at most ``limit``, with a slot kept
    for each of ``keep`` (the models already watched) wherever it appears in the body;
    the others in order of appearance. The rest are counted, never read."""

    __slots__ = ("admitted", "dropped", "first_dropped", "keep", "other_slots", "others")

    def __init__(self, limit: int, keep: Collection[str]) -> None:
        self.keep = frozenset(keep) if len(keep) <= limit else frozenset(sorted(keep)[:limit])
        self.other_slots = limit - len(self.keep)
        self.admitted: set[str] = set()
        self.others = 0
        self.dropped: set[str] = set()
        self.first_dropped = ""

    def admits(self, model: str) -> bool:
        if model in self.admitted:
            return True
        if model in self.dropped:
            return False
        if model in self.keep or self.others < self.other_slots:
            self.others += model not in self.keep
            self.admitted.add(model)
            return True
        if not self.dropped:
            self.first_dropped = model
        self.dropped.add(model)
        return False


class SnapshotParser:
    """Reads exposition text from one target; keep one per target.

    It remembers the label sets it has parsed (they repeat in every scrape), which makes
    the next scrape of the same target cheaper. The memory is bounded by
    ``max_cached_label_sets`` and ``MAX_CACHED_CHARS``; when full it starts over. It
    never changes a result.

    After each ``parse``, ``models_dropped`` is how many distinct ``model_name`` values
    were left out by ``limits.max_models``, and ``first_dropped`` the first of them.
    """

    def __init__(
        self, *, max_cached_label_sets: int = 20_000, limits: ParseLimits | None = None
    ) -> None:
        self._labels: dict[str, LabelSet] = {}
        self._labels_chars = 0
        # Lines of families we do not read whose name and labels already passed the
        # grammar: next time only their value needs checking.
        self._checked: set[str] = set()
        self._checked_chars = 0
        self._max_cached = max_cached_label_sets
        self.limits = limits or ParseLimits()
        self.models_dropped = 0
        self.first_dropped = ""

    def parse_bytes(self, body: bytes, at: float, *, keep: Collection[str] = ()) -> Snapshot:
        """Decode a scraped body (UTF-8, as the text format requires) and parse it."""
        return finish(self.steps_bytes(body, at, keep=keep))

    def steps_bytes(
        self, body: bytes, at: float, *, keep: Collection[str] = ()
    ) -> Generator[None, None, Snapshot]:
        """``parse_bytes`` in steps: see ``steps``."""
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(
                f"body is not UTF-8 text (byte {exc.start}): not a Prometheus /metrics payload"
            ) from exc
        return (yield from self.steps(text, at, keep=keep))

    def _label_set(self, section: str, lineno: int) -> LabelSet:
        cached = self._labels.get(section)
        if cached is not None:
            return cached
        if _LABELS_FULL.fullmatch(section) is None:
            raise ParseError(f"malformed label set {{{section[:80]}}}", line=lineno)
        labels: LabelSet = {}
        longest = self.limits.max_label_value_length
        # findall only ever sees a section that fullmatched above: consecutive pairs, so
        # it never rescans from inside a value.
        for key, quoted in _LABEL_FIND.findall(section):
            raw = quoted[1:-1]
            if len(raw) > longest:
                raise TooCostlyError(
                    f"label {key[:40]} is {len(raw)} characters long, more than "
                    f"max_label_value_length ({longest})",
                    line=lineno,
                )
            labels[key] = _unescape(raw) if "\\" in raw else raw
        if len(self._labels) >= self._max_cached or self._labels_chars > MAX_CACHED_CHARS:
            self._labels.clear()
            self._labels_chars = 0
        self._labels[section] = labels
        self._labels_chars += len(section)
        return labels

    def _check_cost(self, text: str) -> None:
        lines = text.count("\n") + 1
        if lines > self.limits.max_lines:
            raise TooCostlyError(
                f"{lines} lines, more than max_lines_per_scrape ({self.limits.max_lines})"
            )

    def parse(self, text: str, at: float, *, keep: Collection[str] = ()) -> Snapshot:
        """Parse one payload scraped at ``at`` (unix seconds). ``keep``: the models
        already watched, read first when there are more than ``limits.max_models``."""
        return finish(self.steps(text, at, keep=keep))

    def steps(
        self, text: str, at: float, *, keep: Collection[str] = ()
    ) -> Generator[None, None, Snapshot]:
        """``parse`` as a generator that pauses every ``STEP_LINES`` lines and returns the
        snapshot: an event loop can run other work between the steps of a big body,
        without a thread (a thread parsing holds the GIL against the loop in 5 ms turns,
        which slows every other target's scrape)."""
        if not text.strip():
            raise ParseError("empty body: the target returned no metrics")
        self._check_cost(text)
        samples = SAMPLES
        accs: dict[tuple[str, str, str], _Acc] = {}
        pools: list[LabelSet] = []
        seen: set[tuple[str, str]] = set()
        prefix: str | None = None
        other_prefix_lines = 0
        any_vllm = False
        line_re = _SAMPLE_LINE
        longest = self.limits.max_line_length
        admission = _Admission(self.limits.max_models, keep)
        self.models_dropped, self.first_dropped = 0, ""
        per_engine: dict[str, dict[str, dict[str, float]]] = {}
        sleep: dict[str, dict[str, str]] = {}

        if "\r" in text:
            text = text.replace("\r\n", "\n")
        checked = self._checked
        countdown = STEP_LINES
        for lineno, line in enumerate(text.split("\n"), start=1):
            countdown -= 1
            if not countdown:
                countdown = STEP_LINES
                yield
            if len(line) > longest:
                raise TooCostlyError(
                    f"a line of {len(line)} characters, more than max_line_length ({longest})",
                    line=lineno,
                )
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
                    if len(checked) >= self._max_cached or self._checked_chars > MAX_CACHED_CHARS:
                        checked.clear()
                        self._checked_chars = 0
                    checked.add(head)
                    self._checked_chars += len(head)
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
                # ``space`` was found above on this same branch (no brace on the line).
                section = ""
                rest = line[space:] if space >= 0 else ""  # pyright: ignore[reportPossiblyUnboundVariable]
                labels = {}
                key = (line if space < 0 else line[:space], "")  # pyright: ignore[reportPossiblyUnboundVariable]
            parts = rest.split()
            if not parts or len(parts) > 2 or rest[:1] not in (" ", "\t"):
                raise ParseError(f"expected a value after the series: {line[:120]!r}", line=lineno)
            try:
                value = number(parts[0])
                if len(parts) == 2:
                    int(parts[1])
            except ValueError:
                raise ParseError(f"not a number: {line[:120]!r}", line=lineno) from None
            if key in seen:
                raise ParseError(f"duplicate series {key[0]}{{{key[1][:200]}}}", line=lineno)
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
            if not admission.admits(model):
                continue
            engine = labels.get("engine")
            if kind == "state":
                if engine is not None and value >= 0.5:
                    engines_asleep = sleep.setdefault(model, {})
                    if engine in engines_asleep or len(engines_asleep) < MAX_ENGINES:
                        engines_asleep[engine] = labels.get("sleep_state", "")
                continue
            if engine is not None:
                name = PER_ENGINE.get((spec.field, kind))
                if name is not None:
                    by_engine = per_engine.setdefault(model, {})
                    values = by_engine.get(engine)
                    if values is None and len(by_engine) < MAX_ENGINES:
                        values = by_engine[engine] = {}
                    if values is not None:
                        values[name] = values.get(name, 0.0) + value
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

        self.models_dropped, self.first_dropped = len(admission.dropped), admission.first_dropped
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
        return _assemble(
            at, accs, pools, prefix or PREFIXES[0], problems, per_engine=per_engine, sleep=sleep
        )


def finish(steps: Generator[None, None, _T]) -> _T:
    """Run a parse's steps to the end, at once."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: _T = done.value
            return result


def parse_snapshot(text: str, at: float, *, limits: ParseLimits | None = None) -> Snapshot:
    """Parse one payload without a per-target parser (tests, one-off use)."""
    return SnapshotParser(limits=limits).parse(text, at)


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
    # A number no card could hold is a peer's, not a pool: unknown, and said.
    beyond = next(filter(None, map(beyond_bounds, pools)), None)
    if beyond is not None:
        problems.append(beyond)
    sizes = [read_pool(p) for p in pools]
    if None in sizes:
        # vLLM prints "None" before the pool is profiled; not a fault of the target.
        return None
    block = {size[0] for size in sizes if size is not None}
    blocks = sum(size[1] for size in sizes if size is not None)
    if len(block) != 1 or blocks <= 0:
        problems.append("cache_config_info: engines disagree on block_size; pool size unknown")
        return None
    first = min(pools, key=lambda p: p.get("engine", ""))
    return KVPool(block_size=block.pop(), num_gpu_blocks=blocks, config=parse_cache_config(first))


def _assemble(
    at: float,
    accs: dict[tuple[str, str, str], _Acc],
    pools: list[LabelSet],
    prefix: str,
    problems: list[str],
    *,
    per_engine: dict[str, dict[str, dict[str, float]]],
    sleep: dict[str, dict[str, str]],
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
            render_time=hists.get("render_time"),
            # One engine is the merged series itself: watched as today.
            per_engine=per_engine.get(model, {}) if len(per_engine.get(model, {})) > 1 else {},
            sleep=sleep.get(model, {}),
            estimated_read_bytes=counters.get("estimated_read_bytes"),
            estimated_flops=counters.get("estimated_flops"),
        )
    return Snapshot(
        at=at,
        era=_era(accs),
        prefix=prefix,
        models=models,
        kv_pool=_kv_pool(pools, problems),
        problems=tuple(problems),
    )
