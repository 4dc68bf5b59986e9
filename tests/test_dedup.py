"""Tests for daemon/core/dedup.py: the "send again?" decision, one line per case."""

from __future__ import annotations

import pytest

from daemon.core.dedup import LastSent, NotifyReason, SendPolicy, Status, needs_update

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
