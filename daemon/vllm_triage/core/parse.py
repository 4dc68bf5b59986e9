"""Exposition text -> ``Snapshot``: the series the diagnosis needs, from any runtime's body.

One parser for every serving engine: the runtimes' specs (``core.runtime``, compiled by
``core.names``) say which sample names feed which field. The first family a body shows
names its runtime, unless the target names one (``SnapshotParser(named=...)``): then a
body that shows only another engine's families is an error that says so, and a body no
spec recognises is "not a supported engine", with what it did show. The classic text
format (0.0.4) and OpenMetrics 1.0 are read alike, whatever ``Accept`` asked (vLLM's
Rust frontend answers OpenMetrics always): ``# EOF``, exemplars and fractional
timestamps are taken in stride, and the format is kept in the snapshot (a spec's
variant may be told apart by it).

Why not ``prometheus_client.parser``: it builds an object for every sample of every
family (Python GC, process, HTTP middleware, dozens of vLLM families we never read) and is
the slowest stage of an evaluation. This reader checks every line against the text
format's grammar, but only builds values for the samples named in ``names.SAMPLES``.
``tests/core/test_parse.py`` proves that it yields exactly the values prometheus_client
reads from every fixture, of every engine; ``make bench`` measures the difference.

What is an error and what is a problem:

- ``ParseError`` (the whole body is unreadable, as Prometheus would refuse the scrape): not
  UTF-8, empty, JSON rather than exposition text, a line that breaks the grammar (a
  truncated body usually ends in one), a duplicated series, no family of a supported
  engine at all, or only another engine's than the one the target names.
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

from vllm_triage.core.model import (
    Era,
    Format,
    Histogram,
    KVPool,
    ModelSeries,
    Runtime,
    Snapshot,
)
from vllm_triage.core.names import MAX_ENGINES, PER_ENGINE, NameTable, Reading, Spec
from vllm_triage.core.roofline.kvpool import (
    MAX_POOL_TOKENS,
    beyond_bounds,
    parse_cache_config,
    read_pool,
)
from vllm_triage.core.runtime import (
    COUNTER_FIELDS,
    GAUGE_MERGE,
    HISTOGRAM_FIELDS,
    MODEL_GAUGES,
    POOL_GAUGES,
    RuntimeSpec,
    RuntimeTable,
)
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
#: A timestamp: integer milliseconds (text format 0.0.4) or seconds with a fraction
#: (OpenMetrics).
_TIMESTAMP = r"-?[0-9]+(?:\.[0-9]+)?"
#: One sample line of text format 0.0.4 or OpenMetrics (its exemplar, `` # {...} v [t]``,
#: taken off first): name, optional labels, value, optional timestamp.
_SAMPLE_LINE = re.compile(
    rf"{_NAME}(?:\{{{_LABELS}\}})?[ \t]+{_VALUE}(?:[ \t]+{_TIMESTAMP})?[ \t]*"
)
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

    ``runtimes`` are the engines it can read (the bundled table: ``rules.runtime_table``);
    ``named`` is the one the target's settings name, if any: then the body must be that
    engine's, and another engine's families are an error rather than a guess.

    It remembers the label sets it has parsed (they repeat in every scrape), which makes
    the next scrape of the same target cheaper. The memory is bounded by
    ``max_cached_label_sets`` and ``MAX_CACHED_CHARS``; when full it starts over. It
    never changes a result.

    After each ``parse``, ``models_dropped`` is how many distinct ``model_name`` values
    were left out by ``limits.max_models``, and ``first_dropped`` the first of them.
    """

    def __init__(
        self,
        runtimes: RuntimeTable,
        *,
        named: str | None = None,
        max_cached_label_sets: int = 20_000,
        limits: ParseLimits | None = None,
    ) -> None:
        self.table = NameTable.of(runtimes)
        self.named = None if named is None else runtimes.names.index(runtimes.spec(named).name)
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

    def _not_text(self, text: str) -> None:
        """A JSON body (an engine's JSON stats at the path people try first) is said as
        such, with what each engine that answers JSON there says about where to look."""
        if text.lstrip()[:1] in ("{", "["):
            hints = [s.json_hint for s in self.table.runtimes.specs if s.json_hint]
            raise ParseError(
                "the body is JSON, not Prometheus text exposition"
                + (": " + "; ".join(hints) if hints else ""),
                line=1,
            )

    def steps(
        self, text: str, at: float, *, keep: Collection[str] = ()
    ) -> Generator[None, None, Snapshot]:
        """``parse`` as a generator that pauses every ``STEP_LINES`` lines and returns the
        snapshot: an event loop can run other work between the steps of a big body,
        without a thread (a thread parsing holds the GIL against the loop in 5 ms turns,
        which slows every other target's scrape)."""
        if not text.strip():
            raise ParseError("empty body: the target returned no metrics")
        self._not_text(text)
        self._check_cost(text)
        samples = self.table.samples
        prefixes = self.table.prefixes
        r = _Read(admission=_Admission(self.limits.max_models, keep), runtime=self.named)
        if self.named is not None:
            r.spec = self.table.spec(self.named)
        line_re = _SAMPLE_LINE
        longest = self.limits.max_line_length
        self.models_dropped, self.first_dropped = 0, ""

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
                if line == "# EOF":
                    r.openmetrics = True
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
                exemplar = line.find(" # ")
                plain = line if exemplar < 0 else line[:exemplar]
                head, _, value_text = plain.rpartition(" ")
                if head not in checked or not _is_number(value_text):
                    if line_re.fullmatch(plain) is None:
                        raise ParseError(f"not a valid sample line: {line[:120]!r}", line=lineno)
                    if len(checked) >= self._max_cached or self._checked_chars > MAX_CACHED_CHARS:
                        checked.clear()
                        self._checked_chars = 0
                    checked.add(head)
                    self._checked_chars += len(head)
                if r.known is None and line.startswith(prefixes):
                    r.known = self.table.runtime_of(line)
                elif r.known is None:
                    r.saw(line, brace)
                continue
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
            if " # " in rest:
                rest = rest[: rest.index(" # ")]  # an OpenMetrics exemplar
            parts = rest.split()
            if not parts or len(parts) > 2 or rest[:1] not in (" ", "\t"):
                raise ParseError(f"expected a value after the series: {line[:120]!r}", line=lineno)
            try:
                value = number(parts[0])
                if len(parts) == 2:
                    float(parts[1])
            except ValueError:
                raise ParseError(f"not a number: {line[:120]!r}", line=lineno) from None
            if key in r.seen:
                raise ParseError(f"duplicate series {key[0]}{{{key[1][:200]}}}", line=lineno)
            r.seen.add(key)
            if not r.choose(hit, self.table):
                continue
            spec = r.spec
            assert spec is not None
            if spec.copy_labels and r.a_copy(key[0], labels, spec):
                continue
            one = hit.specs[0]
            if one.match or len(hit.specs) > 1:
                found = _matching(hit.specs, labels)
                if found is None:
                    continue
                one = found
            r.take(one, labels, value, spec, where=(line, lineno))

        self.models_dropped = len(r.admission.dropped)
        self.first_dropped = r.admission.first_dropped
        return self._snapshot(at, r)

    def _snapshot(self, at: float, r: _Read) -> Snapshot:
        table = self.table
        if r.matched == 0:
            if self.named is not None and r.other_runtime:
                raise self._contradicted(r)
            if r.known is None or (self.named is not None and r.known != self.named):
                which = (
                    table.runtimes.titles()
                    if self.named is None
                    else table.spec(self.named).runtime.title
                )
                raise ParseError(
                    f"not a supported engine: no family of {which} found{r.what_it_shows()}: "
                    "is this an inference server's Prometheus metrics endpoint?"
                )
            # Only families of a known engine that the diagnosis does not read.
            r.runtime = r.known
        assert r.runtime is not None
        spec = table.spec(r.runtime)
        problems: list[str] = []
        if r.other_prefix_lines:
            problems.append(
                f"{r.other_prefix_lines} samples with a second {spec.runtime.title} prefix "
                f"ignored (kept {r.prefix!r} only, to avoid counting twice)"
            )
        for other, n in sorted(r.other_runtime.items()):
            problems.append(
                f"{n} samples of {table.spec(other).runtime.title}'s families ignored "
                f"(this target is read as {spec.runtime.title})"
            )
        fmt: Format = "openmetrics" if r.openmetrics else "text"
        prefix = r.prefix or spec.prefixes[0]
        return _assemble(at, r, spec.runtime_for(fmt), prefix, problems=problems, fmt=fmt)

    def _contradicted(self, r: _Read) -> ParseError:
        assert self.named is not None
        named = self.table.spec(self.named).runtime.title
        shown = ", ".join(
            f"{self.table.spec(i).runtime.title} ({n} samples)"
            for i, n in sorted(r.other_runtime.items(), key=lambda kv: -kv[1])
        )
        return ParseError(
            f"the target's settings name the runtime {named}, but its metrics are "
            f"{shown}: fix the target's runtime (or remove it to detect the engine)"
        )


