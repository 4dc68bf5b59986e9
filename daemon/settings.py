"""Settings: ``rules/defaults.yaml``, then the user's ``--config`` file, then the environment.

Later sources win key by key (a nested key overrides only itself):
``VLLM_TRIAGE_SLO__TTFT_P99_SECONDS=1.5`` changes one SLO and keeps the rest of the
file's. Unknown keys are refused, so a typo never silently falls back to a default, and
every error names the key (and the file) that is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from daemon.errors import ConfigError
from daemon.rules import read_bundled, read_file

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Slo(BaseModel):
    model_config = _FROZEN
    ttft_p99_seconds: float = Field(gt=0)
    itl_p99_seconds: float = Field(gt=0)
    waiting_requests: float = Field(gt=0)


class IncidentRules(BaseModel):
    model_config = _FROZEN
    open_after: int = Field(ge=1)
    resolve_after: int = Field(ge=1)


class Thresholds(BaseModel):
    model_config = _FROZEN
    min_observations: int = Field(ge=1)
    kv_headroom_requests: float = Field(gt=0)
    kv_usage_full: float = Field(gt=0, le=1)
    queue_share_of_ttft: float = Field(gt=0, lt=1)
    prefill_dominant_share: float = Field(gt=0, lt=1)
    itl_spike_ratio: float = Field(gt=1)
    near_ceiling_ratio: float = Field(gt=0, le=1)


class HardwareSettings(BaseModel):
    model_config = _FROZEN
    gpu: str | None = None
    memory_bandwidth_gb_s: float | None = Field(default=None, gt=0)
    tensor_parallel_size: int = Field(default=1, ge=1)
    achievable_fraction: float = Field(default=1.0, gt=0, le=1)


class ModelSettings(BaseModel):
    model_config = _FROZEN
    parameters_billion: float | None = Field(default=None, gt=0)
    dtype: str = "float16"
    config_json: Path | None = None
    kv_cache_dtype: str | None = None

    @model_validator(mode="after")
    def _one_size(self) -> ModelSettings:
        if self.parameters_billion is not None and self.config_json is not None:
            raise ValueError("give parameters_billion or config_json, not both")
        return self


class Settings(BaseSettings):
    """Everything the core needs; the daemon's own keys join in a later section."""

    model_config = SettingsConfigDict(
        env_prefix="VLLM_TRIAGE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    window_seconds: float = Field(gt=0)
    slo: Slo
    incident: IncidentRules
    thresholds: Thresholds
    hardware: HardwareSettings = HardwareSettings()
    model: ModelSettings = ModelSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The merged YAML arrives as init kwargs; the environment must beat the files.
        return (env_settings, init_settings)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``, recursing into mappings present in both."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _describe(exc: ValidationError, source: str) -> str:
    lines = [f"invalid settings ({source}):"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = err.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"  {key}: {msg}{shown}")
    return "\n".join(lines)


def load_settings(config: str | Path | None = None) -> Settings:
    """Defaults from ``rules/``, the user's YAML file on top, then ``VLLM_TRIAGE_*``.

    A relative ``model.config_json`` is resolved against the config file's folder.
    """
    merged: dict[str, Any] = read_bundled("defaults.yaml")
    source = "rules/defaults.yaml"
    if config is not None:
        user = read_file(config)
        if user is None:
            user = {}
        if not isinstance(user, Mapping):
            raise ConfigError(f"{config}: expected a mapping of settings at the top level")
        cfg_json = (user.get("model") or {}).get("config_json")
        if isinstance(cfg_json, str) and not Path(cfg_json).is_absolute():
            user = deep_merge(user, {"model": {"config_json": str(Path(config).parent / cfg_json)}})
        merged = deep_merge(merged, user)
        source = f"{config} over rules/defaults.yaml, and VLLM_TRIAGE_* variables"
    try:
        return Settings(**merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None
