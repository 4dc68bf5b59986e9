"""Scenario files: YAML that says which server sees which load, bundled or the user's own.

The named scenarios ship in ``rules/scenarios/<name>.yaml`` (the package
``vllm_triage.bundled_rules``), as data rather than code, so that a user can copy one, change
the numbers and run it (``vllm-triage simulate --scenario ./mine.yaml``). The schema is
strict (unknown keys, quoted numbers and impossible values are refused) and every error
is a ``ConfigError`` naming the file and the key, because a silently ignored typo would
simulate a different server than the one the user meant.

A phase's ``server:`` holds only the keys that change for that phase; the others are the
scenario's (a bandwidth or compute figure given for the scenario included), so "the
same card with ``max_num_seqs: 16``" is one line. How the server is deployed
(``data_parallel_size``, ``api_server_count``, ``enable_sleep_mode``) is the scenario's
alone; a phase's ``engines:`` says what single engines do in it (hang, sleep, abort,
stale gauges), by rank.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vllm_triage.ceiling.gpus import find_gpu
from vllm_triage.ceiling.sizing import bytes_per_param
from vllm_triage.errors import ConfigError
from vllm_triage.rules import bundled_path, list_bundled, read_bundled, read_file
from vllm_triage.simulator.scenarios import (
    LLAMA_8B,
    EnginePhase,
    Expectation,
    Phase,
    Scenario,
    server_spec,
)
from vllm_triage.simulator.spec import ServerSpec, Workload

FOLDER = "scenarios"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, str_strip_whitespace=True)


class ServerFields(_Strict):
    """``server:``: a card of rules/gpus.yaml, the model's size, vLLM's caps.

    Every key is optional here so that a phase can give only what it changes; the
    scenario-level block must name ``gpu`` and the KV and step sizes (``_REQUIRED``).
    Model keys default to Llama-3.1-8B at bf16 (``server_spec``).
    """

    gpu: str | None = Field(default=None, min_length=1)
    memory_bandwidth_gb_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    compute_tflops: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    parameters_billion: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    dtype: str | None = Field(default=None, min_length=1)
    num_layers: int | None = Field(default=None, ge=1)
    hidden_size: int | None = Field(default=None, ge=1)
    kv_bytes_per_token: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    num_gpu_blocks: int | None = Field(default=None, ge=1)
    block_size: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=2)
    max_num_seqs: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    compute_efficiency: float | None = Field(default=None, gt=0, le=1)
    step_overhead_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    kv_watermark: float | None = Field(default=None, ge=0, lt=1)
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    kv_heads: int | None = Field(default=None, ge=1)
    # Mixture of experts: how much of parameters_billion sits in routed experts.
    routed_experts_billion: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    num_experts: int | None = Field(default=None, ge=1)
    experts_per_token: int | None = Field(default=None, ge=1)
    # Speculative decoding: draft tokens per step, acceptance per token, draft size.
    num_speculative_tokens: int | None = Field(default=None, ge=0)
    draft_acceptance: float | None = Field(default=None, ge=0, lt=1)
    draft_parameters_billion: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    draft_kv_bytes_per_token: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    # Deployment: engines behind one API server, its processes, sleep mode, render costs.
    data_parallel_size: int | None = Field(default=None, ge=1)
    api_server_count: int | None = Field(default=None, ge=1)
    enable_sleep_mode: bool | None = None
    render_overhead_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    render_s_per_token: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class WorkloadFields(_Strict):
    """``workload:``; keys left out take ``Workload``'s defaults (one place for them)."""

    arrival_rate_per_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    prompt_tokens: int | None = Field(default=None, ge=1)
    output_tokens: int | None = Field(default=None, ge=1)
    spread: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    distribution: Literal["uniform", "lognormal"] | None = None
    burst: int | None = Field(default=None, ge=0)
    stop_fraction: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    request_type: Literal["chat", "completion"] | None = None


class EngineFields(_Strict):
    """One entry of a phase's ``engines:``: what the engine of ``rank`` does then."""

    rank: int = Field(ge=0)
    hang: bool = False
    #: 1: weights offloaded, 2: weights discarded (needs ``enable_sleep_mode``).
    sleep_level: Literal[0, 1, 2] = 0
    #: At the phase's start, clients abort this share of the engine's requests.
    abort_fraction: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    #: The running, waiting and KV gauges keep their values while the engine serves on.
    stale_gauges: bool = False


class PhaseFields(_Strict):
    duration_seconds: float = Field(gt=0, allow_inf_nan=False)
    label: str = ""
    #: The engine stops stepping for the phase; /metrics keeps answering, frozen.
    hang: bool = False
    #: What the diagnosis should say during this phase (the demo checks it).
    expect: Expectation | None = None
    #: Every counter and histogram starts again from 0 at the phase's start, in process.
    reset_counters: bool = False
    engines: list[EngineFields] = Field(default_factory=list)
    workload: WorkloadFields
    server: ServerFields | None = None


class SloFields(_Strict):
    """``slo:``: the SLOs a scenario is built against, as in the settings' ``slo:``."""

    ttft_p99_seconds: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    itl_p99_seconds: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class ScenarioFields(_Strict):
    name: str = Field(min_length=1)
    model_name: str = Field(default=LLAMA_8B, min_length=1)
    slo: SloFields | None = None
    server: ServerFields
    phases: list[PhaseFields] = Field(min_length=1)


_REQUIRED = ("gpu", "num_gpu_blocks", "max_num_batched_tokens", "max_model_len")
#: The server's deployment: set for the scenario, never by a phase.
_DEPLOYMENT = ("data_parallel_size", "api_server_count", "enable_sleep_mode")


