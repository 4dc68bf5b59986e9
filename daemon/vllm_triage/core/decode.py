"""The decode split: which limit a decode-bound server hit, and the fixes in that order.

The decode step roofline (``vllm_triage.core.roofline``) sets the step's floor on the
card; the measured step over that floor says "at the hardware limit" or "below it: the
serving stack", and a floor longer than the step says the hardware or model settings
are wrong. Where DCGM measures the card's memory activity (fleet mode), a busy memory
interface is the hardware limit whatever the arithmetic says, and a disagreement is said
(``docs/physics.md``, "The decode roofline", "Measured memory activity"). Kept apart
from the other causes because only ``decode_bound`` has a second verdict to give.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_triage.core.model import EvidenceValue
from vllm_triage.core.roofline import sources
from vllm_triage.core.roofline import step as roofline
from vllm_triage.core.roofline.step import StepRoofline
from vllm_triage.core.rulebook import Rulebook, Thresholds

#: What each roofline term is, in the summary and a contributing cause's line.
TERM_WORDS = {
    "weights": "weight reads dominate",
    "kv": "KV cache reads dominate",
    "draft": "the draft model's reads dominate",
    "compute": "compute-bound: too many tokens per step",
}


#: What settles an unknown card: its name (bandwidth and compute from rules/gpus.yaml).
SETTLE_CARD = "set hardware.gpu (or hardware.memory_bandwidth_gb_s)"


@dataclass(frozen=True, slots=True)
class _Dram:
    """DCGM's measured memory activity against the roofline (``docs/physics.md``,
    "Measured memory activity"): a card busy reading memory is at its limit whatever the
    arithmetic estimates; ``agrees`` is False when the two tell different stories."""

    active: float
    busy: bool
    agrees: bool | None  # None: no roofline to compare with


def _dram(r: StepRoofline | None, active: float | None, th: Thresholds) -> _Dram | None:
    if active is None:
        return None
    busy = active >= th.dram_active_busy
    if r is None:
        return _Dram(active, busy, None)
    at_limit = th.near_ceiling_ratio <= r.ratio < th.roofline_impossible_ratio
    # A compute-bound step at its floor leaves the memory quiet: no contradiction.
    quiet = not busy and at_limit and r.bound_by == "compute"
    return _Dram(active, busy, busy == at_limit or quiet)


def decode_split(
    head: str, r: StepRoofline | None, rules: Rulebook, dram_active: float | None = None
) -> tuple[str, str]:
    """Which limit a decode-bound server hit, from its step roofline
    (``docs/physics.md``, "The decode roofline") and, where DCGM measures it, the card's
    memory activity: a busy memory interface is the hardware limit whatever the floor."""
    th = rules.thresholds
    dram = _dram(r, dram_active, th)
    measured = "" if dram is None else f"; DCGM: memory busy {dram.active:.0%} of cycles"
    if r is None:
        if dram is not None and dram.busy:
            return (
                head
                + measured
                + ": at the hardware limit (measured; no floor: no hardware or model set)",
                "hardware",
            )
        if rules.roofline is None:
            why = f"no hardware set: the decode step floor is unknown; {SETTLE_CARD}"
        else:
            why = f"the model's size is unknown: {sources.SETTLE_WEIGHTS}"
        return head + f" ({why})" + measured, "unknown"
    gb = [] if r.weight_bytes is None else [f"{r.weight_bytes / 1e9:.3g} GB weights"]
    if r.kv_bytes is not None:
        gb.append(f"{r.kv_bytes / 1e9:.3g} GB KV")
    if r.draft_bytes:
        gb.append(f"{r.draft_bytes / 1e9:.3g} GB draft")
    reads = " + ".join(gb)
    if r.bytes_from_vllm and r.vllm_bytes is not None:
        facts = f" (the facts: {reads})" if reads else ""
        reads = f"{r.vllm_bytes / 1e9:.3g} GB by vLLM's estimate{facts}"
    where = (
        f"; a decode step takes {r.step_seconds * 1e3:.3g} ms against a floor of "
        f"{r.floor_seconds * 1e3:.3g} ms on {r.gpu} ({r.ratio:.0%}, {r.bound_by}-bound, "
        f"{reads} per GPU per step)"
    )
    if r.left_out:
        where += "; left out: " + ", ".join(item.partition(":")[0] for item in r.left_out)
    where += measured
    if dram is not None and dram.busy and r.ratio < th.near_ceiling_ratio:
        return (
            head + where + ": at the hardware limit by measurement, though the floor is only "
            f"{r.ratio:.0%} of the step: the arithmetic misses reads (what it left out, or "
            "settings that undercount the bytes)",
            "hardware",
        )
    if r.ratio >= th.roofline_impossible_ratio:
        check = ", ".join(roofline.suspect_settings(r)[:3])
        if dram is not None and dram.busy:
            return (
                head + where + ": at the hardware limit by measurement; the floor is longer "
                f"than the step, so the hardware or model settings are wrong (check {check})",
                "hardware",
            )
        return (
            head + where + ": faster than the hardware allows, so the hardware or model "
            f"settings are wrong (check {check})",
            "unknown",
        )
    if r.lower_bound and r.ratio < th.near_ceiling_ratio:
        # The memory terms left out (compute and the batch size do not close a gap).
        terms = [i.partition(":")[0] for i in r.left_out if not i.startswith(("compute", "batch"))]
        return (
            head + where + f": {' and '.join(terms) or 'a term left out'} could close the gap, so "
            f"{r.ratio:.0%} is only a lower bound and the limit is unknown: "
            f"{r.gaps[0]}",
            "unknown",
        )
    if r.ratio >= th.near_ceiling_ratio:
        verdict = f": at the hardware limit, {TERM_WORDS[r.dominant]}"
        if dram is not None and dram.agrees is False:
            verdict += (
                f"; but the memory was busy only {dram.active:.0%} of cycles: the measurement "
                "and the arithmetic disagree (check the hardware and model settings)"
            )
        return head + where + verdict, "hardware"
    return (
        head + where + ": below it, the serving stack (per-step overhead, scheduling, "
        "prefill interference)",
        "serving_stack",
    )


def decode_evidence(
    limit: str, r: StepRoofline | None, dram_active: float | None, th: Thresholds
) -> dict[str, EvidenceValue]:
    """What decided the split, as evidence: the limit, DCGM's reading against the
    roofline, and which settings to check when the floor is impossible."""
    ev: dict[str, EvidenceValue] = {"decode_limit": limit}
    dram = _dram(r, dram_active, th)
    if dram is not None:
        ev["decode_dram_active_ratio"] = round(dram.active, 4)
        if dram.agrees is not None:
            ev["decode_dram_agrees_with_roofline"] = dram.agrees
    if r is not None and limit == "unknown" and r.ratio >= th.roofline_impossible_ratio:
        ev["decode_settings_suspect"] = ", ".join(roofline.suspect_settings(r))
    return ev


def decode_remediation(
    limit: str, r: StepRoofline | None, rules: Rulebook, generic: tuple[str, ...]
) -> tuple[str, ...]:
    """The decode fixes in the order the roofline says: the binding term's first at the
    limit, the serving stack's below it, the settings when the floor is impossible; the
    cause's own when the limit is unknown for want of a fact."""
    texts = rules.decode_remediation
    th = rules.thresholds
    if r is None or not texts or (limit == "unknown" and r.ratio < th.roofline_impossible_ratio):
        # Below the ceiling the hardware is not the first thing to change.
        return generic[2:] + generic[:2] if limit == "serving_stack" else generic
    if limit == "hardware":
        order: tuple[str, ...] = roofline.terms_by_weight(r)
    elif limit == "serving_stack":
        order = ("serving_stack", r.dominant)
    else:
        order = ("settings",)
    picked = tuple(text for key in order for text in texts.get(key, ()))
    return picked or generic
