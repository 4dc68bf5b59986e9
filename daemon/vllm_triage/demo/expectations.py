"""Did the diagnosis say what a scenario was built to show? The demo's self-check.

A scenario's phases say what they are built to make the diagnosis say (``expect:`` in
``rules/scenarios/*.yaml``: a cause, or ``healthy``). The check maps every firing and
resolve to the phase that was playing when it happened, by time, and asks of each fault
(consecutive phases with the same cause, plus the healthy phases after them, where its
incident may resolve):

- that its *first* firing is its own cause (the diagnosis named the right cause first);
- that nothing else fires, and its own cause fires once (no other cause, no flapping);
- that its incident has resolved before the next fault begins (or by the end of the run).

Nothing may fire before the first fault. Each problem is one sentence saying what
happened and when, so a failed demo tells exactly what went wrong.

Pure: events in, problems out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from vllm_triage.simulator import Scenario

HEALTHY = "healthy"


@dataclass(frozen=True, slots=True)
class Event:
    """An incident transition as the check sees it: seconds since the scenario began."""

    at: float
    event: Literal["firing", "resolved"]
    cause: str


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of the scenario judged as one: a fault with the healthy time after it, or
    the healthy lead-in before the first fault."""

    expect: str
    start: float
    end: float
    label: str
    #: Healthy time follows the fault inside the segment: its incident must resolve there.
    heals: bool = False

    def holds(self, at: float) -> bool:
        return self.start <= at < self.end

    def describe(self) -> str:
        end = "the end" if math.isinf(self.end) else f"{self.end:.0f} s"
        what = "the healthy start" if self.expect == HEALTHY else f"the {self.expect} phase"
        return f"{what} ({self.start:.0f} s to {end})"


def segments(scenario: Scenario, *, default: str | None = None) -> list[Segment]:
    """The scenario's segments, from its phases' ``expect``.

    A scenario whose phases state nothing is one segment expecting ``default`` (a bundled
    single-cause scenario's cause, or ``healthy``); ``None`` when nothing is known.
    """
    if all(p.expect is None for p in scenario.phases):
        if default is None:
            return []
        return [Segment(default, 0.0, math.inf, scenario.phases[0].label)]
    out: list[Segment] = []
    start = 0.0
    for phase in scenario.phases:
        expect = phase.expect or HEALTHY
        last = out[-1] if out else None
        if last is not None and expect in (last.expect, HEALTHY):
            # The same fault going on, or the healthy time after it: one segment.
            heals = last.heals or (expect == HEALTHY and last.expect != HEALTHY)
            end = start + phase.duration_s
            out[-1] = Segment(last.expect, last.start, end, last.label, heals)
        else:
            out.append(Segment(expect, start, start + phase.duration_s, phase.label))
        start += phase.duration_s
    # The last segment goes on for as long as the run does (a held last phase).
    last = out[-1]
    out[-1] = Segment(last.expect, last.start, math.inf, last.label, last.heals)
    return out


def problems(
    segs: Sequence[Segment], events: Iterable[Event], *, still_firing: Sequence[str] = ()
) -> list[str]:
    """What went differently from the segments' expectations; empty when all is as built.

    ``still_firing``: the causes whose incidents were open when the run ended; a fault
    that the scenario ends on (no healthy time after it) may still be firing.
    """
    ordered = sorted(events, key=lambda e: (e.at, e.event != "resolved"))
    out: list[str] = []
    for i, seg in enumerate(segs):
        mine = [e for e in ordered if seg.holds(e.at)]
        fired = [e for e in mine if e.event == "firing"]
        where = seg.describe()
        if seg.expect == HEALTHY:
            out.extend(f"{e.cause} fired at {e.at:.0f} s during {where}" for e in fired)
            continue
        if not fired:
            out.append(f"{seg.expect} never fired during {where}")
            continue
        first = fired[0]
        if first.cause != seg.expect:
            out.append(
                f"the first firing during {where} was {first.cause} at {first.at:.0f} s, "
                f"not {seg.expect}"
            )
        seen = {first.cause}
        for e in fired[1:]:
            if e.cause in seen:
                out.append(f"{e.cause} fired again at {e.at:.0f} s during {where}")
            elif e.cause == seg.expect:
                out.append(f"{e.cause} fired only at {e.at:.0f} s, after {first.cause}")
            else:
                out.append(f"{e.cause} also fired at {e.at:.0f} s during {where}")
            seen.add(e.cause)
        nxt = segs[i + 1] if i + 1 < len(segs) else None
        resolved = [e for e in mine if e.event == "resolved" and e.cause == seg.expect]
        if nxt is not None and first.cause == seg.expect and not resolved:
            out.append(f"{seg.expect} was still firing when {nxt.describe()} began")
    final = segs[-1] if segs else None
    for cause in still_firing:
        if final is None or final.heals or cause != final.expect:
            out.append(f"{cause} was still firing when the run ended")
    return out
