"""The series a deployed vLLM 0.34 server adds to ``exposition``'s: sleep state, render time.

Each appears only where the simulated server has the feature, so that a scenario
without it renders exactly what it rendered before they existed:

- ``vllm:engine_sleep_state{engine, model_name, sleep_state}``, between the waiting and
  KV gauges as vLLM registers it: three 0/1 gauges per engine (``awake``,
  ``weights_offloaded`` for sleep level 1, ``discard_all`` for level 2), state by state,
  on servers with ``enable_sleep_mode``;
- ``vllm:request_render_duration_seconds{model_name, request_type}``, the API server's
  histogram (no ``engine`` label), created at its first observation and each
  ``request_type`` series at its own first, on servers that model render time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_triage.simulator.buckets import RENDER_V034
from vllm_triage.simulator.frontend import FrontendStats
from vllm_triage.simulator.textformat import (
    Labels,
    Naming,
    Series,
    created,
    format_value,
    header,
    sample,
)

SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
RENDER_NAME = "vllm:request_render_duration_seconds"
RENDER_HELP = (
    "Time spent rendering a request, including chat templating, tokenization, "
    "and multimodal preprocessing."
)


@dataclass(frozen=True, slots=True)
class SleepGauge:
    """``vllm:engine_sleep_state`` (V1 naming only)."""

    name: str = "vllm:engine_sleep_state"
    help: str = (
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
        "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
        "level 2."
    )

    def render(self, series: Sequence[Series], naming: Naming, created_at: float) -> str:
        sleeping = [s for s in series if s.engine.spec.enable_sleep_mode]
        if naming != "v1" or not sleeping:
            return ""
        out = header(self.name, self.help, "gauge")
        for level, state in enumerate(SLEEP_STATES):
            for s in sleeping:
                value = 1.0 if s.engine.sleep_level == level else 0.0
                out += sample(self.name, {**s.labels, "sleep_state": state}, value)
        return out


def render_frontends(
    frontends: Sequence[tuple[str, FrontendStats]], created_at: float, naming: Naming
) -> str:
    """``vllm:request_render_duration_seconds`` for ``(model_name, frontend)`` pairs."""
    rows = [
        ({"model_name": model, "request_type": kind}, hist, created_at + frontend.created_s)
        for model, frontend in frontends
        for kind, hist in frontend.render.items()
    ]
    if naming != "v1" or not rows:
        return ""
    out = header(RENDER_NAME, RENDER_HELP, "histogram")
    shown: list[tuple[Labels, float]] = []
    for labels, hist, at in rows:
        shown.append((labels, at))
        cumulative = hist.cumulative(RENDER_V034)
        for bound, count in zip((*RENDER_V034, math.inf), cumulative, strict=True):
            out += sample(f"{RENDER_NAME}_bucket", {**labels, "le": format_value(bound)}, count)
        out += sample(f"{RENDER_NAME}_count", labels, hist.count)
        out += sample(f"{RENDER_NAME}_sum", labels, hist.sum)
    return out + created(RENDER_NAME, RENDER_HELP, shown)
