"""The flapping check: one incident per episode, and a cause that changes only when the
evidence does (``docs/physics.md``, "When an incident changes cause").

Over everything we have: every bundled scenario, every committed recording of a real
vLLM, and long steady simulated loads near each cut-off (two causes at once, KV at the
edge of pressure, a queue at the edge of its cap), which must hold still; and the
opposite, a real change of cause (the tour's phases, a queue that turns into KV pressure
in one incident), which must still move promptly.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import structlog.testing
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.assemble import build_evaluator, build_rulebook, build_scraped
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import TargetSettings
from vllm_triage.core.diagnose import diagnose
from vllm_triage.core.evaluate import Evaluation
from vllm_triage.core.model import Cause, Diagnosis, Transition
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.demo.offline import scenario_facts, scenario_settings
from vllm_triage.recording.replay import replay
from vllm_triage.rules import runtime_table
from vllm_triage.serve.api import target_json
from vllm_triage.serve.exporter import build_registry
from vllm_triage.simulator import get_scenario
from vllm_triage.simulator.scenario_files import scenario_names

from support.clirun import vllm_triage
from support.paths import REALVLLM, RECORDINGS, ROOT, SCENARIO_FIXTURES
from support.scenarios import offline_run, recorded

SCENARIOS = SCENARIO_FIXTURES
CPU = REALVLLM / "triage-cpu.yaml"
STALL = REALVLLM / "triage-stall.yaml"
START_AT = 1_767_225_600.0
INTERVAL = 5.0


@dataclass(frozen=True, slots=True)
class Run:
    """Every evaluation of one model: what led it, what was published, what moved."""

    at: list[float]
    leading: list[Cause | None]
    published: list[Diagnosis]
    transitions: list[Transition]

    def firings(self) -> list[Transition]:
        return [t for t in self.transitions if t.event == "firing"]

    def opened(self) -> list[Transition]:
        return [t for t in self.firings() if not t.continues]


def _collect(evaluations: list[Evaluation]) -> Run:
    run = Run([], [], [], [])
    for e in evaluations:
        for d in e.diagnoses.values():
            run.at.append(e.at)
            lead = d.evidence.get("leading_cause", d.cause)
            run.leading.append(lead if isinstance(lead, str) else None)  # type: ignore[arg-type]
            run.published.append(d)
        run.transitions.extend(e.transitions)
    return run


@functools.cache
def simulate(path: Path, duration_s: float) -> Run:
    """A scenario file, simulated and judged with its own settings (as the demo does);
    once per (file, duration) in a test session (several tests read the same run)."""
    scenario = get_scenario(str(path))
    settings = scenario_settings(scenario, None)
    rulebook = build_rulebook(settings)
    evaluator = build_evaluator(settings, rulebook)
    parser = SnapshotParser(runtime_table())
    evaluations = [
        evaluator.step(parser.parse(body, at))
        for at, body in recorded(
            scenario, start_at=START_AT, interval_s=INTERVAL, duration_s=duration_s
        )
    ]
    return _collect(evaluations)


def replayed(name: str, config: Path | None) -> Run:
    items = replay(RECORDINGS / name, build_evaluator(load_settings(config)))
    return _collect([i for i in items if isinstance(i, Evaluation)])


# ---- holding still -------------------------------------------------------------------


@pytest.mark.parametrize("name", scenario_names())
def test_every_bundled_scenario_fires_each_phase_once_and_never_changes_cause(name: str) -> None:
    """Each phase of every bundled scenario is one episode of one cause: the demo's own
    check (first firing its own cause, nothing else, no second firing), and no incident
    changes cause (the tour puts healthy time between its faults)."""
    run = offline_run(name, duration_s=960.0)
    assert run.problems == ()
    assert [t for t in run.transitions if t.continues] == []


#: Each committed recording of a real vLLM, with the settings it is replayed with, and
#: the episodes it holds: the causes that open an incident, in order.
RECORDED = [
    ("light", CPU, []),
    ("prefill", CPU, ["prefill_bound"]),
    ("decode", CPU, ["decode_bound"]),
    ("decode-ramp", CPU, ["decode_bound"]),
    ("queue", CPU, ["queue_bound"]),
    ("kv", CPU, ["kv_pressure"]),
    ("restart", STALL, []),
    ("stall", STALL, ["stalled"]),
    # Under the CPU suite's SLOs the stalled engine's recording is slow before the stop
    # and after the resume: a slow episode, the hang (its own episode), a slow one again.
    ("stall", CPU, ["decode_bound", "stalled", "decode_bound"]),
]


@pytest.mark.parametrize(
    ("name", "config", "episodes"),
    RECORDED,
    ids=[f"{n}-{c.stem}" for n, c, _ in RECORDED],
)
def test_every_recording_opens_one_incident_per_episode(
    name: str, config: Path, episodes: list[str]
) -> None:
    run = replayed(name, config)
    assert [t.cause for t in run.opened()] == episodes
    assert [t for t in run.transitions if t.continues] == []


@pytest.mark.parametrize("name", sorted(p.name for p in RECORDINGS.iterdir() if p.is_dir()))
def test_every_recording_under_the_defaults_never_reopens_a_cause(name: str) -> None:
    """With the default settings (not what the recordings were made for, so causes do
    fire), no cause opens twice and no incident changes cause more than once."""
    run = replayed(name, None)
    causes = [t.cause for t in run.opened()]
    assert len(causes) == len(set(causes)), causes
    assert len([t for t in run.transitions if t.continues]) <= 1


#: Fifteen steady minutes near each cut-off: (file, the primary cause).
STEADY = [
    ("steady_chat.yaml", "decode_bound"),
    ("kv_edge.yaml", "kv_pressure"),
    ("queue_edge.yaml", "queue_bound"),
]


@pytest.mark.parametrize(("file", "cause"), STEADY, ids=[s[0].split(".")[0] for s in STEADY])
def test_a_steady_load_holds_still(file: str, cause: str) -> None:
    """At most two firings in fifteen steady minutes (an opening and one change or one
    reopening, never a swap back and forth), the right primary cause at the end, and
    nothing at all moving once the load has settled (after the first five minutes)."""
    run = simulate(SCENARIOS / file, 900.0)
    assert 1 <= len(run.firings()) <= 2, [(t.at - START_AT, t.cause) for t in run.firings()]
    settled = START_AT + 300.0
    assert [t for t in run.firings() if t.at >= settled and t.continues] == []
    last = [d for d in run.published if d.cause is not None][-1]
    assert last.cause == cause


def test_two_causes_at_once_name_one_primary_and_the_other_contributing() -> None:
    """The steady chat load: every token slow *and* prefill spikes. Once settled, every
    published diagnosis is decode_bound with prefill_bound contributing (its share and
    one line of evidence), though the leading cause need not be the same each window."""
    run = simulate(SCENARIOS / "steady_chat.yaml", 900.0)
    settled = [d for at, d in zip(run.at, run.published, strict=True) if at >= START_AT + 300]
    assert {d.cause for d in settled} == {"decode_bound"}
    for d in settled:
        (c,) = d.contributing
        assert c.cause == "prefill_bound" and 0 < c.share < 0.5
        assert "prefill chunks" in c.evidence
        assert d.secondary == ("prefill_bound",)


def test_confidence_does_not_jitter_for_the_same_condition() -> None:
    """From one evaluation to the next of the same cause, the published confidence moves
    by at most 0.1, though a window's raw confidence jumps by a quarter or more when one
    of its checks flips at a cut-off (it does in these loads: checked too)."""
    for file, _ in STEADY:
        run = simulate(SCENARIOS / file, 900.0)
        steps = [
            (a.confidence, b.confidence)
            for a, b in zip(run.published, run.published[1:], strict=False)
            if a.cause is not None and a.cause == b.cause
        ]
        assert steps
        assert max(abs(x - y) for x, y in steps) <= 0.1, file


def test_the_raw_confidence_does_jitter_in_those_loads() -> None:
    """The check above is not empty: unsmoothed, the same loads' confidence jumps."""
    scenario = get_scenario(str(SCENARIOS / "steady_chat.yaml"))
    settings = scenario_settings(scenario, None)
    rulebook = build_rulebook(settings)
    evaluator = build_evaluator(settings, rulebook)
    parser = SnapshotParser(runtime_table())
    raw = []
    for at, body in recorded(scenario, start_at=START_AT, interval_s=INTERVAL, duration_s=600):
        e = evaluator.step(parser.parse(body, at))
        raw += [diagnose(s, rulebook).confidence for s in e.signals.values()]
    assert max(abs(x - y) for x, y in itertools.pairwise(raw)) >= 0.25


