"""vLLM as it is deployed: data-parallel engines judged one by one, sleeping engines,
stale gauges, a slow frontend, counters that reset inside a live process.

The scenarios are the simulator's (``tests/fixtures/scenarios/``, each header says the
physics it is built to show and what a correct diagnosis says); one recording is a real
vLLM's, with a second engine added whose series freeze.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_triage.assemble import build_evaluator
from vllm_triage.config.load import load_settings
from vllm_triage.core.evaluate import Evaluation
from vllm_triage.core.model import Transition
from vllm_triage.demo.offline import START_AT, run_scenario, scenario_settings
from vllm_triage.recording.files import recording_files
from vllm_triage.recording.replay import replay
from vllm_triage.simulator import get_scenario

HERE = Path(__file__).resolve().parent.parent
SCENARIOS = HERE / "fixtures" / "scenarios"
RECORDINGS = HERE / "fixtures" / "recordings"
REALVLLM = HERE / "system" / "realvllm"
INTERVAL = 5.0


def transitions(name: str, duration_s: float) -> list[Transition]:
    scenario = get_scenario(str(SCENARIOS / f"{name}.yaml"))
    run = run_scenario(
        str(SCENARIOS / f"{name}.yaml"),
        scenario_settings(scenario, None),
        duration_s=duration_s,
        interval_s=INTERVAL,
    )
    return run.transitions


def firings(ts: list[Transition]) -> list[tuple[float, str]]:
    return [(t.at - START_AT, t.cause) for t in ts if t.event == "firing"]


class TestOneEngineAmongSeveral:
    def test_one_hung_engine_of_two_stalls_the_server_and_is_named(self) -> None:
        """Engine 1 hangs at 240 s while engine 0 serves: the merged series keep moving,
        yet ``stalled`` fires within stall_after_seconds (30) and two evaluations, naming
        engine 1, and resolves once it moves again (the hang ends at 540 s)."""
        ts = transitions("dp_one_engine_hung", 660)
        [fired] = [t for t in ts if t.cause == "stalled" and t.event == "firing"]
        assert 240 < fired.at - START_AT <= 240 + 30 + 2 * INTERVAL
        ev = fired.diagnosis.evidence
        assert ev["stalled_engines"] == ("1",)
        assert ev["engines_stalled"] == "1 of 2 engines"
        assert ev["stall_kind"] == "hung"
        assert "engine 1 (1 of 2 engines)" in fired.diagnosis.summary
        [resolved] = [t for t in ts if t.cause == "stalled" and t.event == "resolved"]
        assert 540 < resolved.at - START_AT <= 540 + 3 * INTERVAL
        # Nothing before the hang: two healthy engines are not one stalled server.
        assert all(at > 240 for at, _ in firings(ts))
        # The window after the hang still holds the latencies of the requests that waited
        # on engine 1: they are the stall's, not judged as another cause until it passes.
        window = load_settings().window_seconds
        assert not [c for at, c in firings(ts) if resolved.at - START_AT <= at < 540 + window]

    def test_two_healthy_engines_fire_nothing(self) -> None:
        assert firings(transitions("dp_healthy", 420)) == []


def _with_second_engine(src: Path, out: Path, *, freeze_after_s: float, running: int) -> None:
    """A real vLLM recording with a second data-parallel engine: every engine series
    copied as ``engine="1"``, frozen from ``freeze_after_s`` (at that scrape's values,
    ``running`` requests in its gauge), while engine 0 keeps its real values."""
    out.mkdir()
    files = recording_files(src)
    start = files[0][0]
    frozen: list[str] | None = None
    for at, path in files:
        lines = path.read_text(encoding="utf-8").splitlines()
        engine1 = [ln.replace('engine="0"', 'engine="1"') for ln in lines if 'engine="0"' in ln]
        if at - start >= freeze_after_s:
            if frozen is None:
                frozen = [
                    re.sub(r"\} \S+$", f"}} {running}", ln)
                    if ln.startswith("vllm:num_requests_running{")
                    else ln
                    for ln in engine1
                ]
            engine1 = frozen
        (out / path.name).write_text("\n".join([*lines, *engine1]) + "\n", encoding="utf-8")


class TestARealRecordingWithASecondEngine:
    def test_a_frozen_second_engine_stalls_within_stall_after(self, tmp_path: Path) -> None:
        """vLLM 0.32's own scrapes (tests/fixtures/recordings/light), with a second engine
        whose every series freezes 10 s in with 23 requests running: ``stalled`` within
        stall_after_seconds and two evaluations (2 s apart here), naming engine 1."""
        rec = tmp_path / "rec"
        _with_second_engine(RECORDINGS / "light", rec, freeze_after_s=10, running=23)
        settings = load_settings(
            flags={"thresholds": {"stall_after_seconds": 20}, "window_seconds": 20}
        )
        start = recording_files(rec)[0][0]
        fired = [
            t
            for item in replay(rec, build_evaluator(settings))
            if isinstance(item, Evaluation)
            for t in item.transitions
            if t.event == "firing"
        ]
        assert [t.cause for t in fired] == ["stalled"]
        assert 10 < fired[0].at - start <= 10 + 20 + 2 * 2.0
        ev = fired[0].diagnosis.evidence
        assert ev["stalled_engines"] == ("1",)
        assert ev["requests_running"] == 23
        assert ev["engines_stalled"] == "1 of 2 engines"

    def test_the_same_two_engines_moving_fire_nothing(self, tmp_path: Path) -> None:
        rec = tmp_path / "rec"
        _with_second_engine(RECORDINGS / "light", rec, freeze_after_s=1e9, running=23)
        settings = load_settings(
            flags={"thresholds": {"stall_after_seconds": 20}, "window_seconds": 20}
        )
        items = list(replay(rec, build_evaluator(settings)))
        assert not [t for i in items if isinstance(i, Evaluation) for t in i.transitions]
        # Both engines are watched, neither stuck.
        last = next(i for i in reversed(items) if isinstance(i, Evaluation))
        [signals] = last.signals.values()
        assert signals.progress is not None
        assert set(signals.progress.engines_without) == {"0", "1"}


class TestKindsOfStall:
    def test_an_asleep_engine_with_requests_waiting_is_asleep_not_hung(self) -> None:
        """Engine 1 asleep (level 1) from 120 s while requests are still sent to it, its
        frozen gauges saying idle: the requests the API server took and did not finish say
        it owes work. ``stalled`` with stall_kind asleep, the wake-up fix first."""
        ts = transitions("dp_asleep_with_requests", 420)
        [fired] = [t for t in ts if t.event == "firing"]
        assert fired.cause == "stalled"
        assert 120 < fired.at - START_AT <= 120 + 30 + 2 * INTERVAL
        ev = fired.diagnosis.evidence
        assert ev["stall_kind"] == "asleep"
        assert ev["stalled_engines"] == ("1",)
        assert ev["engines_asleep"] == ("1:weights_offloaded",)
        assert float(ev["requests_owed_while_asleep"]) > 5  # type: ignore[arg-type]
        assert "wake it" in fired.diagnosis.remediation[0]
        assert "not a hang" in fired.diagnosis.summary

    def test_an_idle_sleeping_engine_fires_nothing(self) -> None:
        assert firings(transitions("dp_idle_asleep", 600)) == []

    def test_frozen_gauges_while_tokens_flow_are_stale_never_kv_or_queue(self) -> None:
        """After mass aborts at 120 s the gauges stay at ~115 running, 15 waiting, KV 99 %
        while a light load is served: ``stale_gauges``; no kv_pressure or queue_bound is
        fired from the frozen values after they froze (before, at the pool's edge, KV
        pressure was real)."""
        ts = transitions("stale_gauges_after_aborts", 420)
        after = [(at, c) for at, c in firings(ts) if at > 120]
        assert after and after[0][1] == "stalled"
        assert all(c not in ("kv_pressure", "queue_bound") for _, c in after)
        stale = next(t for t in ts if t.cause == "stalled" and t.event == "firing")
        assert stale.diagnosis.evidence["stall_kind"] == "stale_gauges"
        assert "stale" in stale.diagnosis.summary and "#22545" in stale.diagnosis.summary
        assert stale.at - START_AT <= 120 + 30 + 3 * INTERVAL

    def test_a_real_lockstep_decode_with_large_blocks_is_not_stale(self) -> None:
        """vLLM 0.32's CPU backend, 96 sequences decoding in lockstep with 128-token
        blocks: the KV usage steps every ~10 s while tokens flow. Still gauges for that
        long are blocks filling, not staleness: the decode recording fires decode_bound
        when it did before, nothing else."""
        evaluator = build_evaluator(load_settings())
        causes = [
            t.cause
            for i in replay(RECORDINGS / "decode", evaluator)
            if isinstance(i, Evaluation)
            for t in i.transitions
        ]
        assert causes == ["decode_bound"]


class TestTheFrontend:
    def test_a_ttft_spent_rendering_is_named_the_frontends(self) -> None:
        """One API-server process 96 % busy rendering long prompts: TTFT breaches with
        the queue empty, and most of it is render time. ``prefill_bound``, named as the
        frontend's, with the API-server fixes first."""
        ts = transitions("render_bound", 540)
        [fired] = [t for t in ts if t.event == "firing"]
        assert fired.cause == "prefill_bound"
        ev = fired.diagnosis.evidence
        assert ev["ttft_bound_by"] == "render"
        assert float(ev["render_share_of_ttft"]) >= 0.5  # type: ignore[arg-type]
        assert "API server" in fired.diagnosis.summary
        assert "--api-server-count" in fired.diagnosis.remediation[0]


