"""Each fleet server's card and model, without typing each server in, and where each
fact came from (the diagnosis's evidence says it: ``gpu_source``,
``tensor_parallel_source``, ``model_source``).

In order, key by key:

1. the first ``prometheus.servers`` rule whose ``match`` the server's labels meet: the
   hardware and model keys it gives;
2. DCGM (``prometheus.dcgm``): the card its GPUs report (``modelName``, looked up in
   ``rules/gpus.yaml``, which lists DCGM's spellings as aliases) and how many GPUs the
   pod holds, as the tensor-parallel size;
3. ``prometheus.models``: the model by vLLM's ``model_name``;
4. the top-level ``hardware`` and ``model``, and for the model's facts they leave unsaid,
   the bundled model table (``rules/models.yaml``) by ``model_name``, as a sidecar does
   (``assemble.served_rulebook``; a name in no table is said, never guessed).

A card's name, bandwidth and compute figure come from one source together: a
bandwidth set at the top level says nothing about a card DCGM found.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from vllm_triage.ceiling.gpus import find_gpu
from vllm_triage.config.matchers import Matcher, matches_all, parse_matchers
from vllm_triage.config.schema import HardwareSettings, ModelSettings, ServerRule
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.errors import ConfigError

log = structlog.get_logger("vllm_triage.fleet")

_CARD_KEYS = frozenset({"gpu", "memory_bandwidth_gb_s"})
#: A rule: its number (from 1, as the evidence says it), matchers, hardware, model.
_Rule = tuple[int, tuple[Matcher, ...], HardwareSettings | None, ModelSettings | None]


@dataclass(frozen=True, slots=True)
class Card:
    """What DCGM says about a server's pod: its cards (``modelName`` -> GPUs)."""

    gpus: Mapping[str, int]

    @property
    def name(self) -> str:
        """The card most of the pod's GPUs are (a pod has one kind in practice)."""
        return max(sorted(self.gpus), key=lambda n: self.gpus[n])

    @property
    def count(self) -> int:
        return sum(self.gpus.values())

    @property
    def key(self) -> tuple[tuple[str, int], ...]:
        return tuple(sorted(self.gpus.items()))


#: (card, model) pairs, and their rulebooks with provenance, kept at most.
CACHED_RULEBOOKS = 256
#: What decides a server's rulebook: the values of the labels the rules read, its
#: model, its card.
_Resolved = tuple[tuple[str | None, ...], str, tuple[tuple[str, int], ...] | None]


def _log_unknown_card(name: str) -> None:
    log.warning(
        "dcgm_card_unknown",
        card=name,
        hint="add it as an alias in rules/gpus.yaml, or give a prometheus.servers rule",
    )


class RulebookFactory(Protocol):
    """What the assembly lends the resolver: the one conversion of a (hardware, model)
    pair of settings into the core's ``Rulebook``, and the check of a model's facts."""

    def rulebook(self, hardware: HardwareSettings, model: ModelSettings) -> Rulebook: ...

    def table_rulebook(
        self, hardware: HardwareSettings, model: ModelSettings, served_name: str
    ) -> Rulebook | None:
        """The rulebook with the served model's row of the bundled table for what
        ``model`` leaves unsaid; ``None`` when ``model`` says it all or no row matches."""
        ...

    def check_model(self, model: ModelSettings) -> None: ...