# ---- and still moving when the evidence does ------------------------------------------


def test_a_real_change_of_cause_changes_promptly_in_the_same_incident() -> None:
    """A queue over a sequence cap, then long documents that outgrow the KV pool: one
    incident that changes from queue_bound to kv_pressure (no resolve between, the same
    start), within twelve evaluations of the first one kv_pressure led."""
    run = simulate(SCENARIOS / "queue_then_kv.yaml", 450.0)
    assert [(t.event, t.cause, t.continues) for t in run.transitions] == [
        ("firing", "queue_bound", False),
        ("firing", "kv_pressure", True),
    ]
    opened, changed = run.transitions
    assert changed.started_at == opened.started_at
    assert changed.previous_cause == "queue_bound" and changed.identity_cause == "queue_bound"
    assert "queue_bound's symptoms" in changed.change
    first_led = run.at[run.leading.index("kv_pressure")]
    assert changed.at - first_led <= 12 * INTERVAL


def test_the_tour_changes_cause_at_every_phase() -> None:
    """The tour's four faults, each its own episode, in order: the damping that holds a
    steady load still does not hold back a new condition."""
    result = offline_run("tour", duration_s=960.0)
    opened = [t.cause for t in result.transitions if t.event == "firing"]
    assert opened == ["prefill_bound", "decode_bound", "queue_bound", "kv_pressure", "stalled"]
    assert result.problems == ()


