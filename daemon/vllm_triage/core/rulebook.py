"""What the classifier reads besides the signals: SLOs, thresholds, remediation, ceiling,
and the hardware and model facts of the decode step roofline.

Plain frozen dataclasses, so that the core depends on nothing but itself: the settings
layer (``vllm_triage.config``, pydantic) validates the user's values and
``vllm_triage.assemble`` converts them into these. The meaning of every threshold is in
``rules/defaults.yaml`` beside its default value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from vllm_triage.core.model import Cause

#: Where a fact of the roofline came from, first to last in the order they are tried
#: (``docs/physics.md``, "Where each fact comes from"): what the user set, the model's
#: own config.json, what vLLM's metrics say, the bundled tables (a card's row of
#: rules/gpus.yaml, a model's row of rules/models.yaml), an estimate, a default.
SourceKind = Literal[
    "settings", "config.json", "metrics", "gpu table", "model table", "estimate", "default"
]


@dataclass(frozen=True, slots=True)
class Source:
    """One fact's source, and a few words of which (``gpu table (NVIDIA H100 SXM)``)."""

    kind: SourceKind
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} ({self.detail})" if self.detail else self.kind

    @property
    def given(self) -> bool:
        """Whether the user said it (the settings or the config.json they named): such a
        fact outranks what the metrics imply."""
        return self.kind in ("settings", "config.json")


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
    roofline_impossible_ratio: float
    dram_active_busy: float
    stall_after_seconds: float


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The single-stream decode ceiling of the target's hardware and model."""

    gpu: str
    memory_bandwidth_gb_s: float
    weight_bytes_per_token: float
    tokens_per_second: float


@dataclass(frozen=True, slots=True)
class Roofline:
    """What the decode step roofline needs to know about the card and the model
    (``docs/physics.md``, "The decode roofline"); ``vllm_triage.core.roofline`` does the sums.

    Bytes and parameters are the whole model's: the arithmetic divides them over
    ``tensor_parallel_size`` GPUs. ``None`` is "unknown": that term is left out of the
    floor and named in the evidence, never counted as zero.

    - ``weight_bytes``: read by every step whatever the batch: a dense model's bytes read
      per token; for a mixture of experts, everything but the routed experts (attention,
      dense layers, shared experts, routers, the LM head).
    - ``routed_expert_bytes``: every routed expert of every MoE layer; a step reads the
      share its tokens touch (``num_experts``, ``experts_per_token`` say how many).
    - ``active_parameters``: the weights one token multiplies through (2 FLOPs each).
    - ``attention_flops_per_context_token``: FLOPs one new token spends on each earlier
      token of its sequence, all layers together.
    - ``kv_bytes_per_token`` and ``kv_split``: the KV cache of one token, and over how
      many GPUs it can be split (its KV heads; 1 for a latent cache every GPU keeps whole).
    - ``draft_weight_bytes``, ``draft_parameters`` and ``draft_kv_bytes_per_token``: a
      draft model's weights and its own KV cache per token, both read once per draft
      token (0 for n-gram drafting).
    - ``kv_in_model_dtype``: ``kv_bytes_per_token`` is the model's own 16-bit figure (a
      config.json or a model row, no KV dtype set), so the cache dtype vLLM reports
      applies to it (fp8 halves it).
    - ``memory_gb`` and ``resident_weight_bytes``: the card's memory and what the weights
      occupy (all GPUs), for estimating the KV pool's bytes from its size in tokens.
    - ``sources``: where each fact came from, by name (``bandwidth``, ``compute``,
      ``weights``, ``kv_bytes_per_token``, ``tensor_parallel``, ``active_parameters``);
      the core adds what it reads from the metrics (``vllm_triage.core.roofline.sources``).
    """

    gpu: str
    memory_bandwidth_gb_s: float
    weight_bytes: float | None
    achievable_fraction: float = 1.0
    compute_tflops: float | None = None
    tensor_parallel_size: int = 1
    routed_expert_bytes: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    active_parameters: float | None = None
    attention_flops_per_context_token: float | None = None
    kv_bytes_per_token: float | None = None
    kv_split: int | None = None
    draft_weight_bytes: float | None = None
    draft_parameters: float | None = None
    draft_kv_bytes_per_token: float | None = None
    kv_in_model_dtype: bool = False
    memory_gb: float | None = None
    resident_weight_bytes: float | None = None
    sources: Mapping[str, Source] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Rulebook:
    """Everything the classifier reads besides the signals, resolved once at start-up.

    ``decode_remediation`` holds the decode-bound texts by what the roofline says binds
    (``weights``, ``kv``, ``draft``, ``compute``, ``serving_stack``, ``settings``).
    ``provenance`` says where the hardware and model facts came from (fleet mode:
    ``dcgm``, a rule, the model table, the settings); it is added to every diagnosis's
    evidence as it is.
    """

    slo: Slo
    thresholds: Thresholds
    remediation: Mapping[Cause, tuple[str, ...]]
    ceiling: Ceiling | None = None
    roofline: Roofline | None = None
    decode_remediation: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Fixes by the kind of a cause (``asleep``, ``stale_gauges``: a stall that is not a
    #: hang; ``render``: a TTFT spent in the API server), before the cause's own.
    kind_remediation: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    provenance: Mapping[str, str] = field(default_factory=dict)
