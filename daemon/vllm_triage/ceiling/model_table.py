"""The model table, ``rules/models.yaml``: published config.json fields of the most-served
open models, their published parameter counts, and the quantization methods' widths.

A row's ``config`` is sized by ``sizing.model_size_from_config`` as if it were the model's
own config.json; this module only reads and checks the table (every row must size, every
id, alias and name stem must name one row). ``models`` finds a row from a served name.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vllm_triage.ceiling.sizing import bytes_per_param, model_size_from_config
from vllm_triage.errors import ConfigError
from vllm_triage.rules import bundled_path, read_bundled

MODEL_TABLE = "models.yaml"

#: The sizing code's names for a quantized weight's width.
Format = Literal["fp8", "int8", "int4"]


@dataclass(frozen=True, slots=True)
class Quantization:
    """A quantization method and the bytes one of its weights occupies."""

    method: str
    bytes_per_weight: float
    format: Format
    note: str = ""


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One row of ``rules/models.yaml``. ``config`` holds the published config.json fields
    (read-only); ``sizing_config()`` is what the sizing code reads: those fields with the
    row's ``config_defaults`` filling their gaps."""

    id: str
    config: Mapping[str, Any]
    total_parameters: float
    source: str
    parameters_source: str
    active_parameters: float | None = None
    vision_parameters: float | None = None
    aliases: tuple[str, ...] = ()
    config_defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    note: str = ""

    def sizing_config(self) -> dict[str, Any]:
        """A fresh copy of ``config`` with ``config_defaults`` added where absent (inside
        ``text_config`` when the model nests its language model there)."""
        cfg = copy.deepcopy(dict(self.config))
        nested = cfg.get("text_config")
        target = nested if isinstance(nested, dict) else cfg
        for key, value in self.config_defaults.items():
            target.setdefault(key, copy.deepcopy(value))
        return cfg


@dataclass(frozen=True, slots=True)
class ModelTable:
    rows: tuple[ModelRow, ...]
    quantization: Mapping[str, Quantization]
    #: Served-name suffix (lower case, words joined by '-') -> what it names.
    suffixes: Mapping[str, Quantization]
    #: Words (lower case) a served name may end with that do not change the architecture.
    neutral: frozenset[str] = frozenset()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, str_strip_whitespace=True)


class _QuantEntry(_Strict):
    method: str = Field(min_length=1)
    bytes_per_weight: float = Field(gt=0, allow_inf_nan=False)
    format: Format
    note: str = ""

    @model_validator(mode="after")
    def _width_matches_format(self) -> _QuantEntry:
        if bytes_per_param(self.format) != self.bytes_per_weight:
            raise ValueError(
                f"bytes_per_weight {self.bytes_per_weight:g} is not the width of {self.format}"
            )
        return self


class _SuffixEntry(_Strict):
    suffix: str = Field(min_length=1)
    method: str = Field(min_length=1)
    format: Format | None = None


class _ModelEntry(_Strict):
    id: str = Field(pattern=r"^[^/\s]+/[^/\s]+$")
    aliases: list[str] = Field(default_factory=list)
    source: str = Field(min_length=1)
    parameters_source: str = Field(min_length=1)
    total_parameters_billion: float = Field(gt=0, allow_inf_nan=False)
    active_parameters_billion: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    vision_parameters_billion: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    config: dict[str, Any] = Field(min_length=1)
    config_defaults: dict[str, Any] = Field(default_factory=dict)
    note: str = ""


class _Table(_Strict):
    quantization: list[_QuantEntry] = Field(min_length=1)
    name_suffixes: list[_SuffixEntry] = Field(default_factory=list)
    #: One word each: they are compared with the last word of a name.
    neutral_suffixes: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9.]+$")]] = Field(
        default_factory=list
    )
    models: list[_ModelEntry] = Field(min_length=1)


def _describe(exc: ValidationError, data: Any) -> str:
    """Name the section, entry (index and, when readable, its id or method) and key."""
    parts = []
    for err in exc.errors():
        loc = list(err["loc"])
        where = ".".join(str(x) for x in loc) or "top level"
        if len(loc) >= 2 and isinstance(loc[1], int):
            where = f"{loc[0]}[{loc[1]}]"
            with contextlib.suppress(KeyError, TypeError, IndexError):
                entry = data[loc[0]][loc[1]]
                if isinstance(entry, Mapping):
                    label = entry.get("id") or entry.get("method") or entry.get("suffix")
                    where += f" ({label!r})"
            if len(loc) > 2:
                where += ": " + ".".join(str(x) for x in loc[2:])
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def suffix_key(text: str) -> str:
    """How names and suffixes compare: lower case, '-' and '_' and spaces as one '-'."""
    return re.sub(r"[\s_-]+", "-", text.strip()).strip("-").casefold()


def _rows(entries: Iterable[_ModelEntry]) -> tuple[ModelRow, ...]:
    return tuple(
        ModelRow(
            id=e.id,
            config=MappingProxyType(e.config),
            total_parameters=e.total_parameters_billion * 1e9,
            source=e.source,
            parameters_source=e.parameters_source,
            active_parameters=(
                None if e.active_parameters_billion is None else e.active_parameters_billion * 1e9
            ),
            vision_parameters=(
                None if e.vision_parameters_billion is None else e.vision_parameters_billion * 1e9
            ),
            aliases=tuple(e.aliases),
            config_defaults=MappingProxyType(e.config_defaults),
            note=e.note,
        )
        for e in entries
    )


def parse_model_table(data: Any, *, source: str = bundled_path(MODEL_TABLE)) -> ModelTable:
    """Validate a loaded model table; every way it can be wrong raises ``ConfigError``
    naming ``source`` and the entry: a bad field, a row whose config does not size, an
    unknown method, a name two rows claim (checked by ``models``)."""
    try:
        table = _Table.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc, data)}") from exc
    methods: dict[str, Quantization] = {}
    for i, q in enumerate(table.quantization):
        if q.method in methods:
            raise ConfigError(f"{source}: quantization[{i}] ({q.method!r}) listed twice")
        methods[q.method] = Quantization(q.method, q.bytes_per_weight, q.format, q.note)
    suffixes: dict[str, Quantization] = {}
    for i, s in enumerate(table.name_suffixes):
        base = methods.get(s.method)
        if base is None:
            raise ConfigError(
                f"{source}: name_suffixes[{i}] ({s.suffix!r}): unknown method {s.method!r}"
            )
        width = s.format or base.format
        key = suffix_key(s.suffix)
        if key in suffixes:
            raise ConfigError(f"{source}: name_suffixes[{i}] ({s.suffix!r}) listed twice")
        suffixes[key] = Quantization(base.method, bytes_per_param(width), width, base.note)
    rows = _rows(table.models)
    for i, row in enumerate(rows):
        try:
            model_size_from_config(row.sizing_config())
        except ConfigError as exc:
            raise ConfigError(f"{source}: models[{i}] ({row.id!r}): {exc}") from None
    neutral = frozenset(suffix_key(w) for w in table.neutral_suffixes)
    return ModelTable(rows, MappingProxyType(methods), MappingProxyType(suffixes), neutral)


@functools.cache
def load_model_table() -> ModelTable:
    """The bundled model table; cached because it is immutable package data."""
    return parse_model_table(read_bundled(MODEL_TABLE))