def test_the_documented_example_is_what_replay_prints(tmp_path: Path) -> None:
    """The cause-change example of docs/operations.md, run as it says (its config, then simulate and
    replay, the installed command): every line it shows in full is a line replay prints."""
    doc = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Cause changes and contributing causes") :]
    config = re.search(r"cat > steady.yaml <<'YAML'\n(.*?)\nYAML\n", section, re.S)
    assert config is not None
    (tmp_path / "steady.yaml").write_text(config.group(1), encoding="utf-8")
    shown = section[section.index("```\n2026") + 4 : section.index("replayed 181 files")]
    scenario = str(SCENARIOS / "steady_chat.yaml")
    made = vllm_triage(
        "simulate",
        "--scenario",
        scenario,
        "--record",
        "steady",
        "--duration",
        "900",
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    out = vllm_triage("replay", "steady", "--config", "steady.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    printed = out.stdout.splitlines()
    whole = [line for line in shown.splitlines() if line and not line.endswith("...")]
    assert len(whole) >= 5
    for line in whole:
        assert line in printed, line
    for line in shown.splitlines():  # the shortened ones begin as printed
        if line.endswith("..."):
            assert any(p.startswith(line[:-3].rstrip(" ;,")) for p in printed), line
    assert "replayed 181 files (0 skipped): 2 transitions" in out.stderr + out.stdout


def test_a_cause_change_in_the_exports_and_the_api() -> None:
    """A real watcher fed the steady chat load (the scenario's card and model as a user
    would set them): one incident opened, one cause change counted, the contributing
    cause's share exported, and the API naming the incident's identity and the change."""
    scenario = get_scenario(str(SCENARIOS / "steady_chat.yaml"))
    settings = scenario_settings(scenario, None)
    target = TargetSettings.model_validate(
        {"name": "chat", "url": "http://127.0.0.1:1/metrics", **scenario_facts(scenario)}
    )
    watcher = build_scraped(settings, target, client=httpx.AsyncClient(), notifier=None).target
    parser = SnapshotParser(runtime_table())
    with structlog.testing.capture_logs() as logs:
        for at, body in recorded(scenario, start_at=START_AT, interval_s=INTERVAL, duration_s=600):
            watcher.state.attempted(at)
            watcher.consume(parser.parse(body, at))
    registry = build_registry(lambda: [watcher.state], lambda: [], process_metrics=False)
    text = generate_latest(registry).decode("utf-8")
    changes = [
        (s.labels["diagnosis"], s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "vllm_triage_incident_cause_changes_total"
    ]
    assert changes == [("decode_bound", 1.0)]
    opened = [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "vllm_triage_incidents_opened_total"
    ]
    assert [(s.labels["diagnosis"], s.value) for s in opened] == [("prefill_bound", 1.0)]
    shares = {
        s.labels["diagnosis"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "vllm_triage_contributing"
    }
    assert 0 < shares.pop("prefill_bound") < 0.5 and set(shares.values()) == {0.0}
    (model,) = target_json(watcher.state)["models"]
    assert model["diagnosis"] == "decode_bound"
    assert model["incident_opened_as"] == "prefill_bound"
    assert [c["cause"] for c in model["contributing"]] == ["prefill_bound"]
    changed = [e for e in logs if e.get("cause_changed_from") == "prefill_bound"]
    assert len(changed) == 1 and changed[0]["event"] == "incident_firing"
    assert changed[0]["opened_as"] == "prefill_bound" and "led for 24" in changed[0]["change"]