class HardwareResolver:
    """Resolves a server's ``Rulebook`` from its labels, its model and DCGM's card;
    rulebooks are cached, so a fleet of one kind of server builds one."""

    def __init__(
        self,
        servers: Sequence[ServerRule],
        models: Mapping[str, ModelSettings],
        *,
        hardware: HardwareSettings,
        model: ModelSettings,
        factory: RulebookFactory,
    ) -> None:
        """``servers``, ``models``: the ``prometheus`` section's rules and model table;
        ``hardware``, ``model``: the top-level sections, the last fallback."""
        self._hardware_default = hardware
        self._model_default = model
        self._factory = factory
        self._rules: list[_Rule] = [
            (i, parse_matchers(r.match), r.hardware, r.model)
            for i, r in enumerate(servers, start=1)
        ]
        self._table = dict(models)
        self._read = tuple(dict.fromkeys(m.label for _, ms, _, _ in self._rules for m in ms))
        self._resolved: dict[_Resolved, Rulebook] = {}
        # Bounded: the keys come from what the fleet's labels and DCGM say, which a peer
        # controls (a card name that changes every tick must not grow memory for ever).
        # The settings sections are frozen pydantic models: hashable, so cache keys.
        self._rulebook = functools.lru_cache(maxsize=CACHED_RULEBOOKS)(factory.rulebook)
        self._provenanced = functools.lru_cache(maxsize=CACHED_RULEBOOKS)(self._with_provenance)
        self._unknown_card = functools.lru_cache(maxsize=CACHED_RULEBOOKS)(_log_unknown_card)
        self._check()

    def _check(self) -> None:
        """Build every rule's and table entry's model once: a wrong file or GPU name
        fails at start, naming the entry, not on the first server that uses it."""
        for i, _, hw, model in self._rules:
            try:
                if hw is not None and hw.gpu is not None:
                    find_gpu(hw.gpu)
                if model is not None:
                    self._factory.check_model(model)
            except ConfigError as exc:
                raise ConfigError(f"prometheus.servers[{i - 1}]: {exc}") from None
        for name, model in self._table.items():
            try:
                self._factory.check_model(model)
            except ConfigError as exc:
                raise ConfigError(f"prometheus.models[{name!r}]: {exc}") from None

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels the rules read: the fleet queries fetch them per server."""
        return self._read

    def resolve(self, labels: Mapping[str, str], model_name: str, card: Card | None) -> Rulebook:
        """The server's rulebook. Memoized by what decides it (the labels the rules read,
        the model, the card): a fleet of one kind of server resolves once, not once a
        server a tick (bench/bench_fleet.py: a twentieth of a tick at 10,000 servers)."""
        key = (tuple(labels.get(k) for k in self._read), model_name, card.key if card else None)
        found = self._resolved.get(key)
        if found is None:
            if len(self._resolved) >= CACHED_RULEBOOKS:
                self._resolved.clear()  # bounded: peers choose the labels
            found = self._resolved[key] = self._resolve(labels, model_name, card)
        return found

    def _resolve(self, labels: Mapping[str, str], model_name: str, card: Card | None) -> Rulebook:
        seen = dict(labels) | {"model_name": model_name}
        rule = next(((i, hw, m) for i, ms, hw, m in self._rules if matches_all(ms, seen)), None)
        hw, hw_from = self._hardware(rule, card)
        model, model_from = self._model(rule, model_name)
        # The top-level model may leave facts to the bundled table, by the served name.
        served = model_name if model_from == "settings" else ""
        provenance = tuple(sorted(hw_from.items()))
        return self._provenanced(hw, model, provenance, model_from, served)  # pyright: ignore[reportArgumentType]

    def _with_provenance(
        self,
        hw: HardwareSettings,
        model: ModelSettings,
        hw_from: tuple[tuple[str, str], ...],
        model_from: str,
        served: str,
    ) -> Rulebook:
        rules = self._factory.table_rulebook(hw, model, served) if served else None
        if rules is None:
            rules = self._rulebook(hw, model)  # pyright: ignore[reportArgumentType]
        provenance = dict(hw_from) | {"model_source": model_from} | dict(rules.provenance)
        return dataclasses.replace(rules, provenance=provenance)

    def _hardware(
        self,
        rule: tuple[int, HardwareSettings | None, ModelSettings | None] | None,
        card: Card | None,
    ) -> tuple[HardwareSettings, dict[str, str]]:
        top = self._hardware_default
        given: HardwareSettings | None = rule[1] if rule is not None else None
        said = given.model_fields_set if given is not None else frozenset()
        where = f"rule {rule[0]}" if rule is not None else ""
        found_card = self._card(card)
        gpu, bandwidth, compute = top.gpu, top.memory_bandwidth_gb_s, top.compute_tflops
        if given is not None and said & _CARD_KEYS:
            gpu, bandwidth, compute = given.gpu, given.memory_bandwidth_gb_s, given.compute_tflops
            gpu_from = where
        elif found_card is not None and card is not None:
            gpu, bandwidth, compute = found_card, None, None
            gpu_from = f"dcgm ({card.name})"
        else:
            gpu_from = "settings" if gpu is not None or bandwidth is not None else "none"
            if card is not None and card.name and found_card is None:
                gpu_from += f" (dcgm's {card.name!r} is not in rules/gpus.yaml)"
        if given is not None and "compute_tflops" in said:
            compute = given.compute_tflops
        if given is not None and "tensor_parallel_size" in said:
            tp, tp_from = given.tensor_parallel_size, where
        elif card is not None:
            gpus = f"{card.count} GPU" + ("s" if card.count != 1 else "")
            tp, tp_from = card.count, f"dcgm ({gpus} in the pod)"
        else:
            tp, tp_from = top.tensor_parallel_size, "settings"
        fraction = top.achievable_fraction
        if given is not None and "achievable_fraction" in said:
            fraction = given.achievable_fraction
        hw = HardwareSettings(
            gpu=gpu,
            memory_bandwidth_gb_s=bandwidth,
            tensor_parallel_size=tp,
            achievable_fraction=fraction,
            compute_tflops=compute,
        )
        return hw, {"gpu_source": gpu_from, "tensor_parallel_source": tp_from}

    def _card(self, card: Card | None) -> str | None:
        """The table's name for DCGM's card, or ``None`` (logged once per unknown name)."""
        if card is None or not card.name:
            return None
        try:
            return find_gpu(card.name).name
        except ConfigError:
            self._unknown_card(card.name)  # logged once per name (while it is remembered)
            return None

    def _model(
        self,
        rule: tuple[int, HardwareSettings | None, ModelSettings | None] | None,
        model_name: str,
    ) -> tuple[ModelSettings, str]:
        if rule is not None and rule[2] is not None:
            return rule[2], f"rule {rule[0]}"
        table = self._table.get(model_name)
        if table is not None:
            return table, "model table"
        return self._model_default, "settings"
