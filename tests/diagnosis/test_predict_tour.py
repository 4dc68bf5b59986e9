"""The tour's alerts: every fix carries its predicted effect, or says why it has none, and
the messages a person reads stay short."""

from __future__ import annotations

from vllm_triage.core.alerts import SLACK_MAX_CHARS, firing_alert, slack_payload
from vllm_triage.core.predict import effect_text
from vllm_triage.core.report import transition_dict, transition_text

from support.scenarios import offline_run


def _firings() -> list:  # type: ignore[type-arg]
    # The duration test_flapping uses: one simulation of the tour per test process.
    run = offline_run("tour", duration_s=960.0)
    firing = [t for t in run.transitions if t.event == "firing"]
    assert {t.cause for t in firing} >= {"prefill_bound", "decode_bound", "queue_bound"}
    return firing


def test_every_fix_has_an_effect_or_a_reason() -> None:
    for t in _firings():
        d = t.diagnosis
        assert len(d.remediation_effects) == len(d.remediation), t.cause
        for fix, e in zip(d.remediation, d.remediation_effects, strict=True):
            assert e.fix == fix
            assert (e.predicted is not None) != bool(e.why), (t.cause, e)
            if e.predicted is not None:
                assert e.change, e
                assert e.low is not None and e.high is not None
                assert e.low <= e.predicted <= e.high
        out = transition_dict(t)
        assert [x["fix"] for x in out["remediation_effects"]] == list(d.remediation)


def test_the_tours_physics_gives_numbers_where_it_can() -> None:
    """Decode at the hardware limit: quantizing and spreading the weights are predicted to
    shorten the step; the queue: more seats or replicas, predicted to shorten TTFT."""
    by_cause = {t.cause: t.diagnosis for t in _firings()}
    decode = {e.change.get("dtype"): e for e in by_cause["decode_bound"].remediation_effects}
    fp8 = decode["fp8"]
    assert fp8.step_now is not None and fp8.step_predicted is not None
    assert fp8.step_predicted < fp8.step_now
    queue = [e for e in by_cause["queue_bound"].remediation_effects if e.predicted is not None]
    assert queue, by_cause["queue_bound"].remediation_effects
    for e in queue:
        assert e.now is not None and e.predicted < e.now
    assert by_cause["queue_bound"].evidence["queue_regime"] in ("backlogged", "overloaded")


def test_alerts_carry_one_line_per_fix_and_slack_stays_short() -> None:
    for t in _firings():
        alert = firing_alert(t, target="tour", severity="warning", external_url="http://x")
        predicted = [e for e in t.diagnosis.remediation_effects if e.predicted is not None]
        lines = alert.annotations.get("predicted_effects", "").splitlines()
        # Only the fixes with a prediction: never a list of "no prediction" lines.
        assert lines == [f"- {effect_text(e)}" for e in predicted]
        assert not any("no prediction" in line for line in lines)
        text = slack_payload(alert)["text"]
        assert len(text) <= SLACK_MAX_CHARS
        if predicted:
            # Slack's fix is the first with a predicted effect, shown beside it.
            assert alert.annotations["first_fix"] == predicted[0].fix
            assert f"*Predicted:* {effect_text(predicted[0])}"[:60] in text
        shown = transition_text(t)
        assert all(effect_text(e) in shown for e in t.diagnosis.remediation_effects[:3] if e.change)


def test_slacks_fix_for_queue_bound_is_an_action_not_the_generic_check() -> None:
    """queue_bound's first remediation explains the queue; the fix Slack shows is the
    first with a predicted effect (the batch cap, or replicas)."""
    t = next(t for t in _firings() if t.cause == "queue_bound")
    alert = firing_alert(t, target="tour", severity="warning", external_url="http://x")
    fix = next(x for x in slack_payload(alert)["text"].splitlines() if x.startswith("*Fix:*"))
    assert "Check the queue" not in fix
    assert "--max-num-seqs" in fix or "replicas" in fix.lower()
