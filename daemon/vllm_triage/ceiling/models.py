"""Find a served model in the model table, and size it.

vLLM labels every series with ``model_name``: the ``--served-model-name``, which is the
Hugging Face id by default, a local path when a model is loaded from disk, or whatever the
operator chose. ``find_model`` maps such a name to a row of ``rules/models.yaml`` when it
can do so without guessing, and says how; ``model_facts`` sizes the row with the same code
that sizes a config.json (``sizing.model_size_from_config``).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from vllm_triage.ceiling.model_table import (
    ModelRow,
    ModelTable,
    Quantization,
    load_model_table,
    suffix_key,
)
from vllm_triage.ceiling.sizing import ModelSize, model_size_from_config
from vllm_triage.errors import ConfigError
from vllm_triage.rules import bundled_path

#: Words dropped wherever they stand in a name (not only at its end).
_ANYWHERE = frozenset({"instruct", "chat", "base"})
_DATE = re.compile(r"\d{4}")
#: A Hugging Face cache folder: models--<org>--<name>.
_HF_CACHE = re.compile(r"^models--([^/]+?)--([^/]+)$")


@dataclass(frozen=True, slots=True)
class Match:
    """How a served name found its row. ``quantization`` is set when the name carries a
    quantization suffix (``-FP8``, ``-AWQ``...): the weights are that wide, whatever the
    row's own config says."""

    how: str
    quantization: Quantization | None = None
    removed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Reduced:
    stem: str
    quantization: Quantization | None
    removed: tuple[str, ...]


def _reduce(name: str, table: ModelTable) -> _Reduced:
    """Drop from the end of ``name`` the words that do not change the architecture (one
    quantization suffix at most, the neutral words, a four-digit date), then Instruct, Chat
    and Base wherever they stand."""
    words = suffix_key(name).split("-")
    removed: list[str] = []
    quant: Quantization | None = None
    longest = max((len(k.split("-")) for k in table.suffixes), default=0)
    while len(words) > 1:
        hit = next(
            (
                n
                for n in range(min(longest, len(words) - 1), 0, -1)
                if "-".join(words[-n:]) in table.suffixes
            ),
            0,
        )
        if hit and quant is None:
            quant = table.suffixes["-".join(words[-hit:])]
            removed.append("-".join(words[-hit:]))
            del words[-hit:]
        elif words[-1] in table.neutral or _DATE.fullmatch(words[-1]):
            removed.append(words.pop())
        else:
            break
    kept = [w for w in words if w not in _ANYWHERE]
    removed.extend(w for w in words if w in _ANYWHERE)
    return _Reduced("-".join(kept or words), quant, tuple(removed))


@dataclass(frozen=True, slots=True)
class ModelIndex:
    """A model table's rows by lower-case id, by name without organisation, and by stem."""

    ids: dict[str, ModelRow]
    names: dict[str, ModelRow]
    stems: dict[str, ModelRow]


def build_index(table: ModelTable, source: str = bundled_path("models.yaml")) -> ModelIndex:
    """Every id, name (the id without its organisation) and stem of every row and alias;
    one that two rows share is ambiguous, so the table is refused."""
    index = ModelIndex({}, {}, {})
    for row in table.rows:
        for full in (row.id, *row.aliases):
            name = full.rsplit("/", 1)[-1]
            reduced = _reduce(name, table)
            if reduced.quantization is not None:
                raise ConfigError(f"{source}: {full!r} ({row.id}) ends in a quantization suffix")
            keys = ((index.ids, full.casefold()), (index.names, name.casefold()))
            for bucket, key in (*keys, (index.stems, reduced.stem)):
                other = bucket.setdefault(key, row)
                if other is not row:
                    raise ConfigError(f"{source}: {key!r} names both {other.id!r} and {row.id!r}")
    return index


@functools.cache
def _index() -> ModelIndex:
    return build_index(load_model_table())


def _local_name(served: str) -> tuple[str, str] | None:
    """(name to look up, how) for a local path, or None when ``served`` is not one. An
    ``org/name`` id has one slash and no leading one; a path has more, or starts with /,
    ./, ../ or ~. A Hugging Face cache folder (models--org--name) gives its id where the
    path ends in it, as the cache lays a model out (``models--org--name``, or that and
    ``snapshots/<revision>``); anywhere else in a path (``.../models--a--b/finetunes/mine``)
    the model is the path's last component, not the folder it sits in."""
    pathlike = "\\" in served or served.startswith(("/", "./", "../", "~"))
    if not pathlike and served.count("/") <= 1:
        return None
    parts = [p for p in re.split(r"[/\\]+", served) if p not in ("", ".", "..", "~")]
    if not parts:
        return None
    for at in (len(parts) - 1, len(parts) - 3):
        cached = _HF_CACHE.match(parts[at]) if at >= 0 else None
        tail = parts[at + 1 :]
        if cached and (not tail or (len(tail) == 2 and tail[0] == "snapshots")):
            return f"{cached[1]}/{cached[2]}", f"local Hugging Face cache folder {parts[at]!r}"
    return parts[-1], f"local path, by its last component {parts[-1]!r}"