class TestCountersAndApiServers:
    def test_a_counter_reset_inside_the_process_is_one_reset(self) -> None:
        """Elastic expert-parallel scale-up resets every counter in a live process: one
        reset counts from zero, as a restart's does; nothing fires."""
        assert firings(transitions("counter_reset_in_process", 480)) == []

    @pytest.mark.parametrize("servers", [1, 2, 4])
    def test_several_api_servers_read_as_one(self, servers: int, tmp_path: Path) -> None:
        """``--api-server-count N``: counters and histograms summed over the API servers,
        gauges the most recent one's; two healthy engines fire nothing whatever N is."""
        text = (SCENARIOS / "dp_healthy.yaml").read_text(encoding="utf-8")
        text = re.sub(
            r"(\n  data_parallel_size: \d+\n)", rf"\1  api_server_count: {servers}\n", text
        )
        path = tmp_path / "dp_api_servers.yaml"
        path.write_text(text, encoding="utf-8")
        scenario = get_scenario(str(path))
        run = run_scenario(
            str(path), scenario_settings(scenario, None), duration_s=300, interval_s=INTERVAL
        )
        assert firings(run.transitions) == []


def _with_idle_twin(src: Path, out: Path, *, even: bool) -> None:
    """A real vLLM recording with a second data-parallel engine that serves the same
    (its series copied as ``engine="1"``) but, unless ``even``, never has a request
    waiting: an uneven balancer that queues on engine 0 only."""
    out.mkdir()
    for _, path in recording_files(src):
        lines = path.read_text(encoding="utf-8").splitlines()
        twin = [ln.replace('engine="0"', 'engine="1"') for ln in lines if 'engine="0"' in ln]
        if not even:
            twin = [
                re.sub(r"\} \S+$", "} 0.0", ln)
                if ln.startswith("vllm:num_requests_waiting{")
                else ln
                for ln in twin
            ]
        (out / path.name).write_text("\n".join([*lines, *twin]) + "\n", encoding="utf-8")


