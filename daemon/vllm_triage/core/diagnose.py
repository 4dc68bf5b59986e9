"""Signals -> Diagnosis: which SLO is breached, and why, following the physics.

First, is the engine stepping at all? ``stalled`` is checked before anything else
(``docs/physics.md``, "stalled"): a hung engine freezes every gauge at its last value and
stops every counter, so the other signals are stale or empty, and it explains every
symptom the users feel. While the engine shows no progress with work outstanding, and for
one window after a stall ends (its delayed observations are still in the histograms),
no other cause is judged.

Symptoms (what the user feels) are checked against the SLO: TTFT p99, ITL p99, sustained
waiting, and preemptions while the KV cache is tight. The *cause* is then chosen in causal
order (``docs/physics.md``, "The four causes"): KV pressure makes requests wait, waiting
inflates TTFT, and a long prefill stalls every decoding stream, so an earlier cause
explains a later symptom and wins:

0. ``stalled``: requests running or waiting (or a probe unanswered) and no progress at
   all for ``stall_after_seconds``.
1. ``kv_pressure``: requests wait or are preempted while the pool has room for less than
   one more request of the current average size (headroom counted in requests, not a
   fixed usage cut-off: in a small pool long requests leave it "full" well below 90 %).
2. ``queue_bound``: requests wait while the pool has room (a sequence or batch cap), or
   queue time is most of TTFT.
3. ``prefill_bound``: TTFT breached with the queue not to blame; or ITL breached while
   most engine time goes to prefill (prefill interference: the prompts, not decode).
4. ``decode_bound``: ITL breached, split by the decode step roofline (the step's floor
   over the measured step, ``vllm_triage.core.roofline``) into "at the hardware limit" and
   "below it: the serving stack".

The parts: ``stall`` (the stall judgement), ``facts`` (the derived numbers and the
evidence), ``checks`` (breaches, each cause's checks, confidence, presence), ``decode``
(the decode split) and ``prose`` (the words); this module puts them in causal order and
names the contributing causes.

Pure: the same ``Signals`` and ``Rulebook`` always give the same ``Diagnosis``.
"""

from __future__ import annotations

from dataclasses import replace

from vllm_triage.core import predict, prose
from vllm_triage.core.checks import breaches_of, checks_of, confidence_of, is_present
from vllm_triage.core.decode import decode_evidence, decode_remediation
from vllm_triage.core.engines import engine_evidence, explaining
from vllm_triage.core.facts import Facts, evidence_of, facts_of, frontend_bound, rounded
from vllm_triage.core.model import CAUSES, Cause, Contribution, Diagnosis, Signals
from vllm_triage.core.roofline import step as roofline
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.core.signals import INCONSISTENT_RESETS
from vllm_triage.core.stall import stall_diagnosis

#: The causes judged from the symptoms, in causal order (``stalled`` is judged first, alone).
SYMPTOM_CAUSES: tuple[Cause, ...] = tuple(c for c in CAUSES if c != "stalled")


def _contributing(
    *,
    primary: Cause,
    present: list[Cause],
    confidence: dict[Cause, float],
    s: Signals,
    f: Facts,
    rules: Rulebook,
) -> tuple[Contribution, ...]:
    others: list[Cause] = [c for c in present if c != primary]
    total = confidence[primary] + sum(confidence[c] for c in others)
    shares = {c: round(confidence[c] / total, 2) if total > 0 else 0.0 for c in others}
    # A cause with none of the evidence (0 % once rounded) contributes nothing to say.
    return tuple(
        Contribution(
            cause=c,
            share=shares[c],
            evidence=prose.contribution_evidence(c, s, f, rules),
        )
        for c in others
        if shares[c] > 0
    )


def _unjudged(s: Signals, breaches: tuple[str, ...]) -> Diagnosis:
    """Breached, and none of the causes this runtime's metrics can show explains it: said,
    never guessed (no incident opens on it)."""
    return Diagnosis(
        model_name=s.model_name,
        at=s.at,
        breaches=(),
        cause=None,
        summary=(
            f"{', '.join(breaches)} breached, and {s.runtime.shown}'s metrics cannot show "
            f"which cause: it judges only {', '.join(s.runtime.judges) or 'none'}"
        ),
        evidence={"unjudged_breaches": breaches, "runtime_limits": s.runtime.limits_for(None)},
    )


def _inconclusive(s: Signals) -> tuple[str, ...]:
    """The latency SLOs a window could not judge although work was in flight: a sparse
    load of long requests finishes too few of them in one window. Nothing in flight is an
    idle server, and an idle server is clear."""
    busy = (s.running_max or 0.0) > 0 or (s.waiting_max or 0.0) > 0
    if not busy:
        return ()
    return tuple(
        k for k in ("ttft_p99", "itl_p99") if s.missing.get(k, "").startswith("not enough data")
    )


def diagnose(s: Signals, rules: Rulebook, *, keep: Cause | None = None) -> Diagnosis:
    """Judge one model's signals against the SLO and name the cause.

    ``keep`` is an open incident's cause: while its symptoms
    are still present it stays the primary cause, and the cause that led this window
    becomes a contributing one (``core.incidents`` decides when it has led long enough).

    Only the causes the runtime's metrics can show are named (``Runtime.judges``), and
    what its metrics cannot tell about the cause named is in the evidence
    (``runtime_limits``).
    """
    return judged(s, rules, keep=keep)[0]