def _where(loc: tuple[int | str, ...]) -> str:
    """``("phases", 2, "workload", "seed")`` as ``phases[2].workload.seed``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return out or "top level"


def _describe(exc: ValidationError) -> str:
    return "; ".join(f"{_where(tuple(e['loc']))}: {e['msg']}" for e in exc.errors())


def _spec(fields: Mapping[str, Any], where: str, source: str) -> ServerSpec:
    missing = [k for k in _REQUIRED if k not in fields]
    if missing:
        raise ConfigError(f"{source}: {where}.{missing[0]}: required")
    args = dict(fields)
    gpu = args.pop("gpu")
    try:  # name the key of an unknown card or dtype
        if "memory_bandwidth_gb_s" not in args or "compute_tflops" not in args:
            find_gpu(gpu)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {where}.gpu: {exc}") from exc
    try:
        bytes_per_param(args.get("dtype", "bfloat16"))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {where}.dtype: {exc}") from exc
    try:
        return server_spec(gpu, **args)
    except ValueError as exc:  # numbers vLLM would refuse, e.g. a pool under max_model_len
        raise ConfigError(f"{source}: {where}: {exc}") from exc


def parse_scenario(data: Any, *, source: str) -> Scenario:
    """Validate loaded YAML and build the ``Scenario``; errors name ``source`` and the key."""
    try:
        fields = ScenarioFields.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from exc
    base = fields.server.model_dump(exclude_none=True)
    spec = _spec(base, "server", source)
    phases: list[Phase] = []
    for index, phase in enumerate(fields.phases):
        where = f"phases[{index}]"
        own = None
        if phase.server is not None:
            changes = phase.server.model_dump(exclude_none=True)
            for key in _DEPLOYMENT:
                if key in changes:
                    raise ConfigError(
                        f"{source}: {where}.server.{key}: the server's deployment; set it "
                        "in the scenario's server, not a phase's"
                    )
            own = _spec({**base, **changes}, f"{where}.server", source)
        try:
            workload = Workload(**phase.workload.model_dump(exclude_none=True))
        except ValueError as exc:  # a combination, e.g. a uniform spread of 1 or more
            raise ConfigError(f"{source}: {where}.workload: {exc}") from exc
        phases.append(
            Phase(
                duration_s=phase.duration_seconds,
                workload=workload,
                spec=own,
                label=phase.label,
                hang=phase.hang,
                expect=phase.expect,
                engines=_engines(phase.engines, spec, f"{source}: {where}"),
                reset_counters=phase.reset_counters,
            )
        )
    slo = fields.slo.model_dump(exclude_none=True) if fields.slo is not None else {}
    try:
        return Scenario(fields.name, spec, tuple(phases), fields.model_name, slo)
    except ValueError as exc:  # what one server cannot do (scenarios.Scenario says what)
        raise ConfigError(f"{source}: {exc}") from exc


def _engines(entries: list[EngineFields], spec: ServerSpec, where: str) -> tuple[EnginePhase, ...]:
    """A phase's ``engines:``, checked against the server they run on."""
    out: list[EnginePhase] = []
    for index, entry in enumerate(entries):
        key = f"{where}.engines[{index}]"
        if entry.rank >= spec.data_parallel_size:
            size = spec.data_parallel_size
            raise ConfigError(f"{key}.rank: {entry.rank} is not below data_parallel_size {size}")
        if entry.rank in {e.rank for e in out}:
            raise ConfigError(f"{key}.rank: engine {entry.rank} is listed twice")
        if entry.sleep_level and not spec.enable_sleep_mode:
            raise ConfigError(f"{key}.sleep_level: the server needs enable_sleep_mode: true")
        out.append(EnginePhase(**entry.model_dump()))
    return tuple(out)


def load_scenario_file(path: str | Path) -> Scenario:
    """A user's scenario file."""
    return parse_scenario(read_file(path), source=str(path))


def scenario_names() -> tuple[str, ...]:
    """The bundled scenarios, sorted: the files of ``rules/scenarios/``."""
    return list_bundled(FOLDER)


@functools.cache
def bundled_scenario(name: str) -> Scenario:
    """The bundled scenario ``name``; cached, as package data does not change."""
    source = bundled_path(f"{FOLDER}/{name}.yaml")
    scenario = parse_scenario(read_bundled(f"{FOLDER}/{name}.yaml"), source=source)
    if scenario.name != name:
        raise ConfigError(f"{source}: name: {scenario.name!r} differs from the file's name")
    return scenario


def _looks_like_path(text: str) -> bool:
    return text.endswith((".yaml", ".yml")) or "/" in text or Path(text).is_file()


def get_scenario(name: str) -> Scenario:
    """A bundled scenario by name, or a scenario file by path.

    An unknown name raises ``KeyError`` listing the names there are; a path that cannot
    be read or validated raises ``ConfigError``.
    """
    names = scenario_names()
    if name in names:
        return bundled_scenario(name)
    if _looks_like_path(name):
        return load_scenario_file(name)
    raise KeyError(
        f"no scenario {name!r}; there are: {', '.join(names)} (or give a path to a .yaml file)"
    )


class _Bundled(Mapping[str, Scenario]):
    """The bundled scenarios as a read-only mapping, loaded on first use of each."""

    def __getitem__(self, name: str) -> Scenario:
        if name not in scenario_names():
            raise KeyError(name)
        return bundled_scenario(name)

    def __iter__(self) -> Iterator[str]:
        return iter(scenario_names())

    def __len__(self) -> int:
        return len(scenario_names())


#: ``SCENARIOS["kv_pressure"]``, ``list(SCENARIOS)``: the bundled files by name.
SCENARIOS: Mapping[str, Scenario] = _Bundled()