def _matching(specs: tuple[Spec, ...], labels: LabelSet) -> Spec | None:
    """The first of ``specs`` whose label values the sample has (absent is "")."""
    for one in specs:
        if all(labels.get(k, "") == v for k, v in one.match):
            return one
    return None


#: How many name prefixes of an unrecognised body are kept to say what it shows.
_SHOWN_PREFIXES = 6


@dataclass(slots=True)
class _Read:
    """What one parse has gathered so far."""

    admission: _Admission
    #: The runtime the body is read as (its index), once decided.
    runtime: int | None
    prefix: str | None = None
    accs: dict[tuple[str, str, str], _Acc] = field(default_factory=dict)
    pools: list[LabelSet] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    other_prefix_lines: int = 0
    other_runtime: dict[int, int] = field(default_factory=dict)
    #: The chosen runtime's spec, and how many of its samples were read.
    spec: RuntimeSpec | None = None
    matched: int = 0
    #: The runtime whose prefix an unread family showed first (a body of a known engine
    #: with none of the families the diagnosis reads).
    known: int | None = None
    openmetrics: bool = False
    per_engine: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    sleep: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Copies of one scheduler's series (labels that only tell ranks apart): the first
    #: copy seen of each series, by the series without those labels.
    copies: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, ...]] = field(
        default_factory=dict
    )
    shown: dict[str, int] = field(default_factory=dict)

    def choose(self, hit: Reading, table: NameTable) -> bool:
        """Whether this sample is read: the body's runtime is the first one it shows (or
        the named one), its prefix the first of that runtime's; the rest is counted."""
        if self.runtime is None:
            self.runtime = hit.runtime
            self.spec = table.spec(hit.runtime)
        if hit.runtime != self.runtime:
            self.other_runtime[hit.runtime] = self.other_runtime.get(hit.runtime, 0) + 1
            return False
        if self.prefix is None:
            self.prefix = hit.prefix
        elif hit.prefix != self.prefix:
            # Both vllm: and ray_vllm: in one body would count every request twice.
            self.other_prefix_lines += 1
            return False
        self.matched += 1
        return True

    def a_copy(self, name: str, labels: LabelSet, spec: RuntimeSpec) -> bool:
        """Whether this sample repeats a series already read, differing only in the
        labels that tell copies apart (tensor-parallel ranks, a process id)."""
        rest = tuple(sorted((k, v) for k, v in labels.items() if k not in spec.copy_labels))
        which = tuple(labels.get(k, "") for k in spec.copy_labels)
        first = self.copies.setdefault((name, rest), which)
        return first != which

    def saw(self, line: str, brace: int) -> None:
        """Note an unread family's prefix, to say what an unrecognised body shows."""
        name = line[:brace] if brace >= 0 else line.partition(" ")[0]
        colon = name.find(":")
        cut = colon + 1 if colon > 0 else name.find("_") + 1
        prefix = name[:cut] if cut > 0 else name
        if prefix in self.shown or len(self.shown) < _SHOWN_PREFIXES:
            self.shown[prefix] = self.shown.get(prefix, 0) + 1

    def what_it_shows(self) -> str:
        if not self.shown:
            return ""
        top = sorted(self.shown.items(), key=lambda kv: (-kv[1], kv[0]))
        return " (it shows " + ", ".join(f"{p}* ({n} samples)" for p, n in top) + ")"

    def take(
        self,
        one: Spec,
        labels: LabelSet,
        value: float,
        spec: RuntimeSpec,
        *,
        where: tuple[str, int],
    ) -> None:
        """One sample into its field's accumulator."""
        kind = one.kind
        if one.scale != 1.0 and kind not in ("bucket", "count", "info", "state"):
            value *= one.scale
        if kind == "info":
            self.pools.append(labels)
            return
        model = labels.get(spec.model_label, "")
        if not self.admission.admits(model):
            return
        engine = labels.get(spec.rank_label) if spec.rank_label is not None else None
        if kind == "state":
            if engine is not None and value >= 0.5:
                engines_asleep = self.sleep.setdefault(model, {})
                if engine in engines_asleep or len(engines_asleep) < MAX_ENGINES:
                    engines_asleep[engine] = labels.get("sleep_state", "")
            return
        if engine is not None:
            name = PER_ENGINE.get((one.field, kind))
            if name is not None:
                by_engine = self.per_engine.setdefault(model, {})
                values = by_engine.get(engine)
                if values is None and len(by_engine) < MAX_ENGINES:
                    values = by_engine[engine] = {}
                if values is not None:
                    values[name] = values.get(name, 0.0) + value
        acc_key = (model, one.field, one.generation)
        acc = self.accs.get(acc_key)
        if acc is None:
            acc = self.accs[acc_key] = _Acc()
        if kind == "bucket":
            le = labels.get("le")
            if le is None:
                line, lineno = where
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


