"""What one ``whatif`` may cost, and what a window may claim before it is refused.

A recording is a peer's data: a live target (``--target``) or a file can say 1e12
requests waiting, or a first-token counter that jumps by 1e12, and a change can scale
the arrivals by 1e300. Simulated as said, each runs for ever and grows without bound.
So, before anything is simulated, a window that claims more than an engine could do is
refused with the reason (``implausible``), and so is a replay that would simulate more
requests than one run may (``requests``); while it runs, each replay's engine steps and
tokens are counted and the whole command's wall time is watched (``Budget.spend``).
The figures (docs/operations.md, "Bounds"):

- an engine holds at most ``MAX_RUNNING`` running and ``MAX_WAITING`` waiting requests,
  admits at most ``MAX_ARRIVALS_PER_SECOND`` (100 per millisecond), steps no faster than
  ``MIN_STEP_SECONDS``, and no request is longer than ``MAX_REQUEST_TOKENS`` (the longest
  context a model is served with);
- one replay simulates at most ``MAX_REQUESTS`` requests, ``MAX_STEPS`` engine steps and
  ``MAX_TOKENS`` tokens (the simulator runs about 30,000 steps or 500,000 tokens a second
  of CPU); the whole command at most ``MAX_SECONDS`` of wall time;
- a replay reads at most ``MAX_PHASES`` load intervals (the window's are merged beyond)
  and takes a scrape at most every ``MAX_REPLAY_INTERVAL`` seconds and at least
  ``MIN_REPLAY_INTERVAL`` apart (scrapes 1 ms apart would be 60,000 of them a minute);
  the window is at most ``MAX_WINDOW_SECONDS`` long.

Pure but for the clock the command hands ``Budget``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_triage.core.counts import counted
from vllm_triage.errors import RecordingError

MAX_RUNNING = 65_536
MAX_WAITING = 1_000_000
MAX_ARRIVALS_PER_SECOND = 100_000
MIN_STEP_SECONDS = 1e-4
MAX_REQUEST_TOKENS = 10 * 2**20

MAX_REQUESTS = 200_000
MAX_STEPS = 250_000
MAX_TOKENS = 8_000_000
MAX_SECONDS = 50.0

MAX_PHASES = 240
#: ``--target``: scrapes of one watched window (an hour at 5 s).
MAX_WATCH_SCRAPES = 720
MIN_REPLAY_INTERVAL = 0.25
MAX_REPLAY_INTERVAL = 15.0
MAX_WINDOW_SECONDS = 3600.0

#: The changes' own bounds (``whatif.changes``): a load at most this many times the
#: window's (or this small a share of it), at most this many replicas, and no more GPUs
#: per server than the largest NVLink domain of the card table (GB200 NVL72: 72 GPUs;
#: tensor parallelism across nodes is not modelled).
MAX_ARRIVAL_SCALE = 1000.0
MIN_ARRIVAL_SCALE = 0.001
MAX_REPLICAS = 10_000
MAX_TENSOR_PARALLEL = 72
MAX_NUM_SEQS = 16_384
MAX_NUM_BATCHED_TOKENS = 2**20


class BudgetError(RecordingError):
    """The window (or the change) would cost more than ``whatif`` may spend: refused,
    with the reason and what to do instead."""


def implausible(
    *,
    engines: int,
    running_max: float | None,
    waiting_max: float | None,
    arrivals_per_second: float,
    itl_mean: float | None,
    prompt_tokens: float | None,
    output_tokens: float | None,
    span_seconds: float,
) -> str | None:
    """Why a window claims more than its engines could do (None: it does not)."""
    n = max(1, engines)
    checks = (
        (running_max, MAX_RUNNING * n, "requests running"),
        (waiting_max, MAX_WAITING * n, "requests waiting"),
        (arrivals_per_second, MAX_ARRIVALS_PER_SECOND * n, "arrivals a second"),
        (prompt_tokens, MAX_REQUEST_TOKENS, "prompt tokens a request"),
        (output_tokens, MAX_REQUEST_TOKENS, "output tokens a request"),
    )
    for value, bound, what in checks:
        if value is not None and not value <= bound:  # NaN is implausible too
            return (
                f"{_g(value)} {what}, beyond what {_engines(n)} could hold or do "
                f"(at most {_g(bound)})"
            )
    if itl_mean is not None and not itl_mean >= MIN_STEP_SECONDS:
        return f"an engine step of {_g(itl_mean)} s, faster than any engine steps"
    if not 0 < span_seconds <= MAX_WINDOW_SECONDS:
        return (
            f"a window of {_g(span_seconds)} s; whatif replays at most "
            f"{MAX_WINDOW_SECONDS:g} s (a shorter window_seconds)"
        )
    return None


def _g(value: float) -> str:
    return f"{value:,.0f}" if math.isfinite(value) and abs(value) < 1e15 else f"{value:.3g}"


def _engines(n: int) -> str:
    return "one engine" if n == 1 else counted(n, "engine")


def merged(
    intervals: tuple[tuple[float, float], ...], limit: int = MAX_PHASES
) -> tuple[tuple[float, float], ...]:
    """At most ``limit`` (seconds, arrivals) intervals: neighbours summed in runs of equal
    length, so the window's arrivals are all kept and its burstiness at the coarser
    resolution. Scrapes 1 ms apart would make a phase (and a scrape) per millisecond."""
    if len(intervals) <= limit:
        return intervals
    size = math.ceil(len(intervals) / limit)
    out = []
    for start in range(0, len(intervals), size):
        run = intervals[start : start + size]
        out.append((sum(s for s, _ in run), sum(a for _, a in run)))
    return tuple(out)


def replay_interval(span_seconds: float, intervals: int) -> float:
    """The replay's scrape interval: the window's own, within the bounds."""
    own = span_seconds / intervals if intervals else 5.0
    return min(MAX_REPLAY_INTERVAL, max(MIN_REPLAY_INTERVAL, own))


@dataclass
class Budget:
    """What one ``whatif`` spends: each replay's steps and tokens, and the wall time
    since it began (``clock``: the command's; None: no wall-time bound)."""

    clock: Callable[[], float] | None = None
    max_seconds: float = MAX_SECONDS
    max_requests: int = MAX_REQUESTS
    max_steps: int = MAX_STEPS
    max_tokens: int = MAX_TOKENS
    replays: int = 0
    started: float | None = field(default=None)

    def __post_init__(self) -> None:
        if self.clock is not None and self.started is None:
            self.started = self.clock()

    def requests(self, expected: float, *, why: str) -> None:
        """A replay that would simulate ``expected`` requests: refused beyond the bound."""
        if not expected <= self.max_requests:
            raise BudgetError(
                f"refused: the replay would simulate {_g(expected)} requests ({why}), more "
                f"than whatif simulates in one run ({self.max_requests:,}); pick a shorter "
                "or quieter window (--at), or a smaller arrival_rate_scale"
            )

    def spend(self, *, steps: int, tokens: int) -> None:
        """What the replay under way has simulated so far: refused past a bound."""
        over = None
        if steps > self.max_steps:
            over = f"{steps:,} engine steps (at most {self.max_steps:,} a replay)"
        elif tokens > self.max_tokens:
            over = f"{tokens:,} tokens (at most {self.max_tokens:,} a replay)"
        elif self.clock is not None and self.started is not None:
            spent = self.clock() - self.started
            if spent > self.max_seconds:
                over = f"{spent:.0f} s of wall time (at most {self.max_seconds:g} s)"
        if over is not None:
            raise BudgetError(
                f"refused: the simulation ran past its budget: {over}, in replay "
                f"{self.replays} of the window; the window is too busy to simulate here: "
                "pick a shorter or quieter window (--at)"
            )
