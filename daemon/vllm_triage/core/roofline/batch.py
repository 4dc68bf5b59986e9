"""Tokens per engine step: how many a step computes (T), how they spread over the
window's steps, how many sequences it serves (B) and how many draft tokens each verifies
(k), per engine (``docs/physics.md``, "The decode roofline", "Tokens per step").

Kept apart from ``roofline`` (which prices a step of T tokens) because it reads only the
window's signals. Pure arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_triage.core.model import Histogram, Signals


@dataclass(frozen=True, slots=True)
class Batch:
    """Tokens computed per step (T, the mean), how they spread over the window's steps
    (share of steps, tokens), sequences per step (B) and draft length (k), per engine."""

    tokens: float
    mix: tuple[tuple[float, float], ...]
    source: str
    sequences: float | None
    draft_length: float


def mix(h: Histogram, mean: float) -> tuple[tuple[float, float], ...]:
    """The steps' token counts from the window's ``iteration_tokens`` buckets: each bucket
    at its midpoint, all scaled so that their mean is the exact ``mean`` (sum / count).

    Why not the mean alone: a step's floor is the larger of a memory term and a compute
    term that grows with T, so a few long prefill steps among many decode steps cost more
    than one step of the mean size would (the max is convex).
    """
    parts: list[tuple[float, float]] = []
    lower, seen = 0.0, 0.0
    for bound, cumulative in zip(h.bounds, h.cumulative, strict=True):
        n = cumulative - seen
        if n > 0:
            mid = 2.0 * lower if math.isinf(bound) else (lower + bound) / 2.0
            parts.append((n / h.count, max(mid, 1.0)))
        lower, seen = bound, cumulative
    scale = mean / sum(p * t for p, t in parts) if parts else 1.0
    return tuple((p, t * scale) for p, t in parts) or ((1.0, mean),)


def batch_of(s: Signals, engines: int) -> Batch:
    """T from ``vllm:iteration_tokens_total`` when exposed (prompt plus generated tokens
    per step, plus the rejected draft tokens the step also computed); otherwise from the
    running requests, each computing 1 + k tokens, plus the prompt tokens per step."""
    drafts = s.spec_drafts or 0.0
    draft_length = (s.spec_draft_tokens or 0.0) / drafts if drafts > 0 else 0.0
    running = s.running_busy_mean if s.running_busy_mean is not None else s.running_mean
    sequences = running / engines if running is not None else None
    h = s.iteration_tokens
    if h is not None and s.iteration_tokens_mean is not None and s.iteration_steps > 0:
        rejected = 0.0
        if drafts > 0:
            rejected = max(0.0, (s.spec_draft_tokens or 0.0) - (s.spec_accepted_tokens or 0.0))
        tokens = max(s.iteration_tokens_mean + rejected / s.iteration_steps, 1.0)
        return Batch(tokens, mix(h, tokens), ITERATION_TOKENS, sequences, draft_length)
    if sequences is not None:
        prompts = (s.prompt_tokens_per_second or 0.0) * (s.decode_step_seconds or 0.0) / engines
        tokens = max(sequences * (1.0 + draft_length) + prompts, 1.0)
        return Batch(tokens, ((1.0, tokens),), RUNNING, sequences, draft_length)
    return Batch(1.0, ((1.0, 1.0),), "unknown (one token assumed)", sequences, draft_length)


ITERATION_TOKENS = "vllm:iteration_tokens_total"
RUNNING = "vllm:num_requests_running"
