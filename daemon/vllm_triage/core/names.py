"""vLLM's metric names across versions, mapped to the fields of ``model.ModelSeries``.

vLLM renamed several series (see ``tests/fixtures/vllm/SOURCES.md`` and vLLM's
``vllm/v1/metrics/loggers.py``):

- ``vllm:gpu_cache_usage_perc`` (V0, up to 0.11) became ``vllm:kv_cache_usage_perc``
  (0.9.2 on); both are fractions 0..1 despite the name. 0.9.2 to 0.11 expose both.
- ``vllm:time_per_output_token_seconds`` (up to 0.14) became
  ``vllm:inter_token_latency_seconds`` (0.10.2 on); both observe one inter-token
  interval per generated token after the first. ``vllm:request_time_per_output_token_seconds``
  is a different, per-request histogram and is not used for ITL.
- Queue, prefill and decode time histograms exist only in V1 (0.8 on).
- Speculative decoding (V1, only when it is on) counts drafts, draft tokens and accepted
  tokens (``vllm:spec_decode_num_*_total``, one draft per request per engine step);
  ``vllm:iteration_tokens_total`` is a histogram of tokens per engine step (prompt
  tokens of the prefills that completed plus the tokens generated), both eras. Its
  ``_count`` is also the count of engine steps: the most direct sign that the engine is
  stepping (``ModelSeries.iterations``; ``docs/physics.md``, "stalled").
- Data-parallel engines: every engine-side series carries ``engine``, the engine's
  global data-parallel rank (0.8.5 on). The families are read merged over engines, and
  the progress series (``PER_ENGINE``) also engine by engine, so that one hung engine
  among several shows (``docs/physics.md``, "stalled").
- ``vllm:engine_sleep_state{engine, sleep_state}`` (sleep mode, 0.10 on): a 0/1 gauge per
  state, ``awake``, ``weights_offloaded`` (level 1) or ``discard_all`` (level 2).
- ``vllm:request_render_duration_seconds`` (0.34 on): chat template, tokenization and
  multimodal preprocessing in the API server, before the engine sees the request (no
  ``engine`` label; ``request_type`` is chat or completion). TTFT includes it.
- vLLM's own estimate of what its steps cost the hardware (``--enable-mfu-metrics``;
  seen in 0.19 and later): ``vllm:estimated_read_bytes_per_gpu_total`` and
  ``vllm:estimated_flops_per_gpu_total`` count the bytes read and the FLOPs of every step,
  per GPU, so their increases over the steps' give one step's (``docs/physics.md``, "Where
  each fact comes from").
- ``vllm:cache_config_info`` (an info gauge without ``model_name``) holds the KV pool's
  settings as labels: its size in blocks and tokens, the cache dtype, the memory
  utilization and, when the operator fixed it, the pool's bytes per GPU.
- Ray Serve re-exports the same families with the prefix ``ray_vllm:``.
- Since 0.12 every counter and histogram has a ``_created`` sample (exposed by
  prometheus_client as a separate ``..._created`` gauge family); those names are simply
  not in the table below, so they are skipped like any family we do not read.

Where both an old and a new name are present, the new one wins (``NEW`` below).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

PREFIXES = ("vllm:", "ray_vllm:")

Kind = Literal["gauge", "counter", "bucket", "sum", "count", "info", "state"]
Generation = Literal["old", "new", "both"]


@dataclass(frozen=True, slots=True)
class Spec:
    """Where one exposed sample name goes: which field, which part of it, which naming."""

    field: str
    kind: Kind
    generation: Generation


# field, base name (without prefix), kind of family, naming generation
_GAUGES: tuple[tuple[str, str, Generation], ...] = (
    ("running", "num_requests_running", "both"),
    ("waiting", "num_requests_waiting", "both"),
    ("kv_usage", "kv_cache_usage_perc", "new"),
    ("kv_usage", "gpu_cache_usage_perc", "old"),
)
_COUNTERS: tuple[tuple[str, str, Generation], ...] = (
    ("preemptions", "num_preemptions_total", "both"),
    ("prompt_tokens", "prompt_tokens_total", "both"),
    ("generation_tokens", "generation_tokens_total", "both"),
    ("requests_finished", "request_success_total", "both"),
    ("spec_drafts", "spec_decode_num_drafts_total", "both"),
    ("spec_draft_tokens", "spec_decode_num_draft_tokens_total", "both"),
    ("spec_accepted_tokens", "spec_decode_num_accepted_tokens_total", "both"),
    ("estimated_read_bytes", "estimated_read_bytes_per_gpu_total", "both"),
    ("estimated_flops", "estimated_flops_per_gpu_total", "both"),
)
_HISTOGRAMS: tuple[tuple[str, str, Generation], ...] = (
    ("ttft", "time_to_first_token_seconds", "both"),
    ("itl", "inter_token_latency_seconds", "new"),
    ("itl", "time_per_output_token_seconds", "old"),
    ("queue_time", "request_queue_time_seconds", "both"),
    ("prefill_time", "request_prefill_time_seconds", "both"),
    ("decode_time", "request_decode_time_seconds", "both"),
    ("prompt_length", "request_prompt_tokens", "both"),
    ("generation_length", "request_generation_tokens", "both"),
    ("iteration_tokens", "iteration_tokens_total", "both"),
    ("render_time", "request_render_duration_seconds", "new"),
)
CACHE_CONFIG = "cache_config_info"
SLEEP_STATE = "engine_sleep_state"

GAUGE_FIELDS = ("running", "waiting", "kv_usage")
COUNTER_FIELDS = (
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    "requests_finished",
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "estimated_read_bytes",
    "estimated_flops",
)
HISTOGRAM_FIELDS = (
    "ttft",
    "itl",
    "queue_time",
    "prefill_time",
    "decode_time",
    "prompt_length",
    "generation_length",
    "iteration_tokens",
    "render_time",
)
#: The step-driven series read engine by engine too, under the names progress is
#: watched by (``core.totals``): (field, kind) -> name.
PER_ENGINE: dict[tuple[str, Kind], str] = {
    ("running", "gauge"): "running",
    ("waiting", "gauge"): "waiting",
    ("kv_usage", "gauge"): "kv_usage",
    ("generation_tokens", "counter"): "generation_tokens",
    ("prompt_tokens", "counter"): "prompt_tokens",
    ("preemptions", "counter"): "preemptions",
    ("iteration_tokens", "count"): "iterations",
    ("ttft", "count"): "ttft_count",
    ("itl", "count"): "itl_count",
}
#: Engines read one by one per model at most (a server may show 64); more are merged only.
MAX_ENGINES = 128


def _build() -> dict[str, tuple[str, Spec]]:
    table: dict[str, tuple[str, Spec]] = {}
    for prefix in PREFIXES:
        for field, base, gen in _GAUGES:
            table[prefix + base] = (prefix, Spec(field, "gauge", gen))
        for field, base, gen in _COUNTERS:
            table[prefix + base] = (prefix, Spec(field, "counter", gen))
        for field, base, gen in _HISTOGRAMS:
            table[prefix + base + "_bucket"] = (prefix, Spec(field, "bucket", gen))
            table[prefix + base + "_sum"] = (prefix, Spec(field, "sum", gen))
            table[prefix + base + "_count"] = (prefix, Spec(field, "count", gen))
        table[prefix + CACHE_CONFIG] = (prefix, Spec("kv_pool", "info", "both"))
        table[prefix + SLEEP_STATE] = (prefix, Spec("sleep_state", "state", "new"))
    return table


#: Exposed sample name -> (prefix, spec). Read-only after import.
SAMPLES: dict[str, tuple[str, Spec]] = _build()


#: An exported label value is at most this long: a target can name its model anything
#: (the parser allows ``max_label_value_length``), and every model is in dozens of series.
MAX_LABEL_VALUE_CHARS = 128
_HASH_CHARS = 10


def label_value(value: str) -> str:
    """``value``, or, if longer than ``MAX_LABEL_VALUE_CHARS``, its beginning and a short
    hash of the whole (``...~1a2b3c4d5e``), so that distinct values stay distinct."""
    if len(value) <= MAX_LABEL_VALUE_CHARS:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    return value[: MAX_LABEL_VALUE_CHARS - _HASH_CHARS - 1] + "~" + digest