def _first_firing(rec: Path) -> Transition:
    settings = load_settings(REALVLLM / "triage-cpu.yaml")
    return next(
        t
        for item in replay(rec, build_evaluator(settings))
        if isinstance(item, Evaluation)
        for t in item.transitions
        if t.event == "firing"
    )


class TestDataParallelBalance:
    def test_one_engine_holding_the_queue_is_named_with_the_balancers_fixes(
        self, tmp_path: Path
    ) -> None:
        """vLLM 0.32's queue-bound scrapes (16 requests on 4 seats) on engine 0, and a
        twin engine 1 with none waiting: queue_bound, and the evidence and summary say
        engine 0 carries the queue; the balancer's fixes come first."""
        rec = tmp_path / "rec"
        _with_idle_twin(RECORDINGS / "queue", rec, even=False)
        fired = _first_firing(rec)
        assert fired.cause == "queue_bound"
        ev = fired.diagnosis.evidence
        waiting = dict(item.split(": ") for item in ev["engines_waiting_mean"])  # type: ignore[union-attr]
        assert set(waiting) == {"0", "1"} and float(waiting["1"]) == 0.0
        assert float(waiting["0"]) >= 2.0
        assert "engine 0 of 2 carries it" in str(ev["engine_imbalance"])
        assert "engine 0 of 2 carries it" in fired.diagnosis.summary
        assert fired.diagnosis.remediation[0].startswith("One data-parallel engine holds")

    def test_an_even_queue_is_capacity_not_balance(self, tmp_path: Path) -> None:
        rec = tmp_path / "rec"
        _with_idle_twin(RECORDINGS / "queue", rec, even=True)
        fired = _first_firing(rec)
        assert fired.cause == "queue_bound"
        assert "engine_imbalance" not in fired.diagnosis.evidence
        assert "engines_waiting_mean" in fired.diagnosis.evidence
        assert not fired.diagnosis.remediation[0].startswith("One data-parallel engine")
