"""What the settings' sections mean for the core: its ``Rulebook``, each roofline fact
with its source (``docs/physics.md``, "Where each fact comes from").

Handed sections, never the root settings: the SLO and thresholds once, then a
(hardware, model) pair per rulebook, since fleet mode resolves a pair per server and a
served model may fill what the model section leaves unsaid from the bundled model table
(``rules/models.yaml``). The assembly (``vllm_triage.assemble``) is what calls these.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

from vllm_triage.ceiling.resolve import (
    CardFacts,
    SizedModel,
    build_ceiling,
    build_roofline,
    card_facts,
    model_size,
    table_model,
)
from vllm_triage.ceiling.sizing import ModelSize
from vllm_triage.config.schema import (
    HardwareSettings,
    ModelSettings,
    SloSettings,
    ThresholdSettings,
)
from vllm_triage.core.model import CAUSES, Cause
from vllm_triage.core.rulebook import Ceiling, Roofline, Rulebook, Slo, Source, Thresholds
from vllm_triage.errors import ConfigError
from vllm_triage.rules import read_bundled


def _texts(section: str | None, keys: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Lists of remediation texts by key, from rules/remediation.yaml (its top level, or
    one of its sections); a missing or misshapen list names its key."""
    data = read_bundled("remediation.yaml")
    where = f"{section}." if section else ""
    found = data.get(section) if isinstance(data, dict) and section else data
    if not isinstance(found, dict):
        raise ConfigError(f"rules/remediation.yaml: {section or 'top level'}: expected a mapping")
    out: dict[str, tuple[str, ...]] = {}
    for key in keys:
        items = found.get(key)
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ConfigError(f"rules/remediation.yaml: {where}{key}: expected a list of strings")
        out[key] = tuple(items)
    return out


@functools.cache
def load_remediation() -> dict[Cause, tuple[str, ...]]:
    """The remediation texts; cached, like the GPU table (``gpus.load_gpu_table``), because
    they are immutable package data and every target's rulebook reads them: a daemon
    with 250 targets spent seconds of start-up re-parsing this YAML."""
    texts = _texts(None, CAUSES)
    return {cause: texts[cause] for cause in CAUSES}


#: The keys of ``decode_roofline`` in rules/remediation.yaml.
DECODE_TERMS = ("weights", "kv", "draft", "compute", "serving_stack", "settings")
#: The keys of ``by_kind`` in rules/remediation.yaml.
KINDS = ("asleep", "stale_gauges", "render", "dp_imbalance")


@functools.cache
def load_decode_remediation() -> dict[str, tuple[str, ...]]:
    """The decode-bound texts by what the roofline says binds (``decode_roofline``)."""
    return _texts("decode_roofline", DECODE_TERMS)


@functools.cache
def load_kind_remediation() -> dict[str, tuple[str, ...]]:
    """A cause's texts by its kind (``by_kind``): a stall that is not a hang, a TTFT
    spent rendering."""
    return _texts("by_kind", KINDS)


def model_size_of(m: ModelSettings) -> ModelSize | None:
    """The model section's size: its config.json, or its parameter count."""
    return model_size(
        parameters_billion=m.parameters_billion,
        config_json=m.config_json,
        # A config.json names its own dtype; ``m.dtype`` (default float16) is for a count.
        dtype=None if m.config_json is not None else m.dtype,
        kv_cache_dtype=m.kv_cache_dtype,
    )


def _sized(m: ModelSettings, size: ModelSize | None) -> SizedModel | None:
    """The model section's size with its source: its config.json, or its count."""
    if size is None:
        return None
    if m.config_json is not None:
        return SizedModel(size, Source("config.json", Path(m.config_json).name))
    return SizedModel(size, Source("settings", "model.parameters_billion x model.dtype"))


def card_of(hw: HardwareSettings) -> CardFacts:
    return card_facts(hw.gpu, hw.memory_bandwidth_gb_s, hw.compute_tflops)


def ceiling_of(hw: HardwareSettings, size: ModelSize | None) -> Ceiling | None:
    """The single-stream decode ceiling, when the card's bandwidth and the size are known."""
    card = card_of(hw)
    if card.bandwidth_gb_s is None or size is None:
        return None
    return build_ceiling(
        card.name,
        card.bandwidth_gb_s,
        size.weight_bytes_per_token,
        tensor_parallel_size=hw.tensor_parallel_size,
        achievable_fraction=hw.achievable_fraction,
    )


def roofline_of(
    hw: HardwareSettings,
    m: ModelSettings,
    size: ModelSize | None,
    table: SizedModel | None = None,
) -> Roofline | None:
    """The decode step roofline's facts, each with its source, when the card's bandwidth
    is known: the model section's (``table``, the served model's row, for what it leaves
    unsaid); hand-set keys replace the sized ones."""
    tp = hw.tensor_parallel_size
    return build_roofline(
        card_of(hw),
        _sized(m, size),
        table=table,
        tensor_parallel_size=tp,
        # vLLM does not export it: the settings say it (1 by default, rules/defaults.yaml).
        tensor_parallel_source=Source("settings", f"{tp} GPU{'s' if tp > 1 else ''}"),
        achievable_fraction=hw.achievable_fraction,
        kv_bytes_per_token=m.kv_bytes_per_token,
        kv_cache_dtype=m.kv_cache_dtype,
        active_parameters_billion=m.active_parameters_billion,
        draft_parameters_billion=m.draft_parameters_billion,
        draft_dtype=m.draft_dtype,
        draft_kv_bytes_per_token=m.draft_kv_bytes_per_token,
    )


