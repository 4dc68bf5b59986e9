"""The core's single entry point: one target's snapshots in, diagnoses and transitions out.

``run``, ``replay`` and the tests all drive the core through ``Evaluator.step``, so a
recording replays exactly as it ran live.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from daemon.core.diagnose import diagnose
from daemon.core.incidents import IncidentTracker
from daemon.core.model import Diagnosis, Signals, Snapshot, Transition
from daemon.core.rulebook import Rulebook
from daemon.core.window import Window


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The outcome of one snapshot. ``accepted`` is False for an out-of-order snapshot."""

    at: float
    accepted: bool
    signals: dict[str, Signals] = field(default_factory=dict)
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict)
    transitions: list[Transition] = field(default_factory=list)
    problems: tuple[str, ...] = ()


class Evaluator:
    """Window, classifier and incident tracker for one target."""

    def __init__(
        self,
        rulebook: Rulebook,
        *,
        window_seconds: float = 60.0,
        open_after: int = 3,
        resolve_after: int = 3,
    ) -> None:
        self.rulebook = rulebook
        self.window = Window(window_seconds, min_observations=rulebook.thresholds.min_observations)
        self.incidents = IncidentTracker(open_after=open_after, resolve_after=resolve_after)

    def step(self, snapshot: Snapshot) -> Evaluation:
        if not self.window.push(snapshot):
            return Evaluation(at=snapshot.at, accepted=False, problems=snapshot.problems)
        signals: dict[str, Signals] = {}
        diagnoses: dict[str, Diagnosis] = {}
        transitions: list[Transition] = []
        for model in self.window.models():
            s = self.window.signals(model)
            d = diagnose(s, self.rulebook, open_after=self.incidents.open_after)
            signals[model], diagnoses[model] = s, d
            if not d.held:
                transitions.extend(self.incidents.observe(d))
        self.incidents.forget_clear(set(diagnoses))
        return Evaluation(
            at=snapshot.at,
            accepted=True,
            signals=signals,
            diagnoses=diagnoses,
            transitions=transitions,
            problems=snapshot.problems,
        )