def judged(
    s: Signals, rules: Rulebook, *, keep: Cause | None = None, facts: Facts | None = None
) -> tuple[Diagnosis, Facts | None]:
    """``diagnose``, and the window's facts it read (None for a stalled engine's, which
    reads none): an evaluation's measurements and a second judgement of the same window
    take them instead of reading them again (``facts_of`` is a tenth of a fleet's
    judging). ``facts``: this window's, read already."""
    d, f = _judge(s, rules, keep=keep, facts=facts)
    limits = s.runtime.limits_for(d.cause) if d.cause is not None else ()
    if limits:
        d = replace(d, evidence={**d.evidence, "runtime_limits": limits})
    return (replace(d, runtime=s.runtime.name) if s.runtime.name != d.runtime else d), f


def _judge(
    s: Signals, rules: Rulebook, *, keep: Cause | None, facts: Facts | None
) -> tuple[Diagnosis, Facts | None]:
    judged = s.runtime.judges
    stalled = stall_diagnosis(s, rules) if "stalled" in judged else None
    if stalled is not None:
        return stalled, None
    f = facts if facts is not None else facts_of(s, rules)
    breaches = breaches_of(f)
    if not breaches:
        # The roofline is worth watching while healthy too (how close to the hardware).
        steady = rounded(roofline.evidence(f.roofline)) if f.roofline is not None else {}
        thin = _inconclusive(s)
        summary = (
            f"too few observations to judge {', '.join(thin)} while requests are in flight "
            f"({'; '.join(s.missing[k] for k in thin)})"
            if thin
            else ""
        )
        if s.counter_resets >= INCONSISTENT_RESETS:
            # Nothing can breach from counters that go back and forth: say why, so a
            # quiet verdict is not read as a healthy server.
            steady["counter_resets_in_window"] = s.counter_resets
            summary = f"counters inconsistent: {s.missing['generation_tokens_per_second']}"
        return Diagnosis(
            model_name=s.model_name,
            at=s.at,
            breaches=(),
            cause=None,
            summary=summary,
            evidence=steady,
            inconclusive=thin,
        ), f
    th = rules.thresholds
    causes: list[Cause] = [c for c in SYMPTOM_CAUSES if c in judged]
    checks = {cause: checks_of(cause, f, th) for cause in causes}
    candidates: list[Cause] = [cause for cause in causes if checks[cause][0]]
    if not candidates:
        # Every breach maps to a cause above; this only guards against a future symptom
        # without one. Fall back on the symptom itself rather than staying silent.
        fallback: Cause = "decode_bound" if f.itl_breach else "queue_bound"
        candidates = [fallback] if fallback in judged else []
    if not candidates:
        return _unjudged(s, breaches), f
    present: list[Cause] = [
        c for c in causes if c in candidates or is_present(c, f, checks[c], rules)
    ]
    cause = keep if keep in present and keep in SYMPTOM_CAUSES else candidates[0]
    confidence: dict[Cause, float] = {c: confidence_of(checks[c]) for c in present}
    summary, limit = prose.summary(cause, s, f, rules)
    evidence = evidence_of(s, f, rules)
    evidence["breaches"] = ",".join(breaches)
    if cause != candidates[0]:
        evidence["leading_cause"] = candidates[0]
    # An engine with fixes of its own (its spec's, in its own settings) takes them as they
    # are: the rulebook's reorderings and kinds name vLLM's flags.
    own = s.runtime.fixes(cause)
    remediation = own or rules.remediation.get(cause, ())
    if cause == "prefill_bound" and frontend_bound(f):
        # TTFT spent before the engine sees the request: the frontend's fixes first.
        evidence["ttft_bound_by"] = "render"
        if not own:
            remediation = (*rules.kind_remediation.get("render", ()), *remediation)
    if limit is not None:
        evidence.update(decode_evidence(limit, f.roofline, s.dram_active_mean, th))
        if not own:
            remediation = decode_remediation(limit, f.roofline, rules, remediation)
    evidence.update(engine_evidence(s))
    uneven = explaining(s, cause)
    if uneven is not None:
        # One engine holds the queue (or the full pool): the balancer's fixes come first,
        # capacity's after them.
        summary = f"{summary}; {uneven.sentence()}"
        if not own:
            remediation = (*rules.kind_remediation.get("dp_imbalance", ()), *remediation)
    contributing = _contributing(
        primary=cause, present=present, confidence=confidence, s=s, f=f, rules=rules
    )
    queue = predict.queue_state(s)
    evidence.update(predict.queue_evidence(queue))
    hw = rules.roofline
    if hw is None and rules.ceiling is not None:
        hw = roofline.weights_only(rules.ceiling)
    effects = predict.effects(
        remediation, s, cause=cause, breaches=breaches, roofline=f.roofline, hw=hw, queue=queue
    )
    return Diagnosis(
        model_name=s.model_name,
        at=s.at,
        breaches=breaches,
        cause=cause,
        confidence=confidence[cause],
        summary=summary,
        evidence=evidence,
        secondary=tuple(c.cause for c in contributing),
        remediation=remediation,
        contributing=contributing,
        present=tuple(present),
        remediation_effects=effects,
    ), f
