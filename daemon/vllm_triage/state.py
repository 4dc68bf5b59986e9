"""What each target publishes, and what the read side (exporter, API, status page, demo
view) reads: without importing the scrape loop, the probe's client or the notifier. The
probe (``ProbeStats``) and each receiver's queue (``ReceiverStats``) publish here too.

The event loop replaces a target's ``view`` whole after each evaluation; the HTTP thread
reads it without a lock: swapping one reference is atomic, and a view is never mutated.
The status page's memory (``History``: the last hour of evaluations per model, bounded)
is appended by the event loop and read by the HTTP thread under a lock both hold for
microseconds. A model that stops reporting is forgotten one ``history_seconds`` after its
last point; the README's "Status page" states the bound (``core.series`` says why).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from vllm_triage.core.evaluate import Evaluation
from vllm_triage.core.incidents import Active, State
from vllm_triage.core.model import Cause, Transition
from vllm_triage.core.rulebook import Ceiling
from vllm_triage.core.series import ChartPoints, Ring

RECENT_TRANSITIONS = 20

#: Why a scrape (or a fleet server's step) gave nothing to judge: a fixed set, so the
#: label ``reason`` of ``vllm_triage_scrape_failures_total`` is bounded whatever a peer
#: sends (docs/operations.md lists them); anything else is counted as ``other``.
FAILURE_REASONS: Mapping[str, str] = {
    "connect": "refused, unreachable, or the TLS handshake failed",
    "timeout": "no whole answer within the scrape timeout",
    "http_status": "an answer with a status other than 2xx",
    "http_error": "an answer that broke off or was not HTTP",
    "too_large": "a body over max_body_bytes, once decoded",
    "encoding": "a compression refused (stacked, or unknown)",
    "redirect": "a redirect to another origin, or too many",
    "parse": "not readable vLLM metrics",
    "too_costly": "more lines, or a longer line or label, than the parse limits allow",
    "evaluate": "read, but judging it raised (a bug its data found)",
    "absent": "fleet mode: no series for this server in the query API",
    "auth": "fleet mode: the query API's credentials could not be read (bearer_token_file)",
    "other": "anything else",
}


@dataclass(slots=True)
class ProbeStats:
    """What the exporter and the API show about a target's active probe
    (``scrape.probe`` writes it)."""

    url: str
    probes: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    last_seconds: float | None = None
    last_reason: str | None = None
    last_at: float | None = None
    unanswered_since: float | None = None
    in_flight: bool = False


@dataclass(slots=True)
class ReceiverStats:
    """What a receiver's delivery queue has done (``notify.delivery`` writes it)."""

    sent: int = 0
    retried: int = 0
    failed: int = 0
    dropped: int = 0
    last_error: str = ""
    last_success_at: float | None = None


@dataclass(frozen=True, slots=True)
class StoreStatus:
    """What the exporter and the API say about the state store (``store.StateStore``)."""

    path: str
    #: False while writes fail and the state is kept in memory only.
    durable: bool
    error: str
    write_failures: int


class ReceiverView(Protocol):
    """What the read side shows of a receiver's delivery queue."""

    @property
    def name(self) -> str: ...

    @property
    def stats(self) -> ReceiverStats: ...

    @property
    def pending(self) -> int: ...


class History:
    """One target's rings, one per model, each ``capacity`` points long.

    ``step_seconds`` (fleet mode: ``prometheus.history_step_seconds``) keeps one point per
    step instead of one per evaluation: each point is the last evaluation of its step
    (the step ending at a multiple of it), its cause the last one diagnosed in it. With a
    60 s window and a 60 s step the points' windows tile the hour: nothing measured is
    skipped, only drawn coarser, at a quarter of the memory of a 15 s interval."""

    def __init__(
        self,
        keys: Iterable[str],
        *,
        capacity: int,
        keep_seconds: float,
        settings_values: Mapping[str, float] | None = None,
        step_seconds: float = 0.0,
    ) -> None:
        self.keys = tuple(keys)
        #: The target's settings in force (SLOs, thresholds, ceiling), drawn as lines.
        #: Read-only where the assembly shares one copy between targets (``SharedParts``).
        self.settings_values: Mapping[str, float] = (
            settings_values
            if isinstance(settings_values, MappingProxyType)
            else dict(settings_values or {})
        )
        self.capacity = capacity
        self.keep_seconds = keep_seconds
        self.step_seconds = step_seconds
        self._rings: dict[str, Ring] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_interval(
        cls,
        keys: Iterable[str],
        *,
        history_seconds: float,
        interval_seconds: float,
        settings_values: Mapping[str, float] | None = None,
        step_seconds: float = 0.0,
    ) -> History:
        """An hour (``history_seconds``) of points at the interval, or at ``step_seconds``
        where that is longer (shorter: every evaluation is a point)."""
        step = step_seconds if step_seconds > interval_seconds else 0.0
        capacity = math.ceil(history_seconds / (step or interval_seconds)) + 1
        return cls(
            keys,
            capacity=capacity,
            keep_seconds=history_seconds,
            settings_values=settings_values,
            step_seconds=step,
        )

    def _slot(self, at: float) -> float:
        """The step an evaluation at ``at`` belongs to: the one ending at or after it."""
        return math.ceil(at / self.step_seconds)

    def record(self, evaluation: Evaluation) -> None:
        """Append one point per model the evaluation diagnosed: what it measured
        (``Evaluation.measurements``), the charted keys of it; with ``step_seconds``, a
        later evaluation of the same step replaces the point (``Ring.amend``)."""
        points = [
            (model, evaluation.measurements.get(model, {}), d.cause)
            for model, d in evaluation.diagnoses.items()
        ]
        at = evaluation.at
        with self._lock:
            for model, values, cause in points:
                ring = self._rings.get(model)
                if ring is None:
                    ring = self._rings[model] = Ring(self.keys, self.capacity)
                newest = ring.newest
                if (
                    self.step_seconds
                    and newest is not None
                    and self._slot(newest) == self._slot(at)
                ):
                    ring.amend(at, values, cause)
                else:
                    ring.append(at, values, cause)
            stale = at - self.keep_seconds
            for model in [m for m, r in self._rings.items() if (r.newest or 0.0) < stale]:
                del self._rings[model]

    def windows(self, since: float) -> dict[str, ChartPoints]:
        with self._lock:
            return {
                m: r.window(since, step=self.step_seconds) for m, r in sorted(self._rings.items())
            }

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(r.nbytes for r in self._rings.values())


