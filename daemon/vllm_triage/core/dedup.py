"""Whether a receiver should hear about an alert now: one pure decision, as Alertmanager's
``DedupStage.needsUpdate`` is.

The notifier keeps, per receiver and alert identity, what it last sent and when
(``LastSent``); this function reads that entry, the alert's status now and ``now``, and
says why a notification is due, or ``None``. Time is an argument, so the rules are
tested by a table (``tests/core/test_dedup.py``) without a clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

Status = Literal["firing", "resolved"]


class NotifyReason(enum.StrEnum):
    """Why a notification goes out (Alertmanager's ``NotifyReason`` names, in our words)."""

    FIRST = "first_notification"
    RESOLVED = "resolved"
    REPEAT = "repeat_interval_elapsed"
    #: The episode's cause changed since the receiver was told (``core.incidents``): the
    #: same alert, told again at once with what changed and why.
    CAUSE_CHANGED = "cause_changed"


@dataclass(frozen=True, slots=True)
class LastSent:
    """What a receiver was last told about one alert identity, and when; ``cause`` is
    the cause it was told of ("" when not known, as in a log kept by an older version)."""

    status: Status
    at: float
    cause: str = ""


@dataclass(frozen=True, slots=True)
class SendPolicy:
    """A receiver's rules: does it hear resolves, and how often is a firing alert repeated."""

    send_resolved: bool
    repeat_after_seconds: float


def needs_update(
    last: LastSent | None, status: Status, now: float, policy: SendPolicy, cause: str = ""
) -> NotifyReason | None:
    """Why ``status`` (of an alert whose cause is now ``cause``) should be sent to a
    receiver whose last word was ``last``, or None."""
    if status == "resolved":
        if last is None or last.status == "resolved":
            return None  # never told it fired, or already told it ended
        return NotifyReason.RESOLVED if policy.send_resolved else None
    if last is None or last.status == "resolved":
        return NotifyReason.FIRST
    if cause and last.cause and cause != last.cause:
        return NotifyReason.CAUSE_CHANGED
    if now - last.at >= policy.repeat_after_seconds:
        return NotifyReason.REPEAT
    return None
