"""A state store from before receivers had stable names, migrated in the same restart as a
reorder, never hands one receiver's queue to another (``assemble._adopt_positional_names``).

Before: the positional key (``slack-0``) went to whichever unnamed receiver of its type
now stood at that position: insert a second Slack receiver before the first in the same
restart as the upgrade, and the first one's pending alerts went to the second's channel,
once. Now a key is handed over only where one receiver of the type could be meant, and
said otherwise."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from vllm_triage.assemble import _adopt_positional_names, receiver_name
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.store import Notification, StateStore


def legacy_store(state: Path, keys: dict[str, int]) -> None:
    """A store whose outbox holds ``keys[k]`` notifications under each positional key."""
    store = StateStore.open(state)
    assert store is not None
    for key, n in keys.items():
        for i in range(n):
            store.enqueue(key, Notification(f"{key} {i}".encode(), f"{key} {i}"))
    store.close()


def settings(*receivers: dict[str, str]) -> Settings:
    return load_settings(flags={"receivers": list(receivers)})


def migrate(state: Path, s: Settings) -> tuple[dict[str, int], list[dict[str, object]]]:
    store = StateStore.open(state)
    assert store is not None
    with capture_logs() as logs:
        _adopt_positional_names(s, store)
    store.close()
    reopened = StateStore.open(state)
    assert reopened is not None
    queued = {k: len(v) for k, v in reopened.restored.outbox.items()}
    reopened.close()
    return queued, logs


SLACK_A = {"type": "slack", "url": "http://127.0.0.1:1/a"}
SLACK_B = {"type": "slack", "url": "http://127.0.0.1:1/b"}
HOOK = {"type": "alertmanager_webhook", "url": "http://127.0.0.1:1/hook"}


def test_a_slack_inserted_before_the_old_one_gets_nothing(tmp_path: Path) -> None:
    legacy_store(tmp_path, {"slack-0": 3})
    s = settings(SLACK_B, SLACK_A)  # B is new, and stands where A stood
    queued, logs = migrate(tmp_path, s)
    assert receiver_name(s, 0) not in queued and receiver_name(s, 1) not in queued
    assert queued == {"slack-0": 3}
    said = [e for e in logs if e["event"] == "receiver_keys_not_adopted"]
    assert len(said) == 1 and said[0]["old"] == ["slack-0"]


def test_one_receiver_of_its_type_gets_its_queue_wherever_it_now_stands(tmp_path: Path) -> None:
    """Reordered across types: [slack, webhook] became [webhook, slack]."""
    legacy_store(tmp_path, {"slack-0": 2, "alertmanager_webhook-1": 1})
    s = settings(HOOK, SLACK_A)
    queued, logs = migrate(tmp_path, s)
    assert queued == {receiver_name(s, 1): 2, receiver_name(s, 0): 1}
    assert len([e for e in logs if e["event"] == "receiver_key_renamed"]) == 2


def test_two_old_keys_of_a_type_are_not_guessed(tmp_path: Path) -> None:
    """Either may have moved: neither is handed over. The receivers hear what is firing
    at the next tick, as receivers new to the notifier do; what the old keys held is
    reported gone by the notifier."""
    legacy_store(tmp_path, {"slack-0": 1, "slack-1": 1})
    s = settings(SLACK_A, SLACK_B)
    queued, _ = migrate(tmp_path, s)
    assert queued == {"slack-0": 1, "slack-1": 1}


def test_a_stable_key_is_never_taken_for_a_position(tmp_path: Path) -> None:
    s = settings(SLACK_A)
    stable = receiver_name(s, 0)
    legacy_store(tmp_path, {stable: 2})
    queued, logs = migrate(tmp_path, s)
    assert queued == {stable: 2} and not logs
