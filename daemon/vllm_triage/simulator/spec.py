"""What the simulator is given: one server's limits and caps, and the requests it sees.

Kept apart from ``engine`` (which schedules them) so that each stays small; ``engine``
re-exports these names. ``ServerSpec`` is one vLLM server as launched: the card, the
model, vLLM's caps, and how it is deployed (``data_parallel_size`` engines behind one
API server, ``api_server_count`` API-server processes, ``--enable-sleep-mode``, what a
request costs the API server to render); ``Workload`` draws the ``Arrival`` s of a phase.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from vllm_triage.simulator.stats import FinishedReason

RequestType = Literal["chat", "completion"]
SizeDistribution = Literal["uniform", "lognormal"]


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One vLLM server: the card's two limits, the model's bytes and FLOPs, vLLM's caps.

    Plain numbers on purpose (``vllm_triage.ceiling.hardware`` has a GPU table): ``weight_bytes`` is
    what one decode step reads (per GPU under tensor parallelism, active experts only for
    a mixture of experts), ``parameters`` what one token multiplies through.
    """

    memory_bandwidth_gb_s: float
    compute_tflops: float
    weight_bytes: float
    parameters: float
    kv_bytes_per_token: float
    num_layers: int = 32
    hidden_size: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    num_gpu_blocks: int = 8192
    block_size: int = 16
    max_model_len: int = 8192
    compute_efficiency: float = 0.5
    step_overhead_s: float = 0.002
    kv_watermark: float = 0.01
    gpu_memory_utilization: float = 0.9
    #: ``--kv-cache-memory-bytes``: the pool's bytes per GPU when the operator fixed them
    #: (``vllm:cache_config_info`` shows them; ``None``: vLLM sized the pool itself).
    kv_cache_memory_bytes: int | None = None
    #: The card's name in rules/gpus.yaml, when the spec was built from the table.
    gpu: str = ""
    #: Mixture of experts: all routed experts' bytes (``weight_bytes`` is the rest), read
    #: for the distinct experts a step's tokens are routed to.
    routed_expert_bytes: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    #: Speculative decoding: draft tokens per step (k), each accepted with probability
    #: ``draft_acceptance`` after an accepted one; the draft model's bytes and parameters.
    num_speculative_tokens: int = 0
    draft_acceptance: float = 0.0
    draft_weight_bytes: float = 0.0
    draft_parameters: float = 0.0
    draft_kv_bytes_per_token: float = 0.0
    #: Deployment. ``data_parallel_size`` engines (``--data-parallel-size``), each with
    #: the caps and KV pool above, behind one API server that sends each request to the
    #: least loaded engine (vLLM's internal load balancing); ``api_server_count``
    #: API-server processes (``--api-server-count``) render requests before any engine
    #: sees them; ``enable_sleep_mode`` (``--enable-sleep-mode``) lets engines sleep and
    #: shows ``vllm:engine_sleep_state``.
    data_parallel_size: int = 1
    api_server_count: int = 1
    enable_sleep_mode: bool = False
    #: Rendering (chat template, tokenization, multimodal preprocessing) costs an
    #: API-server process ``render_overhead_s`` per request plus ``render_s_per_token``
    #: per prompt token, one request at a time; both 0: not modelled (no render histogram).
    render_overhead_s: float = 0.0
    render_s_per_token: float = 0.0

    def __post_init__(self) -> None:
        positive = (
            self.memory_bandwidth_gb_s,
            self.compute_tflops,
            self.weight_bytes,
            self.parameters,
            self.kv_bytes_per_token,
            self.compute_efficiency,
        )
        if min(positive) <= 0:
            raise ValueError("bandwidth, compute, weights, parameters and KV bytes must be > 0")
        counts = (self.num_layers, self.hidden_size, self.max_num_seqs, self.num_gpu_blocks)
        if min(counts) < 1 or self.block_size < 1 or self.max_model_len < 2:
            raise ValueError("layers, hidden size, seqs, blocks and lengths must be positive")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs (as vLLM requires)")
        if self.kv_pool_tokens < self.max_model_len:
            # vLLM refuses to start here too: one full-length request could never run.
            raise ValueError("the KV pool must hold at least one max_model_len request")
        if not 0 <= self.kv_watermark < 1 or self.step_overhead_s < 0:
            raise ValueError("kv_watermark must be in [0, 1) and step_overhead_s >= 0")
        if self.routed_expert_bytes < 0 or (self.routed_expert_bytes > 0) != (
            0 < self.experts_per_token <= self.num_experts
        ):
            raise ValueError("routed experts need 1 <= experts_per_token <= num_experts")
        draft = (self.draft_weight_bytes, self.draft_parameters, self.draft_kv_bytes_per_token)
        if self.num_speculative_tokens < 0 or min(draft) < 0:
            raise ValueError("speculative tokens and draft sizes must be >= 0")
        if not 0 <= self.draft_acceptance < 1:
            raise ValueError("draft_acceptance must be in [0, 1)")
        if self.data_parallel_size < 1 or self.api_server_count < 1:
            raise ValueError("data_parallel_size and api_server_count must be >= 1")
        if min(self.render_overhead_s, self.render_s_per_token) < 0:
            raise ValueError("render costs must be >= 0")

    @property
    def renders(self) -> bool:
        """Whether the API server's render time is modelled (either cost above 0)."""
        return self.render_overhead_s > 0 or self.render_s_per_token > 0

    def render_s(self, prompt_tokens: int) -> float:
        """Seconds one API-server process spends rendering a request of ``prompt_tokens``."""
        return self.render_overhead_s + self.render_s_per_token * prompt_tokens

    @property
    def kv_pool_tokens(self) -> int:
        """Tokens the KV pool holds: ``num_gpu_blocks x block_size``."""
        return self.num_gpu_blocks * self.block_size

    @property
    def decode_ceiling_tokens_per_s(self) -> float:
        """The single-stream ceiling (docs/physics.md): bandwidth / weight bytes."""
        return self.memory_bandwidth_gb_s * 1e9 / self.weight_bytes


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request as the engine gets it: when, how long the prompt, how many tokens back."""

    at_s: float
    prompt_tokens: int
    output_tokens: int
    finished_reason: FinishedReason = "length"
    #: When the client sent it, if earlier than ``at_s`` (the instant the engine gets
    #: it, after the API server rendered it): TTFT and e2e latency count from here.
    sent_s: float | None = None
    request_type: RequestType = "chat"

    @property
    def sent_at(self) -> float:
        return self.at_s if self.sent_s is None else self.sent_s


@dataclass(frozen=True, slots=True)
class Workload:
    """Traffic for one phase: Poisson arrivals and/or a burst at the phase's start.

    Prompt and output lengths scatter around their means by ``spread``: uniform in
    mean x [1 - spread, 1 + spread], or lognormal with sigma = spread and the same mean.
    ``stop_fraction`` of requests end on a stop token (``finished_reason="stop"``), the
    rest at their length limit.
    """

    arrival_rate_per_s: float = 0.0
    prompt_tokens: int = 512
    output_tokens: int = 128
    spread: float = 0.25
    distribution: SizeDistribution = "uniform"
    burst: int = 0
    stop_fraction: float = 0.0
    seed: int = 0
    #: The API route the requests use (the render histogram's ``request_type``).
    request_type: RequestType = "chat"

    def __post_init__(self) -> None:
        if self.arrival_rate_per_s < 0 or self.burst < 0:
            raise ValueError("arrival rate and burst must be >= 0")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError("prompt and output means must be >= 1 token")
        if self.spread < 0 or (self.distribution == "uniform" and self.spread >= 1):
            raise ValueError("spread must be >= 0 (and < 1 for uniform)")
        if not 0 <= self.stop_fraction <= 1:
            raise ValueError("stop_fraction must be in [0, 1]")

    def arrivals(
        self, start_s: float, end_s: float, *, key: str = "", part: int = 0, parts: int = 1
    ) -> Iterator[Arrival]:
        """Requests arriving in [start_s, end_s), in time order.

        ``part`` of ``parts`` is one data-parallel engine's share: a 1/parts thinning of the
        Poisson stream (still Poisson) and every parts-th request of the burst. ``key``
        separates the random streams of phases and engines; the seed string is hashed
        (SHA-512), so it does not depend on ``PYTHONHASHSEED``.
        """
        rng = random.Random(f"{self.seed}/{key}/{part}/{parts}")
        for index in range(self.burst):
            if index % parts == part:
                yield self._arrival(rng, start_s)
        rate = self.arrival_rate_per_s / parts
        if rate <= 0:
            return
        at = start_s
        while True:
            at += rng.expovariate(rate)
            if at >= end_s:
                return
            yield self._arrival(rng, at)

    def _arrival(self, rng: random.Random, at: float) -> Arrival:
        reason: FinishedReason = "stop" if rng.random() < self.stop_fraction else "length"
        prompt, output = self._size(rng, self.prompt_tokens), self._size(rng, self.output_tokens)
        return Arrival(at, prompt, output, reason, request_type=self.request_type)

    def _size(self, rng: random.Random, mean: int) -> int:
        if self.spread == 0:
            return mean
        if self.distribution == "uniform":
            factor = rng.uniform(1 - self.spread, 1 + self.spread)
        else:
            factor = math.exp(rng.gauss(-(self.spread**2) / 2, self.spread))
        return max(1, round(mean * factor))