@dataclass(frozen=True, slots=True)
class View:
    """The latest evaluation of a target and the incident state it left."""

    evaluation: Evaluation
    states: dict[str, State]
    active: tuple[Active, ...]
    #: Per model whose incident is resolving: consecutive clear evaluations so far, of
    #: ``resolve_after`` needed (the view shows "clearing, 2 of 3").
    clear_runs: Mapping[str, int] = field(default_factory=dict)
    resolve_after: int = 0
    #: Per model: the clear evaluations its incident needs (more than ``resolve_after``
    #: for one that reopened soon after its last resolve).
    resolve_needed: Mapping[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class RecordingStats:
    """What the daemon's own recording of a target's scrapes (``run --record``) did."""

    folder: str
    written: int = 0
    bytes_written: int = 0
    #: Bytes the folder already held when this process began (earlier runs': a daemon
    #: restarted, or crash-looping, must not write its whole bound again each time).
    bytes_found: int = 0
    #: Scrapes not kept, by reason: ``disk`` (a write failed), ``too_large`` (over the
    #: recording's per-file bound), ``full`` (the recording reached its ``max_bytes``).
    failures: Counter[str] = field(default_factory=Counter)


class Recent:
    """The last ``RECENT_TRANSITIONS`` transitions, oldest first. A tuple swapped whole on
    each append (an incident's transitions: rare), so a target without any holds no
    buffer (a bounded deque's is some 600 bytes: 6 MB at 10,000 servers), and a reader in
    another thread (the API, the status page) always sees a whole one."""

    __slots__ = ("_items", "maxlen")

    def __init__(self, items: Iterable[Transition] = (), maxlen: int = RECENT_TRANSITIONS) -> None:
        self.maxlen = maxlen
        self._items: tuple[Transition, ...] = tuple(items)[-maxlen:]

    def append(self, transition: Transition) -> None:
        self._items = (*self._items, transition)[-self.maxlen :]

    def extend(self, transitions: Iterable[Transition]) -> None:
        self._items = (*self._items, *transitions)[-self.maxlen :]

    def clear(self) -> None:
        self._items = ()

    def __iter__(self) -> Iterator[Transition]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(slots=True)
class TargetState:
    name: str
    url: str
    ceiling: Ceiling | None
    up: bool = False
    scrapes: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    skipped_ticks: int = 0
    series_problems: int = 0
    last_scrape_at: float | None = None
    last_success_at: float | None = None
    last_duration_s: float | None = None
    last_error: str = ""
    view: View | None = None
    incidents_opened: Counter[tuple[str, Cause]] = field(default_factory=Counter)
    #: Changes of cause inside an open incident, by (model, the cause it changed to).
    cause_changes: Counter[tuple[str, Cause]] = field(default_factory=Counter)
    #: Every transition so far (``recent`` keeps the last few of them).
    transitions: int = 0
    #: model_name values left out because the target exposed too many.
    models_dropped: int = 0
    #: Scrapes (fleet steps) timed before the last evaluation: the clock went back, and
    #: the window started again (``Target``).
    clock_steps_back: int = 0
    #: Fleet mode's query API only: servers beyond ``prometheus.max_servers`` now; the
    #: servers not judged at the last tick because their answers may miss data, by
    #: reason (``fleet.completeness``); answers that said they were partial, so far.
    servers_left_out: int | None = None
    cannot_tell: dict[str, int] | None = None
    partial_answers: int = 0
    recent: Recent = field(default_factory=Recent)
    #: The active probe's counts, when the target has one.
    probe: ProbeStats | None = None
    #: The last hour of evaluations, for the status page (bounded: ``History``).
    history: History | None = None
    #: The daemon's own recording of this target's scrapes, when ``run --record`` asks.
    recording: RecordingStats | None = None
    #: The serving engine its metrics show (``vllm``, ``sglang``: the ``runtime`` label),
    #: as people read it (``vLLM (Rust frontend)``), empty before the first scrape read;
    #: and how often it changed.
    runtime: str = ""
    runtime_shown: str = ""
    runtime_changes: int = 0

    def attempted(self, at: float, duration_s: float | None = None) -> None:
        """Count one scrape (or fleet step) taken at ``at``, whatever came of it."""
        self.scrapes += 1
        self.last_scrape_at = at
        if duration_s is not None:
            self.last_duration_s = duration_s
