"""Tests for daemon/vllm_triage/core/dedup.py: the "send again?" decision, one line per case."""

from __future__ import annotations

import pytest

from vllm_triage.core.dedup import LastSent, NotifyReason, SendPolicy, Status, needs_update

HOURLY = SendPolicy(send_resolved=True, repeat_after_seconds=3600)
QUIET = SendPolicy(send_resolved=False, repeat_after_seconds=3600)
T = 1_800_000_000.0

CASES: list[tuple[str, LastSent | None, Status, float, SendPolicy, NotifyReason | None]] = [
    # Nothing sent yet and the alert fires: the receiver must hear it.
    ("first-firing", None, "firing", T, HOURLY, NotifyReason.FIRST),
    # It fired, was told, and now resolved: tell it, when it wants resolves.
    (
        "resolved-after-firing",
        LastSent("firing", T),
        "resolved",
        T + 60,
        HOURLY,
        NotifyReason.RESOLVED,
    ),
    # The same, for a receiver that asked not to hear resolves.
    ("resolved-not-wanted", LastSent("firing", T), "resolved", T + 60, QUIET, None),
    # A resolve for an alert the receiver never heard fire: nothing to take back.
    ("resolved-never-fired", None, "resolved", T, HOURLY, None),
    # Told it resolved already: a second resolve says nothing new.
    ("resolved-twice", LastSent("resolved", T), "resolved", T + 5, HOURLY, None),
    # Still firing, told a minute ago: too early to repeat.
    ("firing-recently-sent", LastSent("firing", T), "firing", T + 60, HOURLY, None),
    # Still firing, told an hour ago: repeat it so it is not forgotten.
    ("firing-repeat-due", LastSent("firing", T), "firing", T + 3600, HOURLY, NotifyReason.REPEAT),
    # Repeats follow the receiver's own interval, not a global one.
    (
        "short-interval",
        LastSent("firing", T),
        "firing",
        T + 60,
        SendPolicy(True, 60),
        NotifyReason.REPEAT,
    ),
    # Fires again after its resolve was sent: a new first notification.
    ("fires-again", LastSent("resolved", T), "firing", T + 10, HOURLY, NotifyReason.FIRST),
    # Repeats do not depend on send_resolved.
    ("quiet-repeat", LastSent("firing", T), "firing", T + 7200, QUIET, NotifyReason.REPEAT),
]

#: The same decision, knowing which cause the receiver was told and which holds now.
CAUSE_CASES: list[tuple[str, LastSent | None, Status, float, str, NotifyReason | None]] = [
    # The episode's cause changed a minute after it was told: tell it now, not in an hour.
    (
        "cause-changed",
        LastSent("firing", T, "prefill_bound"),
        "firing",
        T + 60,
        "decode_bound",
        NotifyReason.CAUSE_CHANGED,
    ),
    # The same cause a minute later: nothing new.
    ("same-cause", LastSent("firing", T, "decode_bound"), "firing", T + 60, "decode_bound", None),
    # A log from before causes were kept: no change can be told apart from a first word.
    ("cause-unknown", LastSent("firing", T), "firing", T + 60, "decode_bound", None),
    # A resolve is a resolve, whatever the cause was.
    (
        "resolved-after-change",
        LastSent("firing", T, "prefill_bound"),
        "resolved",
        T + 60,
        "decode_bound",
        NotifyReason.RESOLVED,
    ),
    # Told it resolved: a firing is a first notification again, not a change.
    (
        "fires-again-other-cause",
        LastSent("resolved", T, "prefill_bound"),
        "firing",
        T + 60,
        "decode_bound",
        NotifyReason.FIRST,
    ),
]


@pytest.mark.parametrize(
    ("last", "status", "now", "cause", "want"),
    [c[1:] for c in CAUSE_CASES],
    ids=[c[0] for c in CAUSE_CASES],
)
def test_needs_update_on_a_changed_cause(
    last: LastSent | None, status: Status, now: float, cause: str, want: NotifyReason | None
) -> None:
    assert needs_update(last, status, now, HOURLY, cause) == want


@pytest.mark.parametrize(
    ("last", "status", "now", "policy", "want"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_needs_update(
    last: LastSent | None,
    status: Status,
    now: float,
    policy: SendPolicy,
    want: NotifyReason | None,
) -> None:
    assert needs_update(last, status, now, policy) == want
