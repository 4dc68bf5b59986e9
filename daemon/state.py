"""What each target's watcher publishes, and what the read side (exporter, API, HTTP server,
demo view) reads: without importing the scrape loop.

The event loop replaces a target's ``view`` whole after each evaluation; the HTTP thread
reads it without a lock: swapping one reference is atomic, and a view is never mutated.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm_triage.core.evaluate import Evaluation
from vllm_triage.core.incidents import Active, State
from vllm_triage.core.model import Cause, Transition
from vllm_triage.core.rulebook import Ceiling
from vllm_triage.scrape.probe import ProbeStats
from vllm_triage.serve.history import History

RECENT_TRANSITIONS = 20


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
    recent: deque[Transition] = field(default_factory=lambda: deque(maxlen=RECENT_TRANSITIONS))
    #: The active probe's counts, when the target has one.
    probe: ProbeStats | None = None
    #: The last hour of evaluations, for the status page (bounded: ``vllm_triage.serve.history``).
    history: History | None = None

    def attempted(self, at: float, duration_s: float | None = None) -> None:
        """Count one scrape (or fleet step) taken at ``at``, whatever came of it."""
        self.scrapes += 1
        self.last_scrape_at = at
        if duration_s is not None:
            self.last_duration_s = duration_s
