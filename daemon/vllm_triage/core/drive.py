"""The one loop that runs the core over scrapes: a body in, a snapshot and an evaluation out.

Five places feed the core scraped bodies: the daemon's scrape loop, ``replay``, the
post-mortem report, ``check`` and the offline demo. They all come through a ``Driver``,
so a body the parser refuses reads the same everywhere (``Unusable``, with the reason a
metric counts it under), and a recording replays exactly as the daemon saw it live. The
scrape loop parses a few thousand lines at a time between awaits (``parse_steps``); the
others read a body whole (``Driver.feed``): the snapshot is the same either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Generator
from dataclasses import dataclass

from vllm_triage.core.evaluate import Evaluation, Evaluator
from vllm_triage.core.model import ProbeStatus, Snapshot
from vllm_triage.core.parse import ParseLimits, SnapshotParser, finish
from vllm_triage.core.runtime import RuntimeTable
from vllm_triage.errors import ParseError, TooCostlyError, UnjudgeableError


@dataclass(frozen=True, slots=True)
class Unusable:
    """A body the core could not read: ``reason`` is ``parse`` (not readable vLLM
    metrics), ``too_costly`` (refused whole by the parse limits) or ``evaluate`` (read,
    but judging it raised: ``UnjudgeableError``)."""

    at: float
    reason: str
    error: ParseError

    @property
    def message(self) -> str:
        return str(self.error)


@dataclass(frozen=True, slots=True)
class Fed:
    """A body read and judged: the snapshot it gave and the core's evaluation of it."""

    snapshot: Snapshot
    evaluation: Evaluation


def evaluate(
    evaluator: Evaluator, snapshot: Snapshot, probe: ProbeStatus | None = None
) -> Evaluation:
    """Judge a snapshot; ``probe`` is the active probe's state taken with the scrape (the
    core sees the probe as data, never the request)."""
    if probe is not None:
        snapshot = dataclasses.replace(snapshot, probe=probe)
    return evaluator.step(snapshot)


class Reader:
    """One target's parser: bodies in, snapshots (or why not) out. ``runtimes``: the
    engines it reads; ``named``: the one the target's settings name, if any."""

    def __init__(
        self, runtimes: RuntimeTable, limits: ParseLimits | None = None, *, named: str | None = None
    ) -> None:
        self.parser = SnapshotParser(runtimes, limits=limits, named=named)

    def parse_steps(
        self, body: bytes, at: float, *, keep: Collection[str] = ()
    ) -> Generator[None, None, Snapshot | Unusable]:
        """Parse ``body`` a step at a time (the caller may yield between steps); the
        snapshot, or why there is none. ``keep``: models read first when the body holds
        more than the limits allow (the ones already watched)."""
        try:
            snapshot: Snapshot = yield from self.parser.steps_bytes(body, at, keep=keep)
        except TooCostlyError as exc:
            return Unusable(at, "too_costly", exc)
        except ParseError as exc:
            return Unusable(at, "parse", exc)
        return snapshot

    def read(self, body: bytes, at: float) -> Snapshot | Unusable:
        """Parse ``body`` whole."""
        return finish(self.parse_steps(body, at))


class Driver(Reader):
    """A parser and an evaluator, driven one body at a time (``replay``, the report,
    ``check``, the offline demo; the daemon's scrape loop reads with a ``Reader`` and
    hands the snapshot to its target, which evaluates it)."""

    def __init__(
        self,
        evaluator: Evaluator,
        runtimes: RuntimeTable,
        limits: ParseLimits | None = None,
        *,
        named: str | None = None,
    ) -> None:
        super().__init__(runtimes, limits, named=named)
        self.evaluator = evaluator

    def feed(self, body: bytes, at: float) -> Fed | Unusable:
        """Parse ``body`` and judge it. A body whose data makes the core raise is that
        body's failure (``evaluate``), never the loop's: the next body is judged."""
        snapshot = self.read(body, at)
        if isinstance(snapshot, Unusable):
            return snapshot
        try:
            evaluation = evaluate(self.evaluator, snapshot)
        except Exception as exc:  # whatever a peer's data sets off (errors.py)
            return Unusable(at, "evaluate", UnjudgeableError.of(exc))
        return Fed(snapshot, evaluation)
