"""Which symptoms breach the SLO, and the checks that make each cause a candidate.

A cause is a candidate when its deciding check (the first) holds, and the fraction of
its checks that hold is its confidence. ``is_present`` is the looser sign of a cause
that keeps an open incident's cause and names contributing causes: a number wandering
around its cut-off should not make a cause come and go window by window. The order in
which candidates win is ``diagnose``'s; the checks only say what each cause's physics
looks like (``docs/physics.md``, "The four causes").
"""

from __future__ import annotations

from vllm_triage.core.facts import Facts
from vllm_triage.core.model import Cause
from vllm_triage.core.rulebook import Rulebook, Thresholds


def breaches_of(f: Facts) -> tuple[str, ...]:
    """The symptoms this window shows, as the evidence names them; preemptions count
    unless the pool is known to have room (then they are vLLM's choice, not a lack)."""
    out = []
    if f.ttft_breach:
        out.append("ttft_p99")
    if f.itl_breach:
        out.append("itl_p99")
    if f.waiting_sustained:
        out.append("waiting")
    if f.preempting and f.kv_tight is not False:
        out.append("kv_preemptions")
    return tuple(out)


def checks_of(cause: Cause, f: Facts, th: Thresholds) -> list[bool | None]:
    """The independent signals that support a cause; ``None`` where the data is missing.

    A cause is a candidate when its deciding check (the first one) holds; the fraction of
    its checks that hold is its confidence (a missing one counts half).

    Requests also wait when the engine is saturated by prefill work (a flood of long
    prompts uses the whole per-step token budget): that backlog is prefill-bound, not a
    sequence cap, so ``queue_bound`` gives way when prefill dominates engine time.
    """
    queue_dominant = None if f.queue_share is None else f.queue_share >= th.queue_share_of_ttft
    prefill_dominant = (
        None if f.prefill_share is None else f.prefill_share >= th.prefill_dominant_share
    )
    room = None if f.kv_tight is None else not f.kv_tight
    if cause == "kv_pressure":
        return [
            f.preempting or ((f.waiting > 0) and f.kv_tight is True) or f.full_unseen_preemptions,
            f.kv_tight,
            # Unknown, not absent, where the engine counts no preemptions.
            f.preempting or (None if f.full_unseen_preemptions else False),
            f.waiting > 0,
        ]
    if cause == "queue_bound":
        return [
            (f.waiting_sustained or (f.ttft_breach and queue_dominant is True))
            and room is not False
            and prefill_dominant is not True,
            room,
            f.waiting_sustained,
            queue_dominant,
            None if prefill_dominant is None else not prefill_dominant,
        ]
    spiky = None if f.itl_spread is None else f.itl_spread >= th.itl_spike_ratio
    interference = f.itl_breach and (prefill_dominant is True or (spiky is True and f.prompts))
    if cause == "prefill_bound":
        # TTFT is prefill's when nobody waits steadily (the queue is not to blame), or
        # when prefill is what the engine spends its time on (a prefill backlog).
        ttft_side = f.ttft_breach and (
            prefill_dominant is True or (not f.waiting_sustained and queue_dominant is not True)
        )
        backlog = f.waiting_sustained and prefill_dominant is True and room is not False
        return [
            ttft_side or backlog or interference,
            prefill_dominant,
            None if f.queue_share is None else not queue_dominant or prefill_dominant,
            spiky if f.itl_breach else None,
        ]
    # decode_bound: every token slow (p50 near p99), the engine busy decoding
    return [
        f.itl_breach and not interference,
        None if prefill_dominant is None else not prefill_dominant,
        None if spiky is None else not spiky,
        not f.waiting_sustained,
    ]


def confidence_of(checks: list[bool | None]) -> float:
    score = sum(1.0 if c is True else 0.5 if c is None else 0.0 for c in checks)
    return round(score / len(checks), 2)


#: How far below its own cut-off a symptom still counts as *present* (contributing, or
#: keeping an open incident's cause): half the ITL spike ratio, half the ITL SLO at p50
#: (``docs/physics.md``, "Contributing causes"). Looser than the deciding checks on
#: purpose: a cause whose number wanders around its cut-off is still there, and only a
#: cause that has gone by this margin lets an incident change cause at once.
PRESENCE = 0.5


def is_present(cause: Cause, f: Facts, check: list[bool | None], rules: Rulebook) -> bool:
    """Whether ``cause``'s symptoms are present this window (its deciding check, or the
    looser sign of it that the contributing list and the incident's hysteresis use)."""
    if check[0]:
        return True
    th = rules.thresholds
    if cause == "queue_bound":
        # A queue behind a prefill flood is prefill's doing, not a cap's (``checks_of``).
        prefill_dominant = (f.prefill_share or 0.0) >= th.prefill_dominant_share
        return f.waiting_sustained and f.kv_tight is not True and not prefill_dominant
    if cause == "prefill_bound":
        return (
            f.itl_breach
            and f.prompts
            and f.itl_spread is not None
            and f.itl_spread >= th.itl_spike_ratio * PRESENCE
        )
    if cause == "decode_bound":
        return (
            f.itl_breach
            and f.itl_p50 is not None
            and f.itl_p50 >= rules.slo.itl_p99_seconds * PRESENCE
        )
    return False
