"""Integers a peer writes into ``vllm:cache_config_info``'s labels are bounded where they
are read (``core/roofline/kvpool.py``), and a body whose data makes the core raise is
that body's failure, never the loop's (``core/drive.py``).

Before: a 400-digit ``num_gpu_blocks`` (or ``block_size``, or ``kv_cache_memory_bytes``
with a card set) raised ``OverflowError`` on every evaluation; ``replay``, ``report``,
``check`` and ``whatif`` crashed, and the daemon froze that target with ``up`` at 1."""

from __future__ import annotations

import re

import pytest

from vllm_triage.core.drive import Driver, Fed, Unusable
from vllm_triage.core.evaluate import Evaluator
from vllm_triage.core.roofline.kvpool import (
    MAX_POOL_BYTES,
    MAX_POOL_TOKENS,
    beyond_bounds,
    parse_cache_config,
    read_pool,
)

from support.parsing import parse_snapshot
from support.paths import FIXTURES
from support.rulebooks import default_evaluator, default_rulebook, runtime_table

BIG = "9" * 400
KV = FIXTURES / "recordings" / "kv"


def hostile(text: str, **labels: str) -> str:
    """``text`` with these ``cache_config_info`` label values swapped in."""
    for name, value in labels.items():
        text, n = re.subn(rf'\b{name}="[^"]*"', f'{name}="{value}"', text)
        assert n, name
    return text


def kv_bodies(**labels: str) -> list[tuple[float, bytes]]:
    files = sorted(KV.glob("*.prom"))
    return [(int(f.stem) / 1000, hostile(f.read_text(), **labels).encode()) for f in files]


class TestCacheConfigBounds:
    def test_a_400_digit_integer_is_unknown_and_said(self) -> None:
        labels = {
            "num_gpu_blocks": BIG,
            "block_size": "16",
            "kv_cache_size_tokens": BIG,
            "kv_cache_memory_bytes": BIG,
        }
        cfg = parse_cache_config(labels)
        assert cfg.num_gpu_blocks is None and cfg.kv_cache_size_tokens is None
        assert cfg.kv_cache_memory_bytes is None and cfg.pool_tokens is None
        assert read_pool(labels) is None
        said = beyond_bounds(labels)
        assert said is not None
        for name in ("num_gpu_blocks", "kv_cache_size_tokens", "kv_cache_memory_bytes"):
            assert name in said
        assert "block_size," not in said

    def test_a_pool_larger_than_any_card_is_unknown(self) -> None:
        """Each number fits a float, but no card holds the pool they make."""
        labels = {"num_gpu_blocks": str(2**30), "block_size": str(2**16)}
        assert read_pool(labels) is None
        assert parse_cache_config(labels).pool_tokens is None
        assert "block_size x num_gpu_blocks" in (beyond_bounds(labels) or "")
        over = {"kv_cache_memory_bytes": str(MAX_POOL_BYTES + 1)}
        assert parse_cache_config(over).kv_cache_memory_bytes is None
        assert beyond_bounds(over) is not None

    def test_real_pools_are_read_as_before(self) -> None:
        labels = {
            "num_gpu_blocks": "25000",
            "block_size": "16",
            "kv_cache_size_tokens": "400000",
            "kv_cache_memory_bytes": str(75 * 2**30),
        }
        cfg = parse_cache_config(labels)
        assert (cfg.num_gpu_blocks, cfg.block_size, cfg.pool_tokens) == (25000, 16, 400000)
        assert cfg.kv_cache_memory_bytes == 75 * 2**30
        assert read_pool(labels) == (16, 25000) and beyond_bounds(labels) is None
        at_bound = {"num_gpu_blocks": str(MAX_POOL_TOKENS), "block_size": "1"}
        assert read_pool(at_bound) == (1, MAX_POOL_TOKENS)

    def test_none_before_profiling_is_not_a_problem(self) -> None:
        labels = {"num_gpu_blocks": "None", "block_size": "16"}
        assert read_pool(labels) is None and beyond_bounds(labels) is None


@pytest.mark.parametrize(
    "labels",
    [
        {"num_gpu_blocks": BIG, "kv_cache_size_tokens": "None"},
        {"block_size": BIG, "kv_cache_size_tokens": "None"},
        {"kv_cache_memory_bytes": BIG},
        {"kv_cache_size_tokens": BIG, "kv_cache_memory_bytes": BIG},
    ],
    ids=["num_gpu_blocks", "block_size", "kv_cache_memory_bytes", "both"],
)
def test_a_recording_with_hostile_pool_labels_is_judged_every_scrape(
    labels: dict[str, str],
) -> None:
    """Every scrape of the kv recording judged, the pool unknown and the problem carried
    by each snapshot, where before every evaluation raised OverflowError (with a card set,
    for ``kv_cache_memory_bytes`` too: tests/system/test_hostile_round_three.py runs the
    daemon so)."""
    driver = Driver(default_evaluator(open_after=1), runtime_table())
    fed = [driver.feed(body, at) for at, body in kv_bodies(**labels)]
    judged = [f for f in fed if isinstance(f, Fed)]
    assert len(judged) == len(fed) == 24
    assert all(any("beyond what any card" in p for p in f.snapshot.problems) for f in judged)
    assert all(f.evaluation.accepted and f.evaluation.diagnoses for f in judged)


def test_the_pool_is_unknown_but_the_rest_of_the_scrape_is_read() -> None:
    (at, body), *_ = kv_bodies(num_gpu_blocks=BIG, kv_cache_size_tokens="None")
    snapshot = parse_snapshot(body.decode(), at)
    assert snapshot.kv_pool is None
    assert snapshot.models and all(m.running is not None for m in snapshot.models.values())


class Exploding(Evaluator):
    """An evaluator whose arithmetic raises on every other snapshot: a stand-in for a
    bug that only some data finds."""

    def __init__(self) -> None:
        super().__init__(default_rulebook())
        self.calls = 0

    def step(self, snapshot):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls % 2:
            raise OverflowError("int too large to convert to float")
        return super().step(snapshot)


def test_a_body_the_core_raises_on_is_unusable_and_the_next_is_judged() -> None:
    driver = Driver(Exploding(), runtime_table())
    results = [driver.feed(body, at) for at, body in kv_bodies()[:4]]
    unusable = [r for r in results if isinstance(r, Unusable)]
    assert [type(r).__name__ for r in results] == ["Unusable", "Fed"] * 2
    assert {r.reason for r in unusable} == {"evaluate"}
    message = unusable[0].message
    assert "OverflowError" in message and "int too large" in message
    # Where it happened (the innermost frame), never the whole traceback.
    assert "test_label_bounds.py:" in message and "\n" not in message
