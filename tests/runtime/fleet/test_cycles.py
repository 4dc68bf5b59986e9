"""The cycle collector kept off fleet mode's heap (daemon/vllm_triage/fleet/cycles.py): paused
for a stretch and on again only when the last stretch ends, whichever thread holds it;
never turned on if someone else had turned it off; what a tick leaves alive frozen, and
everything collected whole every WHOLE_COLLECTION_EVERY ticks, so that a cycle dropped
while frozen is still freed."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

from vllm_triage.fleet import cycles


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    gc.unfreeze()
    if was:
        gc.enable()


def test_paused_until_the_last_stretch_ends_on_any_thread() -> None:
    gc.enable()
    inside = threading.Event()
    leave = threading.Event()

    def scrape() -> None:
        with cycles.paused():
            inside.set()
            leave.wait(10)

    other = threading.Thread(target=scrape)
    with cycles.paused():
        assert not gc.isenabled()
        other.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the scrape still holds it off
    leave.set()
    other.join(10)
    assert gc.isenabled()


def test_never_turned_on_behind_someone_elses_back() -> None:
    gc.disable()
    with cycles.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_a_frozen_cycle_is_freed_at_the_whole_collection() -> None:
    node = Node()
    gone = weakref.ref(node)
    cycles.settle(1)
    assert gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert gone() is not None  # frozen: the collector does not look at it
    cycles.settle(cycles.WHOLE_COLLECTION_EVERY)
    assert gone() is None
