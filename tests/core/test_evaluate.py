"""Tests for daemon/vllm_triage/core/evaluate.py: the core's entry point, per target (how the
settings become its rulebook and counts: tests/runtime/config/test_rulebook.py)."""

from __future__ import annotations

import dataclasses

import pytest

from vllm_triage.core.diagnose import diagnose
from vllm_triage.core.evaluate import Evaluator
from vllm_triage.core.incidents import State, TrackRecord
from vllm_triage.core.model import ModelSeries, Snapshot

from support.diagnosis import q, rules, signals
from support.physics import A10G_70B
from support.rulebooks import default_evaluator, default_rulebook
from support.snapshots import hist


def two_models(at: float, waiting_a: float, total_b: float) -> Snapshot:
    return Snapshot(
        at=at,
        era="v1",
        prefix="vllm:",
        models={
            "a": ModelSeries(model_name="a", waiting=waiting_a, running=4.0, kv_usage=0.1),
            "b": ModelSeries(model_name="b", waiting=0.0, ttft=hist([0] * 10 + [total_b])),
        },
    )


class TestEvaluator:
    def test_models_are_diagnosed_apart(self) -> None:
        """Two models on one target: one queues, the other is healthy; only one fires."""
        ev = default_evaluator()
        fired = []
        for i in range(6):
            fired += ev.step(two_models(i * 5.0, waiting_a=10.0, total_b=0.0)).transitions
        assert [(t.model_name, t.cause) for t in fired] == [("a", "queue_bound")]

    def test_out_of_order_snapshot_is_not_evaluated(self) -> None:
        """A snapshot older than the last one is refused and changes nothing."""
        ev = default_evaluator()
        assert ev.step(two_models(10.0, 0.0, 0.0)).accepted
        late = ev.step(two_models(5.0, 50.0, 0.0))
        assert not late.accepted and late.diagnoses == {}

    def test_problems_pass_through(self) -> None:
        """A snapshot's problems are handed on with its evaluation, for the shell to log."""
        ev = default_evaluator()
        snap = Snapshot(at=1.0, era="v1", prefix="vllm:", models={}, problems=("x: left out",))
        assert ev.step(snap).problems == ("x: left out",)


def no_data(at: float) -> Snapshot:
    """A scrape in which model "a" exposes nothing yet: nothing can breach."""
    return Snapshot(at=at, era="v1", prefix="vllm:", models={"a": ModelSeries(model_name="a")})


FIRING_A = TrackRecord(
    model_name="a", state=State.FIRING, run=0, cause="queue_bound", started_at=0.0
)


class TestRestore:
    def test_a_young_window_does_not_resolve_a_restored_incident(self) -> None:
        """After a restart the window is empty: evaluations without data in the first
        window do not end the incident; after it, resolve_after clear ones do."""
        ev = Evaluator(default_rulebook(), window_seconds=60, resolve_after=3)
        ev.restore((FIRING_A,))
        resolved = [
            (at, t.event)
            for at in range(1000, 1100, 5)
            for t in ev.step(no_data(float(at))).transitions
        ]
        # Held for 60 s (to 1060), then three clear evaluations: 1060, 1065, 1070.
        assert resolved == [(1070, "resolved")]
        # Without the hold the first three empty evaluations would have ended it.
        plain = Evaluator(default_rulebook(), window_seconds=60, resolve_after=3)
        plain.incidents.restore((FIRING_A,))
        ends = [at for at in (0.0, 5.0, 10.0) for _ in plain.step(no_data(at)).transitions]
        assert ends == [10.0]

    def test_a_breach_counts_at_once_after_a_restore(self) -> None:
        """The hold is only against "not enough data": a breach right after the restart
        keeps a resolving incident firing, as it would have without the restart."""
        ev = Evaluator(default_rulebook(), window_seconds=60, resolve_after=3)
        ev.restore(
            (
                TrackRecord(
                    model_name="a",
                    state=State.RESOLVING,
                    run=2,
                    cause="queue_bound",
                    started_at=0.0,
                ),
            )
        )
        assert ev.step(two_models(1000.0, waiting_a=10.0, total_b=0.0)).transitions == []
        assert ev.incidents.state("a") is State.FIRING