def find_model(served_name: str, table: ModelTable | None = None) -> tuple[ModelRow, Match] | None:
    """The row ``served_name`` names, and how it was found; None when it names none.

    Tried in order: the Hugging Face id (any case); the name without its organisation
    (``Llama-3.1-8B-Instruct``, ``RedHatAI/Llama-3.1-8B-Instruct``); the name with the
    suffixes that do not change the architecture removed (``-Instruct``, ``-it``, a date
    such as ``-2507``) and at most one quantization suffix (``-FP8``, ``-AWQ``), which sets
    the weight width. A local path is looked up by its last component. Nothing else: a
    name that differs in anything but those suffixes is unknown (``Llama-3.1-9B``).
    """
    index = _index() if table is None else build_index(table)
    tab = load_model_table() if table is None else table
    served = served_name.strip()
    if not served:
        return None
    prefix: list[str] = []
    local = _local_name(served)
    if local is not None:
        served, how = local
        prefix.append(how)
    row = index.ids.get(served.casefold())
    if row is not None:
        alias = served.casefold() != row.id.casefold()
        what = "Hugging Face id" + (" (an alias of the row: same architecture)" if alias else "")
        return row, Match("; ".join([*prefix, what]))
    org, _, name = served.rpartition("/")
    row = index.names.get(name.casefold())
    if row is not None:
        what = f"name, organisation {org!r} ignored" if org else "name without an organisation"
        return row, Match("; ".join([*prefix, what]))
    reduced = _reduce(name, tab)
    row = index.stems.get(reduced.stem)
    if row is None or not reduced.removed:
        return None
    words = ", ".join(f"-{w}" for w in reduced.removed)
    what = f"name with {words} removed"
    q = reduced.quantization
    if q is not None:
        unit = "byte" if q.bytes_per_weight == 1 else "bytes"
        what += f" ({q.method}: {q.bytes_per_weight:g} {unit} per weight)"
    return row, Match("; ".join([*prefix, what]), q, reduced.removed)


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the roofline needs to know of a model, from one table row.

    ``kv_heads`` is what the KV cache splits over under tensor parallelism and
    ``head_size`` what it holds per head, layer and token: a key and a value of
    ``head_size`` each under grouped-query attention; under latent attention (``latent_kv``,
    DeepSeek) one vector of ``kv_lora_rank + qk_rope_head_dim``, on one "head".
    ``kv_bytes_per_token`` is every layer and head, in the KV cache dtype asked for.
    ``weight_bytes`` is what the weights occupy (all GPUs), ``size`` what a step reads.
    """

    row: ModelRow
    size: ModelSize
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_size: int
    latent_kv: bool
    parameters: float
    active_parameters: float
    experts: int
    experts_per_token: int
    kv_bytes_per_token: int
    kv_cache_dtype: str
    weight_bytes: float
    quantization: Quantization | None

    def kv_bytes_per_token_per_gpu(self, tensor_parallel_size: int = 1) -> float:
        """KV bytes per token on each of ``tensor_parallel_size`` GPUs: the KV heads split
        over them, never below one head each (vLLM replicates heads past that)."""
        if tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be at least 1")
        heads = max(1, math.ceil(self.kv_heads / tensor_parallel_size))
        return self.kv_bytes_per_token * heads / self.kv_heads

    def weight_bytes_per_gpu(self, tensor_parallel_size: int = 1) -> float:
        """Weight bytes resident on each GPU (vLLM shards every matrix, the vocabulary
        included; the replicated norms are a rounding error)."""
        if tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be at least 1")
        return self.weight_bytes / tensor_parallel_size


def model_facts(
    row: ModelRow, match: Match | None = None, *, kv_cache_dtype: str | None = None
) -> ModelFacts:
    """Size ``row`` (at the width ``match`` names, if any) with the KV cache in
    ``kv_cache_dtype`` (vLLM's ``cache_dtype``: "auto" or None is the model's 16 bits;
    fp8, fp8_e4m3 and fp8_e5m2 are one byte). An unknown dtype raises ``ConfigError``."""
    quant = match.quantization if match is not None else None
    config = row.sizing_config()
    size = model_size_from_config(
        config,
        dtype=quant.format if quant is not None else None,
        kv_cache_dtype=kv_cache_dtype,
    )
    text = config.get("text_config", config)
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    latent = text.get("kv_lora_rank") is not None
    if latent:
        head_size = int(text["kv_lora_rank"]) + int(text["qk_rope_head_dim"])
    else:
        head_size = int(text.get("head_dim") or hidden // heads)
    assert size.kv_bytes_per_token is not None and size.kv_split is not None
    assert size.active_parameters is not None and size.num_layers is not None
    return ModelFacts(
        row=row,
        size=size,
        layers=size.num_layers,
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=size.kv_split,
        head_size=head_size,
        latent_kv=latent,
        parameters=size.parameters,
        active_parameters=size.active_parameters,
        experts=size.num_experts,
        experts_per_token=size.experts_per_token,
        kv_bytes_per_token=size.kv_bytes_per_token,
        kv_cache_dtype=kv_cache_dtype or "auto",
        weight_bytes=size.resident_bytes,
        quantization=quant,
    )
