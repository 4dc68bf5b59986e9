"""Signals and rulebooks built by hand for the diagnosis's tests (tests/core/): ``signals``
changes a healthy window's signals, ``rules`` is the default rulebook
(``support.rulebooks``) with a chosen ceiling, ``q`` a p99. Each part of the diagnosis
(facts, decode, stall) is tested through ``diagnose``, the one way the rest of the daemon
reaches it."""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm_triage.core.model import Cause, Diagnosis, Quantile, Reason, Signals, Transition
from vllm_triage.core.rulebook import Ceiling, Rulebook

from support.rulebooks import default_rulebook


def rules(ceiling: Ceiling | None = None) -> Rulebook:
    return dataclasses.replace(default_rulebook(), ceiling=ceiling)


def q(value: float, p: float = 0.99) -> Quantile:
    return Quantile(q=p, value=value)


HEALTHY: dict[str, Any] = dict(
    ttft_p99=q(0.3),
    ttft_mean=0.1,
    itl_p99=q(0.03),
    itl_mean=0.02,
    waiting_mean=0.0,
    running_mean=4.0,
    kv_usage_mean=0.2,
    kv_usage_max=0.25,
    preemptions_per_second=0.0,
    queue_time_mean=0.01,
    queue_time_count=100.0,
    ttft_count=100.0,
    prefill_time_share=0.1,
    decode_tokens_per_second_per_stream=50.0,
    kv_pool_tokens=100_000,
)


def signals(**changes: Any) -> Signals:
    return Signals(
        model_name="m", at=100.0, span_seconds=60.0, snapshots=13, **{**HEALTHY, **changes}
    )


#: Waiting, and the pool (100k tokens, 97 % used by 8 requests) has room for 0.25 more
#: request of the current size; preemptions confirm: KV pressure.
KV_FULL_PREEMPTING: dict[str, Any] = dict(
    waiting_mean=6.0,
    running_mean=8.0,
    kv_usage_mean=0.97,
    kv_usage_max=0.99,
    preemptions_per_second=0.4,
    ttft_p99=q(9.0),
    ttft_mean=4.0,
    queue_time_mean=3.5,
)


def firing(cause: Cause, at: float, model: str = "m") -> Transition:
    """The transition that opens an incident of ``cause``, with a diagnosis of its own."""
    d = Diagnosis(
        model_name=model,
        at=at,
        breaches=("ttft_p99",),
        cause=cause,
        confidence=0.9,
        summary=f"{cause} summary",
        evidence={"waiting_mean": 4.0},
        remediation=(f"fix {cause}",),
    )
    return Transition("firing", Reason.OPENED, model, cause, at, at, d)