def engine(at: float, tokens: float, *, waiting: float = 0.0, running: float = 8.0) -> Snapshot:
    """One model decoding: ``tokens`` generated so far, a TTFT histogram to match."""
    return Snapshot(
        at=at,
        era="v1",
        prefix="vllm:",
        models={
            "m": ModelSeries(
                model_name="m",
                running=running,
                waiting=waiting,
                kv_usage=0.2 + tokens / 1e7,
                generation_tokens=tokens,
                ttft=hist([tokens // 100] + [0] * 10),
            )
        },
    )


def run(ev: Evaluator, snaps: list[Snapshot]) -> list[tuple[str, str, float]]:
    out = []
    for s in snaps:
        out += [(t.event, t.cause, t.at) for t in ev.step(s).transitions]
    return out


class TestStalls:
    def test_a_hang_fires_stalled_alone_at_stall_after_and_resolves(self) -> None:
        """Tokens stop at 100 s with 8 requests running and 2 waiting (a queue frozen in the
        gauges, which alone would be queue_bound): stalled fires at 130 s, the default
        stall_after_seconds, and nothing else; it resolves once tokens flow again."""
        ev = default_evaluator()
        flowing = [engine(t, t * 50) for t in range(0, 100, 5)]
        hung = [engine(t, 5000, waiting=2.0) for t in range(100, 200, 5)]
        resumed = [engine(t, 5000 + (t - 200) * 50) for t in range(200, 300, 5)]
        assert run(ev, flowing + hung + resumed) == [
            ("firing", "stalled", 130),
            ("resolved", "stalled", 210),
        ]

    @pytest.mark.parametrize("open_after", [1, 3, 5])
    def test_late_and_skipped_scrapes_do_not_delay_the_stall(self, open_after: int) -> None:
        """An overloaded host (where hangs happen) scrapes late and skips: after the last
        token at 100 s (and the frozen queue's first sight at 101 s, the last change) the
        scrapes come 1 s, then 3 to 4 s apart. Counted in breached
        evaluations, the alert would come open_after of those gaps late; it fires at the
        first scrape 30 s (stall_after_seconds) after the last progress, whatever
        open_after is, and not one scrape earlier."""
        ev = default_evaluator(open_after=open_after)
        flowing = [engine(float(t), t * 50.0) for t in range(0, 101)]
        times = [101.0, 102.0, 105.5, 109.0, 112.4, 116.0, 119.7, 123.1, 126.6, 129.9, 133.4]
        hung = [engine(t, 5000.0, waiting=2.0) for t in [*times, 137.0, 140.5]]
        assert run(ev, flowing + hung) == [("firing", "stalled", 133.4)]

    def test_a_hang_does_not_resolve_the_incident_it_replaces(self) -> None:
        """A queue is firing when the engine hangs: the frozen stretch gives no verdict, so
        the queue's incident does not "resolve" as the hang begins; the stall takes its
        place as a changed cause."""
        ev = default_evaluator()
        queued = [engine(t, t * 50, waiting=5.0) for t in range(0, 100, 5)]
        hung = [engine(t, 5000, waiting=5.0) for t in range(100, 200, 5)]
        assert run(ev, queued + hung) == [
            ("firing", "queue_bound", 10),
            ("resolved", "queue_bound", 130),
            ("firing", "stalled", 130),
        ]
        assert ev.step(engine(200, 5000, waiting=5.0)).transitions == []

    def test_a_restart_is_not_a_stall(self) -> None:
        """Killed at 100 s, back at 300 s (no scrapes between), counters from zero and
        requests arriving: nothing fires."""
        ev = default_evaluator()
        before = [engine(t, t * 50) for t in range(0, 100, 5)]
        after = [engine(t, (t - 300) * 50) for t in range(300, 400, 5)]
        assert run(ev, before + after) == []

    def test_a_gap_with_frozen_counters_is_not_counted(self) -> None:
        """Scrapes stop for five minutes (the daemon was paused) on a server whose counters
        have not moved since: the gap is not time without progress."""
        ev = default_evaluator()
        snaps = [engine(t, 5000) for t in (0, 5, 10)] + [engine(t, 5000) for t in (310, 315)]
        assert run(ev, snaps) == []
        p = ev.step(engine(320, 5000)).signals["m"].progress
        assert p is not None and p.seconds_without_progress == 10.0

    def test_an_idle_server_is_not_stalled(self) -> None:
        ev = default_evaluator()
        assert run(ev, [engine(t, 5000, running=0.0) for t in range(0, 600, 5)]) == []


class TestJudge:
    """``Evaluator.judge``: signals windowed elsewhere (fleet mode), judged as ``step``
    judges the window's."""

    def test_same_transitions_as_step(self) -> None:
        """Fed the signals its own window gives, judge makes step's transitions."""
        stepped = default_evaluator()
        judged = default_evaluator()
        for i in range(8):
            at = i * 5.0
            e = stepped.step(two_models(at, waiting_a=10.0 if i < 5 else 0.0, total_b=0.0))
            j = judged.judge(at, e.signals)
            assert j.accepted and j.diagnoses == e.diagnoses
            assert j.transitions == e.transitions
        assert judged.incidents.export() == stepped.incidents.export()

    def test_a_time_not_after_the_last_is_refused(self) -> None:
        ev = default_evaluator()
        signals = ev.step(two_models(10.0, 0.0, 0.0)).signals
        assert ev.judge(15.0, signals).accepted
        late = ev.judge(15.0, signals, problems=("x",))
        assert not late.accepted and late.diagnoses == {} and late.problems == ("x",)

    def test_each_model_its_own_rulebook_and_provenance(self) -> None:
        """A model's rulebook (its card, its model) is used for it alone, and where its
        facts came from joins its evidence."""
        own = dataclasses.replace(
            rules(A10G_70B),
            provenance={"gpu_source": "dcgm (NVIDIA A10G)", "model_source": "model table"},
        )
        ev = default_evaluator()
        signals = default_evaluator().step(two_models(0.0, 0.0, 0.0)).signals
        j = ev.judge(0.0, signals, {"a": own})
        assert j.diagnoses["a"].evidence["gpu_source"] == "dcgm (NVIDIA A10G)"
        assert j.diagnoses["a"].evidence["model_source"] == "model table"
        assert "gpu_source" not in j.diagnoses["b"].evidence


class TestMeasurements:
    """``Evaluation.measurements``: every number the page and the report chart, measured
    once per evaluation from the published diagnosis, healthy or breached."""

    def test_a_breached_diagnosis_measures_what_its_evidence_says(self) -> None:
        """Every numeric evidence key (not text, not a flag) is measured as the evidence
        says it, and the charted signals nobody names in evidence join them."""
        queued = signals(waiting_mean=6.0, ttft_p50=q(2.0, 0.5), running_max=5.0)
        e = default_evaluator().judge(100.0, {"m": queued}, {"m": rules(A10G_70B)})
        d, measured = e.diagnoses["m"], e.measurements["m"]
        assert d.breached and d.cause not in (None, "stalled")
        numeric = {
            k: v
            for k, v in d.evidence.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        assert numeric and {k: measured[k] for k in numeric} == numeric
        assert "gpu" not in measured and "breaches" not in measured
        assert measured["ttft_p50_seconds"] == 2.0 and measured["requests_running_max"] == 5.0

    def test_a_healthy_evaluation_carries_the_derived_numbers(self) -> None:
        """Healthy, the diagnosis names no KV headroom, queue share or decode ceiling; the
        evaluation measures them all the same, as a breached one would say them."""
        decoding = signals(decode_tokens_per_second_per_stream=4.0)  # 93 % of the ceiling
        e = default_evaluator().judge(100.0, {"m": decoding}, {"m": rules(A10G_70B)})
        d, measured = e.diagnoses["m"], e.measurements["m"]
        assert not d.breached
        derived = (
            "kv_headroom_requests",
            "queue_share_of_ttft",
            "decode_ceiling_ratio",
            "decode_ceiling_tokens_per_second",
        )
        assert not set(derived) & set(d.evidence)
        assert measured["kv_headroom_requests"] == pytest.approx(
            100_000 * 0.75 / (0.2 * 100_000 / 4)
        )
        assert measured["queue_share_of_ttft"] == pytest.approx(0.01 / 0.1)
        assert measured["decode_ceiling_ratio"] == pytest.approx(4.0 / (600 / 140), rel=1e-5)
        assert measured["decode_ceiling_tokens_per_second"] == pytest.approx(600 / 140, rel=1e-5)
        queued = dataclasses.replace(decoding, waiting_mean=6.0)
        breached = diagnose(queued, rules(A10G_70B)).evidence
        assert {k: measured[k] for k in derived} == {k: breached[k] for k in derived}

    def test_what_the_signals_do_not_allow_is_absent(self) -> None:
        """No pool size, no queue times, no hardware: no headroom, share or ceiling, and
        never a 0 in their place."""
        bare = signals(kv_pool_tokens=None, queue_time_count=0.0)
        e = default_evaluator().judge(100.0, {"m": bare})
        measured = e.measurements["m"]
        assert "kv_headroom_requests" not in measured
        assert "queue_share_of_ttft" not in measured
        assert "decode_ceiling_ratio" not in measured
        assert measured["requests_running_mean"] == 4.0

    def test_an_out_of_order_evaluation_measures_nothing(self) -> None:
        ev = default_evaluator()
        ev.judge(100.0, {"m": signals()})
        assert ev.judge(100.0, {"m": signals()}).measurements == {}