def leaves_model_to_table(m: ModelSettings) -> bool:
    """Whether the model section leaves a fact of the model to the bundled model table:
    no config.json, and no parameter count with its KV bytes per token."""
    said = m.parameters_billion is not None and m.kv_bytes_per_token is not None
    return m.config_json is None and not said


def slo_of(slo: SloSettings) -> Slo:
    """The core's SLO from the settings' ``slo`` section (also what the daemon exports)."""
    return Slo(
        ttft_p99_seconds=slo.ttft_p99_seconds,
        itl_p99_seconds=slo.itl_p99_seconds,
        waiting_requests=slo.waiting_requests,
    )


#: Served model names whose rulebooks one target keeps (bounded: a target names its
#: models, and a hostile one could name a new one every scrape).
CACHED_MODELS = 64


class Rulebooks:
    """The rulebooks of one SLO and one set of thresholds, for (hardware, model) pairs
    and the models vLLM serves. Fleet mode's resolver is lent one (its
    ``RulebookFactory``); a target's evaluator one function of it (``served_names``)."""

    def __init__(self, slo: SloSettings, thresholds: ThresholdSettings) -> None:
        self._slo = slo_of(slo)
        th = thresholds
        self._thresholds = Thresholds(
            min_observations=th.min_observations,
            kv_headroom_requests=th.kv_headroom_requests,
            kv_usage_full=th.kv_usage_full,
            queue_share_of_ttft=th.queue_share_of_ttft,
            prefill_dominant_share=th.prefill_dominant_share,
            itl_spike_ratio=th.itl_spike_ratio,
            near_ceiling_ratio=th.near_ceiling_ratio,
            roofline_impossible_ratio=th.roofline_impossible_ratio,
            dram_active_busy=th.dram_active_busy,
            stall_after_seconds=th.stall_after_seconds,
        )

    def rulebook(
        self, hardware: HardwareSettings, model: ModelSettings, *, table: SizedModel | None = None
    ) -> Rulebook:
        """The rulebook of a card and a model; ``table``: the served model's row, for the
        facts the model section leaves unsaid."""
        size = model_size_of(model)
        ceiling_size = size or (table.size if table is not None else None)
        return Rulebook(
            slo=self._slo,
            thresholds=self._thresholds,
            remediation=load_remediation(),
            ceiling=ceiling_of(hardware, ceiling_size),
            roofline=roofline_of(hardware, model, size, table),
            decode_remediation=load_decode_remediation(),
            kind_remediation=load_kind_remediation(),
        )

    def check_model(self, model: ModelSettings) -> None:
        model_size_of(model)

    def served(
        self, hardware: HardwareSettings, model: ModelSettings, served_name: str
    ) -> Rulebook | None:
        """The rulebook of the model vLLM serves as ``served_name``, from its row of the
        bundled model table for what the model section leaves unsaid (its keys win),
        ``model_source`` saying so; ``None`` when no row matches (never a near name)."""
        found = table_model(served_name, model.kv_cache_dtype)
        if found is None:
            return None
        rules = self.rulebook(hardware, model, table=found)
        where = f"rules/models.yaml: {found.source.detail} ({found.how})"
        if model.parameters_billion is not None:
            where = f"settings; its KV layout from {where}"
        return dataclasses.replace(rules, provenance={**rules.provenance, "model_source": where})

    def table_rulebook(
        self, hardware: HardwareSettings, model: ModelSettings, served_name: str
    ) -> Rulebook | None:
        """``served`` where the model section leaves facts to the table; a name in no
        table: the section's own rulebook, saying so when the section has no size at all;
        ``None`` where the section says it all or gives the size (its facts stand)."""
        if not leaves_model_to_table(model):
            return None
        found = self.served(hardware, model, served_name)
        if found is None and _unsized(model):
            return unknown_model(self.rulebook(hardware, model), served_name)
        return found

    def served_names(
        self, hardware: HardwareSettings, model: ModelSettings, base: Rulebook
    ) -> Callable[[str], Rulebook] | None:
        """Each served model's rulebook (``served``), built once per name, or ``None``
        when the model section describes the model whole; a name in no table keeps
        ``base`` (and says so, ``model_source``, when the section has no size)."""
        if not leaves_model_to_table(model):
            return None

        @functools.lru_cache(maxsize=CACHED_MODELS)
        def rulebook_for(served_name: str) -> Rulebook:
            found = self.served(hardware, model, served_name)
            if found is not None:
                return found
            return unknown_model(base, served_name) if _unsized(model) else base

        return rulebook_for


def _unsized(m: ModelSettings) -> bool:
    return m.parameters_billion is None and m.config_json is None


def unknown_model(rules: Rulebook, served_name: str) -> Rulebook:
    """``rules`` with ``model_source`` saying that no table knows ``served_name``."""
    unknown = (
        f"unknown: {served_name!r} is in no model table (rules/models.yaml); "
        "set model.config_json, or model.parameters_billion with model.kv_bytes_per_token"
    )
    return dataclasses.replace(rules, provenance={**rules.provenance, "model_source": unknown})
