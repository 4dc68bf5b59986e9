"""Serving engines as data: each runtime's spec in one fixed vocabulary, and what its
metrics mean to the diagnosis.

A *runtime* is the serving engine behind a target (vLLM, SGLang, LMDeploy, TensorRT-LLM).
The word is not ``engine``: in vLLM's metrics ``engine`` is a data-parallel rank, and
``core.engines`` is their balance. Each runtime is described by a spec kept in
``rules/runtimes/<name>.yaml`` (``docs/engines.md`` explains the vocabulary) and read
into the frozen shapes below; the parser (``core.parse``), the window (``core.totals``)
and the diagnosis read the shapes, so adding an engine is adding a spec and its fixtures,
not code in the core.

Two shapes, because two things differ between engines:

- ``RuntimeSpec``: how an engine *names* what it measures (prefixes, families and their
  naming eras, the labels that carry the model and the data-parallel rank, the path it
  serves them at, the variants a scrape can show);
- ``Runtime``: what those measurements *mean* (which series move as the engine steps and
  which only when a request finishes, what the inter-token histogram observes, what the
  engine cannot tell us, which causes can be judged at all). It travels with every
  snapshot and every window's signals; its defaults are the reference semantics (vLLM's),
  so a snapshot built without one reads as vLLM's always did.

Pure: documents (plain mappings, already loaded) in, shapes out; a document that breaks
the vocabulary is a ``ConfigError`` naming the spec and the key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from vllm_triage.core.model import CAUSES, STEP_FIELDS, Cause, Limit, Runtime
from vllm_triage.errors import ConfigError

#: What a family's samples are, as the parser reads them.
FamilyType = Literal["gauge", "counter", "histogram", "info", "state"]
#: Naming eras of one engine: a field can have an old and a new name (vLLM's V0 and V1);
#: where a scrape shows both, the new one wins.
Generation = Literal["old", "new", "both"]

#: The vocabulary: every field a spec may map, what kind of family it is, and how the
#: values of several series (data-parallel ranks) merge into one model's value.
#: ``sum``: requests, tokens, blocks (they add up); ``mean``: fractions and per-step
#: figures (each rank has its own); ``max``: a size every rank shares.
GAUGE_MERGE: Mapping[str, Literal["sum", "mean", "max"]] = {
    "running": "sum",
    "waiting": "sum",
    "kv_usage": "mean",
    # The last engine step's duration, where the engine exports it as a gauge.
    "step_seconds": "mean",
    # Tokens one request gets per step (speculative decoding's acceptance length).
    "tokens_per_step": "mean",
    # The KV pool's size, where it is a gauge rather than vLLM's cache_config_info.
    "pool_tokens": "sum",
    "pool_blocks": "sum",
    "pool_block_size": "max",
}
COUNTER_FIELDS = (
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    "requests_finished",
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "estimated_read_bytes",
    "estimated_flops",
    # Engine steps, where the engine counts them (otherwise a histogram observed once per
    # step counts them: vLLM's iteration_tokens).
    "iterations",
)
HISTOGRAM_FIELDS = (
    "ttft",
    "itl",
    "queue_time",
    "prefill_time",
    "decode_time",
    "prompt_length",
    "generation_length",
    "iteration_tokens",
    "render_time",
)
#: Fields with a family of their own kind: vLLM's KV pool settings (an info gauge) and
#: its engines' sleep state (a 0/1 gauge per state).
OTHER_FIELDS: Mapping[str, FamilyType] = {"kv_pool": "info", "sleep_state": "state"}
POOL_GAUGES = ("pool_tokens", "pool_blocks", "pool_block_size")
#: The gauges a model's series carries (the pool's are the snapshot's).
MODEL_GAUGES = tuple(g for g in GAUGE_MERGE if g not in POOL_GAUGES)
FIELD_TYPES: Mapping[str, FamilyType] = {
    **dict.fromkeys(GAUGE_MERGE, "gauge"),
    **dict.fromkeys(COUNTER_FIELDS, "counter"),
    **dict.fromkeys(HISTOGRAM_FIELDS, "histogram"),
    **OTHER_FIELDS,
}


@dataclass(frozen=True, slots=True)
class Family:
    """One exposed family read into one field of the vocabulary.

    ``name`` is without the engine's prefix; a counter's name ends in ``_total`` as its
    samples do. ``match``: label values a sample must have to count (a label absent from
    the sample counts as ``""``, as PromQL has it). ``scale`` converts the engine's unit
    into the vocabulary's (seconds, fractions 0..1, tokens). ``buckets``: the bounds the
    engine's code gives a histogram (the simulator's dialect uses them, and a test holds
    them to the engine's fixture). ``help``: the engine's HELP text."""

    field: str
    type: FamilyType
    name: str
    generation: Generation = "both"
    match: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0
    buckets: tuple[float, ...] = ()
    help: str = ""


@dataclass(frozen=True, slots=True)
class Variant:
    """A variant of an engine a scrape can show (vLLM's Rust frontend answers in
    OpenMetrics whatever it is asked): what tells it apart, what it lacks, and why."""

    name: str
    format: Literal["openmetrics", "text"]
    absent: tuple[str, ...] = ()
    limits: tuple[Limit, ...] = ()


@dataclass(frozen=True, slots=True)
class RuntimeSpec:
    """How one engine names what it measures, and what that means (``runtime``)."""

    runtime: Runtime
    versions: tuple[str, ...]
    prefixes: tuple[str, ...]
    families: tuple[Family, ...]
    #: The label naming the served model, and the one naming the data-parallel rank
    #: (None: the engine exports one rank per scrape).
    model_label: str = "model_name"
    rank_label: str | None = None
    #: Labels whose values tell apart copies of one scheduler's series (tensor-parallel
    #: ranks that each report the same batch; a process id): series that differ only in
    #: these are read once (the first), never added up.
    copy_labels: tuple[str, ...] = ()
    #: Where the engine serves its Prometheus metrics (the default path when the runtime
    #: is named in a target's settings).
    metrics_path: str = "/metrics"
    variants: tuple[Variant, ...] = ()
    #: What to say when a scrape is JSON rather than Prometheus text (an engine that
    #: answers JSON at a path people try first).
    json_hint: str = ""
    #: Where the facts of the spec were read (the engine's own code, its version).
    source: str = ""

    @property
    def name(self) -> str:
        return self.runtime.name

    def variant_for(self, fmt: str) -> Variant | None:
        return next((v for v in self.variants if v.format == fmt), None)

    def runtime_for(self, fmt: str) -> Runtime:
        """The runtime as a scrape in ``fmt`` shows it: a variant adds its limits."""
        v = self.variant_for(fmt)
        if v is None:
            return self.runtime
        return replace(
            self.runtime,
            variant=v.name,
            absent=frozenset(v.absent),
            limits=(*self.runtime.limits, *v.limits),
        )

    def families_of(self, field_name: str) -> tuple[Family, ...]:
        return tuple(f for f in self.families if f.field == field_name)


@dataclass(frozen=True, slots=True)
class RuntimeTable:
    """Every runtime the daemon knows, in the order detection tries them."""

    specs: tuple[RuntimeSpec, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.specs)

    def get(self, name: str) -> RuntimeSpec | None:
        return next((s for s in self.specs if s.name == name), None)

    def spec(self, name: str) -> RuntimeSpec:
        found = self.get(name)
        if found is None:
            raise ConfigError(
                f"runtime {name!r} is not one vllm-triage knows; known: {', '.join(self.names)}"
            )
        return found

    def titles(self) -> str:
        """``vLLM, SGLang, LMDeploy or TensorRT-LLM``: what a scrape may be."""
        titles = [s.runtime.title for s in self.specs]
        return ", ".join(titles[:-1]) + f" or {titles[-1]}" if len(titles) > 1 else "".join(titles)

    @classmethod
    def of(cls, documents: Sequence[tuple[str, Mapping[str, Any]]]) -> RuntimeTable:
        """Specs from their documents ``(source, mapping)``, in the order given."""
        specs = tuple(spec_from_document(doc, source=src) for src, doc in documents)
        seen: dict[str, str] = {}
        for s in specs:
            for prefix in s.prefixes:
                if prefix in seen:
                    raise ConfigError(
                        f"runtimes {seen[prefix]} and {s.name} both claim the prefix {prefix!r}"
                    )
                seen[prefix] = s.name
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ConfigError(f"runtime names repeat: {', '.join(names)}")
        return cls(specs)


# --- reading a spec document ------------------------------------------------------


def _fail(source: str, where: str, what: str) -> ConfigError:
    return ConfigError(f"{source}: {where}: {what}")


def _str(doc: Mapping[str, Any], key: str, source: str, default: str | None = None) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str) or not value:
        raise _fail(source, key, "expected a non-empty string")
    return value


def _strs(value: Any, source: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(source, where, "expected a list of strings")
    return tuple(value)


#: A family's keys (``unit`` is said for the reader; the vocabulary's units are fixed).
#: ``scope`` (``server``: a series without the rank's labels, as an engine's API server
#: writes it) and ``labels`` (constant labels of the family) describe the engine's label
#: sets for the simulator's dialect; the parser keys on the model and rank labels alone.
_FAMILY_KEYS = frozenset(
    {"type", "name", "era", "match", "scale", "buckets", "help", "unit", "scope", "labels"}
)
#: The keys of a spec's ``labels``: the model's and the rank's label, the copy labels,
#: and (for the simulator's dialect) the constant labels of every series, of the rank's
#: series and of the gauges, and whether the rank label is there with one rank too.
_LABEL_KEYS = frozenset(
    {"model", "rank", "copies", "rank_always", "constant", "rank_constant", "gauge_constant"}
)


def _family(fname: str, entry: Any, source: str, where: str) -> Family:
    if not isinstance(entry, Mapping):
        raise _fail(source, where, "expected a mapping with type and name")
    unknown = set(entry) - _FAMILY_KEYS
    if unknown:
        raise _fail(source, where, f"unknown keys {sorted(unknown)}")
    kind = FIELD_TYPES[fname]
    if entry.get("type") != kind:
        raise _fail(source, where, f"{fname} is a {kind}, not {entry.get('type')!r}")
    name = _str(entry, "name", source)
    era = entry.get("era", "both")
    if era not in ("old", "new", "both"):
        raise _fail(source, where, f"era must be old, new or both, not {era!r}")
    match = entry.get("match") or {}
    if not isinstance(match, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in match.items()
    ):
        raise _fail(source, where, "match: expected label: value strings")
    scale = entry.get("scale", 1.0)
    if not isinstance(scale, int | float) or isinstance(scale, bool) or scale <= 0:
        raise _fail(source, where, "scale: expected a positive number")
    raw = entry.get("buckets") or []
    if not isinstance(raw, list) or not all(
        isinstance(b, int | float) and not isinstance(b, bool) for b in raw
    ):
        raise _fail(source, where, "buckets: expected a list of numbers")
    bounds = tuple(float(b) for b in raw)
    if any(b >= a for a, b in zip(bounds[1:], bounds, strict=False)):
        raise _fail(source, where, "buckets: bounds must increase")
    help_text = entry.get("help", "")
    if not isinstance(help_text, str):
        raise _fail(source, where, "help: expected a string")
    return Family(
        field=fname,
        type=kind,
        name=name,
        generation=era,
        match=tuple(sorted(match.items())),
        scale=float(scale),
        buckets=bounds,
        help=help_text,
    )


def _limits(value: Any, source: str, where: str) -> tuple[Limit, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _fail(source, where, "expected a list of {what, says, affects}")
    out = []
    for i, item in enumerate(value):
        here = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise _fail(source, here, "expected a mapping with what and says")
        affects = _strs(item.get("affects"), source, f"{here}.affects")
        bad = [a for a in affects if a not in CAUSES]
        if bad:
            raise _fail(source, here, f"affects: not causes: {bad}")
        out.append(Limit(_str(item, "what", source), _str(item, "says", source), affects))
    return tuple(out)


def _remediation(value: Any, source: str) -> tuple[tuple[Cause, tuple[str, ...]], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise _fail(source, "remediation", "expected a mapping of causes to lists of fixes")
    bad = [c for c in value if c not in CAUSES]
    if bad:
        raise _fail(source, "remediation", f"not causes: {bad}")
    return tuple((c, _strs(value[c], source, f"remediation.{c}")) for c in CAUSES if value.get(c))


_SPEC_KEYS = frozenset(
    {
        "name",
        "title",
        "versions",
        "source",
        "prefixes",
        "metrics_path",
        "labels",
        "families",
        "itl_measures",
        "moves_with_steps",
        "judges",
        "limits",
        "variants",
        "json_hint",
        "remediation",
    }
)


def spec_from_document(doc: Any, *, source: str) -> RuntimeSpec:
    """One runtime's spec from its document; a ``ConfigError`` says what is wrong where."""
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{source}: expected a mapping (a runtime spec)")
    unknown = set(doc) - _SPEC_KEYS
    if unknown:
        raise _fail(source, "top level", f"unknown keys {sorted(unknown)}")
    name = _str(doc, "name", source)
    prefixes = _strs(doc.get("prefixes"), source, "prefixes")
    if not prefixes:
        raise _fail(source, "prefixes", "at least one prefix")
    labels = doc.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise _fail(source, "labels", "expected a mapping")
    if set(labels) - _LABEL_KEYS:
        raise _fail(source, "labels", f"unknown keys {sorted(set(labels) - _LABEL_KEYS)}")
    rank = labels.get("rank")
    if rank is not None and not isinstance(rank, str):
        raise _fail(source, "labels.rank", "expected a label name or null")
    families: list[Family] = []
    raw_families = doc.get("families")
    if not isinstance(raw_families, Mapping) or not raw_families:
        raise _fail(source, "families", "expected a mapping of fields to families")
    for fname, entries in raw_families.items():
        if fname not in FIELD_TYPES:
            raise _fail(
                source, f"families.{fname}", f"not a field of the vocabulary: {sorted(FIELD_TYPES)}"
            )
        for i, entry in enumerate(entries if isinstance(entries, list) else [entries]):
            families.append(_family(fname, entry, source, f"families.{fname}[{i}]"))
    measures = doc.get("itl_measures", "step")
    if measures not in ("step", "token", "request_mean"):
        raise _fail(source, "itl_measures", "step, token or request_mean")
    moves = doc.get("moves_with_steps")
    step_fields = (
        STEP_FIELDS if moves is None else frozenset(_strs(moves, source, "moves_with_steps"))
    )
    bad = sorted(step_fields - set(FIELD_TYPES))
    if bad:
        raise _fail(source, "moves_with_steps", f"not fields: {bad}")
    judges_raw = _strs(doc.get("judges"), source, "judges") or CAUSES
    if any(j not in CAUSES for j in judges_raw):
        raise _fail(source, "judges", f"causes are {', '.join(CAUSES)}")
    judges: tuple[Cause, ...] = tuple(c for c in CAUSES if c in judges_raw)
    variants = []
    for i, v in enumerate(doc.get("variants") or []):
        here = f"variants[{i}]"
        if not isinstance(v, Mapping) or v.get("format") not in ("openmetrics", "text"):
            raise _fail(source, here, "expected name, format (openmetrics or text), absent, limits")
        absent = _strs(v.get("absent"), source, f"{here}.absent")
        bad = [a for a in absent if a not in FIELD_TYPES]
        if bad:
            raise _fail(source, f"{here}.absent", f"not fields: {bad}")
        variants.append(
            Variant(
                name=_str(v, "name", source),
                format=v["format"],
                absent=absent,
                limits=_limits(v.get("limits"), source, f"{here}.limits"),
            )
        )
    runtime = Runtime(
        remediation=_remediation(doc.get("remediation"), source),
        name=name,
        title=_str(doc, "title", source, name),
        itl_measures=measures,
        moves_with_steps=step_fields,
        judges=judges,
        limits=_limits(doc.get("limits"), source, "limits"),
    )
    path = doc.get("metrics_path", "/metrics")
    if not isinstance(path, str) or not path.startswith("/"):
        raise _fail(source, "metrics_path", "expected a path beginning with /")
    return RuntimeSpec(
        runtime=runtime,
        versions=_strs(doc.get("versions"), source, "versions"),
        prefixes=prefixes,
        families=tuple(families),
        model_label=str(labels.get("model", "model_name")),
        rank_label=rank,
        copy_labels=_strs(labels.get("copies"), source, "labels.copies"),
        metrics_path=path,
        variants=tuple(variants),
        json_hint=str(doc.get("json_hint", "")),
        source=str(doc.get("source", "")),
    )
