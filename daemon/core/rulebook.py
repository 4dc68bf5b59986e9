"""What the classifier reads besides the signals: SLOs, thresholds, remediation, ceiling.

Plain frozen dataclasses, so that the core depends on nothing but itself: the settings
layer (``daemon.settings``, pydantic) validates the user's values and ``daemon.assemble``
converts them into these once, at start-up. The meaning of every threshold is in
``rules/defaults.yaml`` beside its default value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from daemon.core.model import Cause


@dataclass(frozen=True, slots=True)
class Slo:
    """What users should not feel: TTFT p99, ITL p99 and how many requests may wait."""

    ttft_p99_seconds: float
    itl_p99_seconds: float
    waiting_requests: float


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The cut-offs that decide between causes (see ``rules/defaults.yaml``)."""

    min_observations: int
    kv_headroom_requests: float
    kv_usage_full: float
    queue_share_of_ttft: float
    prefill_dominant_share: float
    itl_spike_ratio: float
    near_ceiling_ratio: float
    stall_after_seconds: float


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The single-stream decode ceiling of the target's hardware and model."""

    gpu: str
    memory_bandwidth_gb_s: float
    weight_bytes_per_token: float
    tokens_per_second: float


@dataclass(frozen=True, slots=True)
class Rulebook:
    """Everything the classifier reads besides the signals, resolved once at start-up."""

    slo: Slo
    thresholds: Thresholds
    remediation: Mapping[Cause, tuple[str, ...]]
    ceiling: Ceiling | None = None
