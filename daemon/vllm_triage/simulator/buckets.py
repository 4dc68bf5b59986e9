"""vLLM's histogram bucket bounds, copied from real payloads, for both metric eras, and
the grids the engine counts into.

The engine counts into grids that hold every bound any dialect renders: vLLM's V1
bounds, and the bounds each runtime spec gives its families (``rules/runtimes/``: SGLang's
TTFT from 0.1 s, LMDeploy's inter-token latency from 5 ms, ...). Every rendered set of
bounds is a subset of its grid, so one set of counts renders every era and every engine
exactly (see ``exposition`` and ``dialects``). Sources, in ``tests/fixtures/vllm/``: V1
from ``kvwarden-vllm-0.19.1-v1.txt`` (vLLM 0.19.1), V0 from ``kubeai-vllm-0.5.x-v0.txt``
(vLLM 0.5.3-0.5.4).
"""

from __future__ import annotations

from functools import cache

from vllm_triage.rules import runtime_documents

#: ``vllm:time_to_first_token_seconds`` (V1, 0.19.1).
TTFT_V1: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
#: ``vllm:inter_token_latency_seconds`` (V1, 0.19.1).
ITL_V1: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
#: ``vllm:iteration_tokens_total``: tokens per engine step (V1, 0.19.1).
ITERATION_TOKENS_V1: tuple[float, ...] = (
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
)  # fmt: skip
#: e2e, queue, prefill and decode request-phase histograms (V1, 0.19.1): one list.
REQUEST_LATENCY_V1: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

#: ``vllm:time_to_first_token_seconds`` (V0, 0.5.x).
TTFT_V0: tuple[float, ...] = TTFT_V1[: TTFT_V1.index(10.0) + 1]
#: ``vllm:time_per_output_token_seconds`` (V0, 0.5.x), the ITL's old name.
TPOT_V0: tuple[float, ...] = ITL_V1[: ITL_V1.index(2.5) + 1]
#: ``vllm:e2e_request_latency_seconds`` (V0, 0.5.x).
E2E_V0: tuple[float, ...] = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)

TOKENS_GRID_MAX = 10**7
"""Token-count histograms are counted up to here; vLLM cuts them at ``max_model_len``."""


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value``: vLLM's ``build_1_2_5_buckets``.

    vLLM sizes ``vllm:request_prompt_tokens`` and ``vllm:request_generation_tokens`` with
    it from ``max_model_len`` (4096 in the kvwarden capture gives 1 ... 2000; the kubeai
    capture's 1 ... 10000 means a max_model_len between 10000 and 19999).
    """
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


TOKENS_GRID: tuple[float, ...] = build_1_2_5_buckets(TOKENS_GRID_MAX)

#: ``vllm:request_render_duration_seconds`` (0.34): 0.1 ms to 10 s.
RENDER_V034: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


#: The vocabulary's histogram fields -> the V1 bounds their grid starts from.
_BASE: dict[str, tuple[float, ...]] = {
    "ttft": TTFT_V1,
    "itl": ITL_V1,
    "queue_time": REQUEST_LATENCY_V1,
    "prefill_time": REQUEST_LATENCY_V1,
    "decode_time": REQUEST_LATENCY_V1,
    "prompt_length": TOKENS_GRID,
    "generation_length": TOKENS_GRID,
    "iteration_tokens": ITERATION_TOKENS_V1,
}


@cache
def grid(field: str) -> tuple[float, ...]:
    """The bounds the engine counts a histogram ``field`` into: V1's and every bundled
    runtime's for that field."""
    bounds = set(_BASE[field])
    for _where, doc in runtime_documents():
        entries = (doc.get("families") or {}).get(field) or []
        for entry in entries if isinstance(entries, list) else [entries]:
            bounds.update(float(b) for b in entry.get("buckets") or ())
    return tuple(sorted(bounds))
