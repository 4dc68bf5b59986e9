"""Property tests (hypothesis) over what a target can send: any input gives a snapshot or
a typed error, windowed rates are never negative, quantiles are monotone in q, and the
whole core (window, diagnosis, incidents) never raises on what the parser accepted.

Alongside: tests/core/test_parse.py (any text; generated gauge payloads against
prometheus_client), tests/core/test_histogram.py (bucket_quantile monotone in q),
tests/core/test_totals.py (the fast path equals the step-by-step sum).
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vllm_triage.core.model import Signals
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.core.totals import Window
from vllm_triage.errors import ParseError

from support.paths import VLLM_CAPTURES
from support.rulebooks import default_evaluator, runtime_table
from support.snapshots import hist, snap

FIXTURE = (VLLM_CAPTURES / "kvwarden-vllm-0.19.1-v1.txt").read_text()
LINES = FIXTURE.splitlines()

# Edits a broken exporter, a proxy or a flaky network could make to a real payload.
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e308", "0x10", "", "1,5", "∞"]),
)
edit = st.one_of(
    st.tuples(st.just("delete"), st.integers(0, len(LINES) - 1), st.just("")),
    st.tuples(st.just("value"), st.integers(0, len(LINES) - 1), values),
    st.tuples(st.just("duplicate"), st.integers(0, len(LINES) - 1), st.just("")),
    st.tuples(st.just("garbage"), st.integers(0, len(LINES) - 1), st.text(max_size=40)),
    st.tuples(st.just("truncate"), st.integers(0, len(FIXTURE)), st.just("")),
)


def mutate(edits: list[tuple[str, int, str]]) -> str:
    lines = list(LINES)
    truncate_at = None
    for kind, index, arg in edits:
        i = min(index, len(lines) - 1)
        if kind == "delete" and lines:
            del lines[i]
        elif kind == "value" and lines and not lines[i].startswith("#"):
            head, _, _ = lines[i].rpartition(" ")
            lines[i] = f"{head} {arg}"
        elif kind == "duplicate" and lines:
            lines.insert(i, lines[i])
        elif kind == "garbage":
            lines.insert(i, arg)
        elif kind == "truncate":
            truncate_at = index
    text = "\n".join(lines) + "\n"
    return text[:truncate_at] if truncate_at is not None else text


def check_signals(s: Signals) -> None:
    for name in (
        "preemptions_per_second",
        "prompt_tokens_per_second",
        "generation_tokens_per_second",
        "ttft_mean",
        "itl_mean",
        "queue_time_mean",
        "decode_tokens_per_second_per_stream",
    ):
        value = getattr(s, name)
        assert value is None or (math.isfinite(value) and value >= 0), (name, value)
    ttft = [q.value for q in (s.ttft_p50, s.ttft_p90, s.ttft_p99) if q is not None]
    itl = [q.value for q in (s.itl_p50, s.itl_p99) if q is not None]
    assert ttft == sorted(ttft) and itl == sorted(itl)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(edit, max_size=6), min_size=1, max_size=6))
# Found by this test: the ITL histogram's sum set to -1 (its count unchanged) was taken as
# the sum since a restart, and the mean ITL came out negative.
@example([[], [("delete", 0, ""), ("duplicate", 0, ""), ("value", 321, "-1.0")]])
def test_mutated_real_payloads_never_break_the_core(
    scrapes: list[list[tuple[str, int, str]]],
) -> None:
    """A sequence of damaged scrapes of a real vLLM payload: each one parses or raises
    ParseError, and the evaluator takes every parsed one without raising, with signals
    that stay in range."""
    parser = SnapshotParser(runtime_table())
    evaluator = default_evaluator()
    for n, edits in enumerate(scrapes):
        try:
            snapshot = parser.parse(mutate(edits), at=5.0 * n)
        except ParseError as exc:
            assert str(exc)
            continue
        evaluation = evaluator.step(snapshot)
        for s in evaluation.signals.values():
            check_signals(s)
        for d in evaluation.diagnoses.values():
            assert 0.0 <= d.confidence <= 1.0
            assert all(not isinstance(v, float) or math.isfinite(v) for v in d.evidence.values())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=1e6, allow_nan=False),  # preemptions counter
            st.lists(st.integers(0, 1000), min_size=3, max_size=3),  # TTFT bucket counts
            st.floats(min_value=0, max_value=1e4, allow_nan=False),  # TTFT sum
        ),
        min_size=2,
        max_size=12,
    )
)
def test_any_counter_sequence_gives_non_negative_rates(
    plan: list[tuple[float, list[int], float]],
) -> None:
    """Counters that go up, down (restarts) or stay: every rate is >= 0 and the
    quantiles ascend, whatever the order of values."""
    window = Window(10_000, min_observations=1)
    for n, (preemptions, buckets, total) in enumerate(plan):
        ttft = hist([*buckets, 0, 0, 0, 0, 0, 0, 0, 0], total=total)
        window.push(snap(5.0 * (n + 1), preemptions=preemptions, ttft=ttft))
        check_signals(window.signals("m"))
