"""The runtimes' metric names, compiled into one lookup: exposed sample name -> what it is.

Each runtime's spec (``core.runtime``, from ``rules/runtimes/``) maps the fields of the
vocabulary to the families its engine exposes, per naming era. The parser reads a body
against every runtime at once: the first family a body shows names its runtime (vLLM,
SGLang, LMDeploy, TensorRT-LLM) unless the target's settings name one, and only that
runtime's samples are read from then on.

A histogram family is three sample names (``_bucket``, ``_sum``, ``_count``); a counter's
family name already ends in ``_total``, as its samples do in both exposition formats.
Samples of families no spec names (``_created``, the Python runtime's, HTTP middleware's,
the dozens of series the diagnosis does not read) are not in the table: their lines are
checked against the grammar and skipped.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from vllm_triage.core.runtime import Generation, RuntimeSpec, RuntimeTable

Kind = Literal["gauge", "counter", "bucket", "sum", "count", "info", "state"]


@dataclass(frozen=True, slots=True)
class Spec:
    """Where one exposed sample name goes: which field, which part of it, which naming,
    the label values a sample must have (``match``) and the factor into the vocabulary's
    unit (``scale``)."""

    field: str
    kind: Kind
    generation: Generation
    match: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0


@dataclass(frozen=True, slots=True)
class Reading:
    """What one sample name is: whose (``runtime``, the index of its spec in the table),
    under which of its prefixes, and where it goes (several specs when one family feeds
    several fields by label value: SGLang's ``realtime_tokens_total{mode}``)."""

    runtime: int
    prefix: str
    specs: tuple[Spec, ...]


#: The step-driven series also read engine by engine (data parallelism), under the names
#: progress is watched by (``core.totals``): (field, kind) -> name.
PER_ENGINE: dict[tuple[str, Kind], str] = {
    ("running", "gauge"): "running",
    ("waiting", "gauge"): "waiting",
    ("kv_usage", "gauge"): "kv_usage",
    ("step_seconds", "gauge"): "step_seconds",
    ("generation_tokens", "counter"): "generation_tokens",
    ("prompt_tokens", "counter"): "prompt_tokens",
    ("preemptions", "counter"): "preemptions",
    ("requests_finished", "counter"): "requests_finished",
    ("iterations", "counter"): "iterations",
    ("iteration_tokens", "count"): "iterations",
    ("ttft", "count"): "ttft_count",
    ("itl", "count"): "itl_count",
}
#: Engines read one by one per model at most (a server may show 64); more are merged only.
MAX_ENGINES = 128

_PARTS: dict[str, tuple[tuple[str, Kind], ...]] = {
    "gauge": (("", "gauge"),),
    "counter": (("", "counter"),),
    "histogram": (("_bucket", "bucket"), ("_sum", "sum"), ("_count", "count")),
    "info": (("", "info"),),
    "state": (("", "state"),),
}


@dataclass(frozen=True, slots=True)
class NameTable:
    """Every runtime's sample names, compiled once per parser."""

    runtimes: RuntimeTable
    samples: dict[str, Reading]

    @classmethod
    def of(cls, runtimes: RuntimeTable) -> NameTable:
        samples: dict[str, Reading] = {}
        for index, spec in enumerate(runtimes.specs):
            for prefix in spec.prefixes:
                for fam in spec.families:
                    for suffix, kind in _PARTS[fam.type]:
                        name = prefix + fam.name + suffix
                        one = Spec(fam.field, kind, fam.generation, fam.match, fam.scale)
                        have = samples.get(name)
                        specs = (one,) if have is None else (*have.specs, one)
                        samples[name] = Reading(index, prefix, specs)
        return cls(runtimes, samples)

    @property
    def prefixes(self) -> tuple[str, ...]:
        return tuple(p for s in self.runtimes.specs for p in s.prefixes)

    def runtime_of(self, name: str) -> int | None:
        """The runtime whose prefix ``name`` begins with."""
        for index, spec in enumerate(self.runtimes.specs):
            if name.startswith(spec.prefixes):
                return index
        return None

    def spec(self, index: int) -> RuntimeSpec:
        return self.runtimes.specs[index]

    def names(self, runtime: str, field: str, kind: Kind) -> list[str]:
        """One runtime's exposed names of one field and kind, in the order the parser
        prefers them: its first prefix before the others, the newest naming first."""
        rank = {"new": 0, "both": 1, "old": 2}
        spec = self.runtimes.spec(runtime)
        found = [
            (spec.prefixes.index(r.prefix), rank[s.generation], name)
            for name, r in self.samples.items()
            if self.runtimes.specs[r.runtime] is spec
            for s in r.specs
            if s.field == field and s.kind == kind
        ]
        return [name for *_, name in sorted(set(found))]


#: An exported label value is at most this long: a target can name its model anything
#: (the parser allows ``max_label_value_length``), and every model is in dozens of series.
MAX_LABEL_VALUE_CHARS = 128
_HASH_CHARS = 10


def label_value(value: str) -> str:
    """``value``, or, if longer than ``MAX_LABEL_VALUE_CHARS``, its beginning and a short
    hash of the whole (``...~1a2b3c4d5e``), so that distinct values stay distinct."""
    if len(value) <= MAX_LABEL_VALUE_CHARS:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    return value[: MAX_LABEL_VALUE_CHARS - _HASH_CHARS - 1] + "~" + digest