def finish(steps: Generator[None, None, _T]) -> _T:
    """Run a parse's steps to the end, at once."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: _T = done.value
            return result


def parse_snapshot(
    text: str,
    at: float,
    runtimes: RuntimeTable,
    *,
    limits: ParseLimits | None = None,
    named: str | None = None,
) -> Snapshot:
    """Parse one payload without a per-target parser (tests, one-off use)."""
    return SnapshotParser(runtimes, limits=limits, named=named).parse(text, at)


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
    if not (acc.hcount >= 0 and math.isfinite(acc.hsum) and acc.hsum >= 0):
        # Every engine's histograms observe durations and token counts, never negative:
        # such a sum taken as the count since a restart gave a negative mean.
        problems.append(f"{where}: a negative count, or a sum not a number >= 0; left out")
        return None
    if any(later < earlier for earlier, later in itertools.pairwise(cumulative)):
        problems.append(f"{where}: bucket counts decrease with le; left out")
        return None
    return Histogram(bounds=bounds, cumulative=cumulative, count=acc.hcount, sum=acc.hsum)


def _steps(accs: dict[tuple[str, str, str], _Acc], model: str) -> float | None:
    """Engine steps so far: the engine's own step counter where it has one, else a
    histogram observed once per step (vLLM's ``iteration_tokens``, by its ``_count``).

    Read even when the histogram's buckets are unusable: the count alone says whether the
    engine is stepping, which is what a stall is judged on.
    """
    acc, _ = _pick(accs, model, "iterations")
    if acc is not None and acc.counter_seen and acc.problem is None:
        return acc.counter
    acc, _ = _pick(accs, model, "iteration_tokens")
    return acc.hcount if acc is not None else None


def _kv_pool(pools: list[LabelSet], problems: list[str]) -> KVPool | None:
    """vLLM's pool, from ``cache_config_info``'s labels (one sample per engine)."""
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


def _gauge_pool(pool: dict[str, float], problems: list[str]) -> KVPool | None:
    """The pool from an engine's gauges: its size in tokens (SGLang) or in blocks
    (TensorRT-LLM), and its block (page) size. A size no card could hold (the same bound
    as vLLM's labels, ``roofline.kvpool``) is unknown, and said."""
    block = pool.get("pool_block_size") or 1.0
    if pool.get("pool_blocks"):
        blocks = pool["pool_blocks"]
    elif pool.get("pool_tokens"):
        blocks = pool["pool_tokens"] / block
    else:
        return None
    if not (1 <= block <= MAX_POOL_TOKENS and 1 <= blocks <= MAX_POOL_TOKENS):
        return None  # not a number, or not a pool yet
    if block * blocks > MAX_POOL_TOKENS:
        problems.append(
            f"the KV pool's gauges give {block * blocks:.3g} tokens, beyond what any card "
            f"could hold ({MAX_POOL_TOKENS:,}); the pool is unknown"
        )
        return None
    return KVPool(block_size=round(block), num_gpu_blocks=round(blocks))


def _merged(values: list[float], how: str) -> float:
    if how == "sum":
        return sum(values)
    if how == "max":
        return max(values)
    return sum(values) / len(values)


def _assemble(
    at: float, r: _Read, runtime: Runtime, prefix: str, *, problems: list[str], fmt: Format
) -> Snapshot:
    accs = r.accs
    models: dict[str, ModelSeries] = {}
    pool_gauges: dict[str, float] = {}
    for model in sorted({m for (m, _, _) in accs}):
        gauges: dict[str, float] = {}
        kv_usage_max: float | None = None
        engines = 1
        for name in (*MODEL_GAUGES, *POOL_GAUGES):
            acc, _ = _pick(accs, model, name)
            if acc is None or not acc.gauges:
                continue
            bad = [v for v in acc.gauges if not math.isfinite(v) or v < 0]
            if bad:
                problems.append(f"{model or '(no model_name)'}: {name} gauge is {bad[0]}; left out")
                continue
            if name in ("running", "waiting", "kv_usage"):
                engines = max(engines, len(acc.gauges))
            if name == "kv_usage":
                kv_usage_max = max(acc.gauges)
            gauges[name] = _merged(acc.gauges, GAUGE_MERGE[name])
        for name in POOL_GAUGES:
            if name in gauges and name not in pool_gauges:
                pool_gauges[name] = gauges[name]
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
        per_engine = r.per_engine.get(model, {})
        models[model] = ModelSeries(
            model_name=model,
            engines=engines,
            running=gauges.get("running"),
            waiting=gauges.get("waiting"),
            kv_usage=gauges.get("kv_usage"),
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
            per_engine=per_engine if len(per_engine) > 1 else {},
            sleep=r.sleep.get(model, {}),
            estimated_read_bytes=counters.get("estimated_read_bytes"),
            estimated_flops=counters.get("estimated_flops"),
            step_seconds=gauges.get("step_seconds"),
            tokens_per_step=gauges.get("tokens_per_step"),
        )
    pool = _kv_pool(r.pools, problems) if r.pools else _gauge_pool(pool_gauges, problems)
    return Snapshot(
        at=at,
        era=_era(accs),
        prefix=prefix,
        models=models,
        kv_pool=pool,
        problems=tuple(problems),
        runtime=runtime,
        format=fmt,
    )
