"""Tests for daemon/vllm_triage/core/diagnose.py: the four causes, in causal order, with their
evidence.

The signals and rulebook are built by hand (``support/diagnosis.py``, shared with the tests
of the diagnosis's parts: test_facts.py, test_decode.py, test_stall.py)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_triage.core.diagnose import _contributing, diagnose
from vllm_triage.core.facts import facts_of

from support.diagnosis import KV_FULL_PREEMPTING, q, rules, signals
from support.physics import A10G_70B

# Each case: the signals of one situation, the cause it must get, and why.
CASES = [
    pytest.param(
        # waiting, and the pool (100k tokens, 97 % used by 8 requests) has room for
        # 0.25 more request of the current size; preemptions confirm
        KV_FULL_PREEMPTING,
        "kv_pressure",
        (),
        id="kv-full-preempting",
    ),
    pytest.param(
        # a small pool (4096 tokens) 70 % used by 2 long requests has room for 0.86
        # more: KV pressure, although usage is far below any fixed 90 % cut-off
        dict(
            waiting_mean=3.0,
            running_mean=2.0,
            kv_usage_mean=0.7,
            kv_usage_max=0.72,
            preemptions_per_second=0.0,
            kv_pool_tokens=4096,
            ttft_p99=q(6.0),
            ttft_mean=3.0,
            queue_time_mean=2.5,
        ),
        "kv_pressure",
        (),
        id="small-pool-headroom-in-requests",
    ),
    pytest.param(
        # many waiting, KV 20 % used: a sequence cap, not memory
        dict(
            waiting_mean=20.0,
            running_mean=16.0,
            kv_usage_mean=0.2,
            ttft_p99=q(12.0),
            ttft_mean=8.0,
            queue_time_mean=7.5,
            prefill_time_share=0.1,
        ),
        "queue_bound",
        (),
        id="seq-cap-with-kv-room",
    ),
    pytest.param(
        # TTFT breached, queue empty, prefill dominates: long prompts
        dict(
            ttft_p99=q(4.0),
            ttft_mean=2.5,
            queue_time_mean=0.05,
            prefill_time_share=0.8,
            prefill_time_mean=2.4,
            mean_prompt_tokens=12000.0,
        ),
        "prefill_bound",
        (),
        id="long-prompts",
    ),
    pytest.param(
        # requests wait, KV has room, but prefill takes the engine: a prefill backlog
        dict(
            ttft_p99=q(8.0),
            ttft_mean=5.0,
            queue_time_mean=4.0,
            waiting_mean=4.0,
            prefill_time_share=0.85,
            kv_usage_mean=0.3,
        ),
        "prefill_bound",
        (),
        id="prefill-backlog",
    ),
    pytest.param(
        # ITL breached while prefill takes 75 % of engine time: interference
        dict(
            itl_p99=q(0.6),
            itl_mean=0.08,
            prefill_time_share=0.75,
            decode_tokens_per_second_per_stream=12.5,
        ),
        "prefill_bound",
        (),
        id="prefill-interference",
    ),
    pytest.param(
        # ITL breached, decode dominates engine time
        dict(
            itl_p99=q(0.3),
            itl_mean=0.25,
            prefill_time_share=0.05,
            decode_tokens_per_second_per_stream=4.0,
        ),
        "decode_bound",
        (),
        id="slow-decode",
    ),
    pytest.param(
        # V0 (no queue/prefill histograms): TTFT breached with no one waiting is prefill
        dict(ttft_p99=q(5.0), ttft_mean=3.0, queue_time_mean=None, prefill_time_share=None),
        "prefill_bound",
        (),
        id="v0-ttft-no-queue",
    ),
    pytest.param(
        # V0: TTFT breached with a sustained queue and KV room is queue-bound
        dict(
            ttft_p99=q(5.0),
            ttft_mean=3.0,
            waiting_mean=8.0,
            queue_time_mean=None,
            prefill_time_share=None,
        ),
        "queue_bound",
        (),
        id="v0-ttft-with-queue",
    ),
]


class TestCauses:
    @pytest.mark.parametrize(("changes", "cause", "secondary"), CASES)
    def test_cause(self, changes: dict[str, Any], cause: str, secondary: tuple[str, ...]) -> None:
        """Each situation gets the cause the physics gives, with the others as secondary."""
        d = diagnose(signals(**changes), rules(A10G_70B))
        assert d.cause == cause
        assert d.secondary == secondary
        assert 0.0 < d.confidence <= 1.0
        assert d.remediation and d.summary

    def test_healthy_is_nothing(self) -> None:
        """Within every SLO, nothing is breached and no cause is named."""
        d = diagnose(signals(), rules())
        assert d.cause is None and d.breaches == ()

    def test_not_enough_data_is_not_a_breach(self) -> None:
        """Missing percentiles (too few observations) never open an incident."""
        d = diagnose(signals(ttft_p99=None, itl_p99=None), rules())
        assert d.cause is None


def test_a_cause_with_none_of_the_evidence_is_not_listed_as_contributing() -> None:
    """Present by its looser sign but with every check failing: 0 % of the evidence, so
    neither a contribution nor a secondary cause (the alert said "queue_bound (0%)")."""
    s = signals(waiting_mean=3.0)
    rulebook = rules()
    got = _contributing(
        primary="decode_bound",
        present=["decode_bound", "queue_bound", "prefill_bound"],
        confidence={"decode_bound": 1.0, "queue_bound": 0.0, "prefill_bound": 0.5},
        s=s,
        f=facts_of(s, rulebook),
        rules=rulebook,
    )
    assert [(c.cause, c.share) for c in got] == [("prefill_bound", 0.33)]


class TestPrefillWords:
    """The prefill summary says what its numbers are, and leaves out what is unknown."""

    def test_the_share_is_the_finished_requests_not_the_engines(self) -> None:
        """Prefill and decode times are observed when a request ends: the share is of
        the requests finished in the window (a decode still running is not in it)."""
        d = diagnose(
            signals(
                ttft_p99=q(6.0),
                ttft_mean=3.0,
                prefill_time_mean=2.4,
                prefill_time_share=0.94,
                prefill_time_count=12.0,
                mean_prompt_tokens=8000.0,
            ),
            rules(),
        )
        assert d.cause == "prefill_bound"
        assert "94% of the finished requests' time in prefill (12 finished)" in d.summary
        assert "engine time" not in d.summary

    def test_an_unknown_prefill_time_is_left_unsaid(self) -> None:
        """No prefill histogram (an older vLLM, another engine): no "prefill n/a mean"."""
        d = diagnose(
            signals(
                itl_p99=q(0.4),
                itl_p50=q(0.05, 0.5),
                prompt_tokens_per_second=500.0,
                prefill_time_share=None,
                prefill_time_mean=None,
            ),
            rules(),
        )
        assert d.cause == "prefill_bound"
        assert "n/a" not in d.summary and "prefill" in d.summary

    def test_no_decode_speed_is_said_as_such(self) -> None:
        """A decode-bound window whose steps carry prefill has no decode speed: the
        summary says why instead of printing one."""
        d = diagnose(
            signals(
                itl_p99=q(0.3),
                itl_p50=q(0.2, 0.5),
                itl_mean=0.25,
                decode_tokens_per_second_per_stream=None,
                missing={"decode_tokens_per_second_per_stream": "left out: steps carry prefill"},
            ),
            rules(),
        )
        assert d.cause == "decode_bound"
        assert "no decode speed: the window's steps carry prefill" in d.summary
        assert "n/a" not in d.summary
