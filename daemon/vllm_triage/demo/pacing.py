"""The live demo's pace: slower when the host cannot keep up, and honest when even that
is not enough.

The live demo plays a scenario at ``--speed`` times real time in one process: the
simulator, the daemon scraping it and the receiver. On a busy host (other jobs, an
inference server beside it) that process gets less than it needs, and it shows: the
daemon skips scrapes (the previous one still running), scrapes answer late or fail, the
simulator falls behind its clock. A scrape answered a quarter of a wall second late at
20x is five simulated seconds off, a whole scrape interval: rates and windows are then
measured at the wrong times, and the diagnosis can go wrong for reasons that are the
host's, not the daemon's.

So the demo counts those signs (``Strain``) and, when new ones show once the last change
of pace has settled, halves the speed of the scenario's clock (``simulator.serve.Pace``),
down to ``SLOWEST`` of the speed asked for (``Pacer``). What the daemon judges stays in
the scenario's seconds at any speed: its clock is that same pace, and it still scrapes
every 5 of those seconds (the demo lengthens its wall interval to match), so windows,
timings and the incident counts (``open_after`` evaluations) are those of the scenario.
If the scenario does not then come out as built on a host that showed strain, the
verdict is that the host was too slow, never that the diagnosis was wrong.

Pure: totals in, decisions out; the demo reads the totals and applies the decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_triage.core.counts import counted

#: The slowest the demo goes, as a share of the speed asked for: slower than that it
#: would no longer be a demo of a minute or two (the tour at 20x takes about a minute).
SLOWEST = 1 / 8
#: After a change of pace, strain counts again only once this many scrape ticks have
#: come at the new pace: what was already queued is not news.
SETTLE_TICKS = 4
#: A scrape that took longer than this share of the scrape interval, in the scenario's
#: seconds, is late: its time stamp and what it read are that far apart.
LATE_SHARE = 0.5


@dataclass(slots=True)
class Strain:
    """Signs, as totals since the demo began, that the host could not keep up."""

    #: Scrape ticks the daemon skipped because the previous scrape was still running.
    skipped: int = 0
    #: Scrape ticks in all: scrapes taken plus skipped.
    ticks: int = 0
    #: Scrapes that took longer than ``LATE_SHARE`` of an interval (scenario seconds).
    late: int = 0
    #: Scrapes of the simulator that failed (a timeout, mostly: it is on this host).
    failed: int = 0
    #: The simulator's pacing steps that could not simulate as fast as its clock ran.
    behind: int = 0

    @property
    def shown(self) -> bool:
        return bool(self.skipped or self.late or self.failed or self.behind)

    def news(self, before: Strain) -> bool:
        """Whether any sign grew since ``before``."""
        return (
            self.skipped > before.skipped
            or self.late > before.late
            or self.failed > before.failed
            or self.behind > before.behind
        )

    def said(self) -> str:
        """``N of M scrapes skipped``, and the other signs that showed."""
        parts = [f"{self.skipped} of {counted(self.ticks, 'scrape')} skipped"]
        if self.late:
            parts.append(f"{counted(self.late, 'scrape')} answered late")
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.behind:
            parts.append(f"the simulator fell behind {counted(self.behind, 'time')}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Slowdown:
    """The pace lowered to ``speed`` when the scenario was ``at`` seconds in, on the
    strain seen by then."""

    at: float
    speed: float
    strain: Strain


@dataclass
class Pacer:
    """The speed the demo should run at, from the strain it has seen so far.

    ``observe`` is given the totals every few tenths of a second; it returns the new
    speed when the pace should drop (and remembers it), else None.
    """

    asked: float
    slowest: float = SLOWEST
    speed: float = 0.0
    slowdowns: list[Slowdown] = field(default_factory=list)
    #: Times new strain showed when the pace was already as slow as it goes.
    at_slowest: int = 0
    _seen: Strain = field(default_factory=Strain)
    #: The first ticks are the start's (imports, first reads): they settle too.
    _settled_at_tick: int = SETTLE_TICKS

    def __post_init__(self) -> None:
        self.speed = self.speed or self.asked

    @property
    def floor(self) -> float:
        return self.asked * self.slowest

    def observe(self, at: float, now: Strain) -> float | None:
        news = now.news(self._seen)
        self._seen = Strain(now.skipped, now.ticks, now.late, now.failed, now.behind)
        if not news or now.ticks < self._settled_at_tick:
            return None
        if self.speed <= self.floor:
            self.at_slowest += 1
            return None
        self.speed = max(self.speed / 2, self.floor)
        self.slowdowns.append(Slowdown(at, self.speed, self._seen))
        self._settled_at_tick = now.ticks + SETTLE_TICKS
        return self.speed

    def said(self) -> str:
        """How the pace changed, for people; empty when it never did."""
        if not self.slowdowns:
            return ""
        first = self.slowdowns[0]
        share = self.asked / self.speed
        return (
            f"the host could not keep up at {self.asked:g}x, so the demo slowed the "
            f"scenario's clock to {self.speed:g}x ({share:g} times slower than asked, from "
            f"{first.at:.0f} s into the scenario on); what was judged stays in the "
            "scenario's seconds"
        )
