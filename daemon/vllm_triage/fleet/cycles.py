"""Python's cycle collector, kept off fleet mode's heap.

Fleet mode holds millions of long-lived objects at 10,000 servers (targets, views,
histories) and allocates millions more per tick (rows, signals, diagnoses), none of them
in a cycle: reference counting frees them all. The collector, left alone, rescanned the
long-lived ones on each full collection (several a tick, and during each /metrics
answer, a second or more of CPU each) and the young ones over and over while a tick piled
them up (bench/bench_fleet.py). So: ``paused`` for the stretch of a tick, and ``settle``
after it, which freezes what is alive (a /metrics answer then costs the collector only
what it allocates itself).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

#: Ticks between two whole collections (``settle``): an hour at a 15 s step.
WHOLE_COLLECTION_EVERY = 240


class _Pauses:
    """How many stretches hold the collector off now."""

    lock = threading.Lock()
    count = 0


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off for the stretch (a tick, its awaits included), on again once no
    stretch holds it off (whatever thread holds one). Reference counting frees what the
    stretch drops, as always. A tick is bounded in time (``timeout_seconds`` a request),
    so is what waits for the collector."""
    with _Pauses.lock:
        held = _Pauses.count > 0 or gc.isenabled()  # else someone else's: left to them
        if held:
            _Pauses.count += 1
            gc.disable()
    try:
        yield
    finally:
        if held:
            with _Pauses.lock:
                _Pauses.count -= 1
                if _Pauses.count == 0:
                    gc.enable()


def settle(ticks: int) -> None:
    """After a tick, what is alive joins the collector's permanent generation
    (``gc.freeze``): the collector stops rescanning the fleet's state. Reference counting
    frees frozen objects all the same; what only the collector frees (a cycle) waits for
    the next whole collection, every ``WHOLE_COLLECTION_EVERY`` ticks: everything is
    unfrozen, collected once and frozen again."""
    if ticks % WHOLE_COLLECTION_EVERY == 0:
        gc.unfreeze()
        gc.collect()
    gc.freeze()
