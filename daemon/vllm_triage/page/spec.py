"""What the page draws: ``rules/report.yaml`` (panels, cause colours, deciding evidence),
validated once and cached."""

from __future__ import annotations

import functools
import zlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vllm_triage.core.timeline import SETTING_PREFIXES
from vllm_triage.errors import ConfigError
from vllm_triage.rules import bundled_path, read_bundled

SPEC_FILE = "report.yaml"
_FROZEN = ConfigDict(frozen=True, extra="forbid")
Unit = Literal["s", "ratio", "requests", "per_s", "tokens", "tok_s", "plain"]


class SeriesSpec(BaseModel):
    model_config = _FROZEN
    key: str = Field(min_length=1)
    label: str = Field(min_length=1)
    color: str = Field(pattern=r"^#[0-9a-fA-F]{6}$")
    axis: Literal["left", "right"] = "left"

    @property
    def setting(self) -> bool:
        return self.key.startswith(SETTING_PREFIXES)


class PanelSpec(BaseModel):
    model_config = _FROZEN
    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    title: str
    unit: Unit
    right_unit: Unit | None = None
    empty: str = "no data in this span"
    series: list[SeriesSpec] = Field(min_length=1)


class CauseStyle(BaseModel):
    model_config = _FROZEN
    label: str
    color: str = Field(pattern=r"^#[0-9a-fA-F]{6}$")


class DecidingSpec(BaseModel):
    model_config = _FROZEN
    key: str
    label: str
    unit: Unit
    vs: str | None = None


class PageSpec(BaseModel):
    model_config = _FROZEN
    history_seconds: float = Field(gt=0)
    refresh_seconds: float = Field(gt=0)
    max_points: int = Field(ge=100)
    causes: dict[str, CauseStyle]
    panels: list[PanelSpec] = Field(min_length=1)
    deciding: dict[str, list[DecidingSpec]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_panels(self) -> PageSpec:
        ids = [p.id for p in self.panels]
        if len(set(ids)) != len(ids):
            raise ValueError("panel ids must be unique")
        return self

    @property
    def measured_keys(self) -> tuple[str, ...]:
        """The keys measured at each evaluation (not settings), in panel order."""
        keys = (s.key for p in self.panels for s in p.series if not s.setting)
        return tuple(dict.fromkeys(keys))

    def cause_style(self, cause: str) -> CauseStyle:
        """A known cause's style; any other cause (one added after this file) gets a stable
        colour derived from its name, so it is still shaded and told apart."""
        known = self.causes.get(cause)
        if known is not None:
            return known
        h = zlib.crc32(cause.encode("utf-8"))
        r, g, b = 60 + h % 150, 60 + (h >> 8) % 150, 60 + (h >> 16) % 150
        return CauseStyle(label=cause.replace("_", " "), color=f"#{r:02x}{g:02x}{b:02x}")


@functools.cache
def load_spec() -> PageSpec:
    try:
        return PageSpec.model_validate(read_bundled(SPEC_FILE))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{bundled_path(SPEC_FILE)}: {problems}") from None
