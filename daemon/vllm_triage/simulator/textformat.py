"""Prometheus text format 0.0.4 as prometheus_client writes it, for ``exposition``.

Only the pieces: sample lines, HELP/TYPE headers, the ``_created`` gauges, and one
engine's series with its labels. Split from ``exposition`` to keep each module small.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from vllm_triage.simulator.engine import Engine

#: What a body is rendered as: vLLM's V0 or V1 names, or another engine's dialect
#: (``dialects``: SGLang, LMDeploy, TensorRT-LLM, vLLM's Rust frontend).
Naming = Literal["v0", "v1", "sglang", "lmdeploy", "trtllm", "vllm-rust"]
Labels = dict[str, str]


def format_value(value: float) -> str:
    """A sample value as prometheus_client writes it (its ``floatToGoString``).

    Python's ``repr`` of the float (``917.0``, ``0.0026``), except Go's earlier switch to
    exponents for large numbers (``1.777757996204056e+09``) and ``+Inf``/``-Inf``/``NaN``.
    """
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def sample(name: str, labels: Labels, value: float) -> str:
    if not labels:
        return f"{name} {format_value(value)}\n"
    inner = ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}} {format_value(value)}\n"


def header(name: str, help_text: str, kind: str) -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


@dataclass(frozen=True, slots=True)
class Series:
    """One engine of one model, with its identifying labels."""

    labels: Labels
    engine: Engine

    def created(self, created_at: float) -> float:
        """The unix time this engine's counters were created (started, or last reset)."""
        return created_at + self.engine.stats.created_s


def created(base: str, help_text: str, rows: Iterable[tuple[Labels, float]]) -> str:
    """The ``<base>_created`` gauge family prometheus_client >= 0.12 adds in text 0.0.4:
    each series' labels and the unix time it was created."""
    name = f"{base}_created"
    return header(name, help_text, "gauge") + "".join(sample(name, lab, at) for lab, at in rows)
