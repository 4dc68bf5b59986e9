"""Load for a vLLM server under test: asyncio + httpx, bounded in count and time.

Each mode induces one condition (see ``MODES``). Prompts are lists of token ids, so a
prompt's length is exact whatever the tokenizer; ``ignore_eos`` makes every request
generate exactly ``max_tokens``. Requests go to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass

import httpx

#: A generous bound per request: a queued long generation on a busy CPU takes a while,
#: and a client-side timeout would only hide what the server does.
REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class Mode:
    """Traffic shape: how many requests in flight, their sizes, and the rate limit."""

    concurrency: int
    prompt_tokens: int
    output_tokens: int
    # Seconds between request starts per worker (0: back to back).
    pause_s: float = 0.0


MODES: dict[str, Mode] = {
    # a trickle of short requests: nothing should fire
    "light": Mode(concurrency=1, prompt_tokens=32, output_tokens=16, pause_s=1.0),
    # many long prompts, tiny outputs: prefill is the work
    "prefill": Mode(concurrency=6, prompt_tokens=2000, output_tokens=1),
    # long generations from short prompts: decode is the work
    "decode": Mode(concurrency=96, prompt_tokens=16, output_tokens=400),
    # a few decoding streams: the load a stall freezes
    "stall": Mode(concurrency=8, prompt_tokens=16, output_tokens=400),
    # more requests than --max-num-seqs, small enough that KV has room
    "queue": Mode(concurrency=16, prompt_tokens=64, output_tokens=200),
    # long contexts in a small KV pool: waiting and preemption
    "kv": Mode(concurrency=8, prompt_tokens=700, output_tokens=800),
}


async def _worker(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    mode: Mode,
    deadline: float,
    seed: int,
    errors: Counter[str],
) -> tuple[int, int]:
    rng = random.Random(seed)
    ok = failed = 0
    while time.monotonic() < deadline:
        prompt = [rng.randrange(3, 2000) for _ in range(mode.prompt_tokens)]
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": mode.output_tokens,
            "ignore_eos": True,
            "temperature": 1.0,
        }
        try:
            resp = await client.post(url, json=body, timeout=REQUEST_TIMEOUT_S)
        except httpx.HTTPError as exc:
            failed += 1
            errors[f"{type(exc).__name__}: {exc}"] += 1
        else:
            if resp.status_code == 200:
                ok += 1
            else:
                failed += 1
                errors[f"HTTP {resp.status_code}: {resp.text[:200]}"] += 1
        if mode.pause_s:
            await asyncio.sleep(mode.pause_s)
    return ok, failed


async def run(
    base_url: str, model: str, mode_name: str, duration_s: float
) -> tuple[int, int, Counter[str]]:
    """Send ``mode_name`` traffic for ``duration_s`` seconds; returns (ok, failed, errors).

    Workers start no request after ``duration_s``, and wait for the ones in flight.
    """
    mode = MODES[mode_name]
    deadline = time.monotonic() + duration_s
    url = base_url.rstrip("/") + "/v1/completions"
    errors: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=mode.concurrency)
    async with httpx.AsyncClient(limits=limits) as client:
        results = await asyncio.gather(
            *(
                _worker(client, url, model, mode, deadline, seed, errors)
                for seed in range(mode.concurrency)
            )
        )
    return sum(r[0] for r in results), sum(r[1] for r in results), errors


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("--base-url", default="http://127.0.0.1:18000")
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--duration", type=float, default=30.0)
    args = p.parse_args()
    if not args.base_url.startswith(("http://127.", "http://localhost")):
        print("load goes to loopback only", file=sys.stderr)
        return 2
    ok, failed, errors = asyncio.run(run(args.base_url, args.model, args.mode, args.duration))
    print(f"{args.mode}: {ok} ok, {failed} failed {dict(errors)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
