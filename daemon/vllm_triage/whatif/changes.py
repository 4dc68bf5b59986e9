"""The changes ``whatif`` takes: ``KEY=VALUE``, keyed as ``core.predict.CHANGE_KEYS``."""

from __future__ import annotations

from collections.abc import Iterable

from vllm_triage.ceiling.gpus import find_gpu
from vllm_triage.ceiling.sizing import bytes_per_param
from vllm_triage.core.model import ChangeValue
from vllm_triage.core.predict import CHANGE_KEYS
from vllm_triage.errors import ConfigError
from vllm_triage.whatif.budget import (
    MAX_ARRIVAL_SCALE,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    MAX_REPLICAS,
    MAX_TENSOR_PARALLEL,
    MIN_ARRIVAL_SCALE,
)

#: Each integer change's largest value, and why (``whatif.budget``): beyond it the
#: simulation would answer confidently for a server the card table cannot describe, or
#: run for ever.
_INTEGERS: dict[str, tuple[int, str]] = {
    "max_num_seqs": (MAX_NUM_SEQS, "more sequences than whatif simulates in a batch"),
    "max_num_batched_tokens": (MAX_NUM_BATCHED_TOKENS, "more tokens than a step batches"),
    "tensor_parallel_size": (
        MAX_TENSOR_PARALLEL,
        "beyond the card table: its largest NVLink domain is 72 GPUs (GB200 NVL72), and "
        "tensor parallelism across nodes is not modelled",
    ),
    "replicas": (MAX_REPLICAS, "more servers than whatif splits a load over"),
}


def _valid_keys() -> str:
    return "; ".join(f"{k} ({v})" for k, v in CHANGE_KEYS.items())


def parse_change(text: str) -> tuple[str, ChangeValue]:
    """One ``KEY=VALUE``, checked; ``ConfigError`` names the valid keys."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or key not in CHANGE_KEYS:
        raise ConfigError(f"--change {text!r}: expected KEY=VALUE with KEY one of: {_valid_keys()}")
    if not raw:
        raise ConfigError(f"--change {text!r}: no value ({key}: {CHANGE_KEYS[key]})")
    if key in _INTEGERS:
        try:
            number = int(raw)
        except ValueError:
            number = 0
        if number < 1:
            raise ConfigError(f"--change {text!r}: {key} must be {CHANGE_KEYS[key]}")
        most, why = _INTEGERS[key]
        if number > most:
            raise ConfigError(f"--change {text!r}: at most {most:,} ({why})")
        return key, number
    if key == "arrival_rate_scale":
        try:
            scale = float(raw)
        except ValueError:
            scale = 0.0
        if not 0 < scale < float("inf"):
            raise ConfigError(f"--change {text!r}: {key} must be a number > 0")
        if not MIN_ARRIVAL_SCALE <= scale <= MAX_ARRIVAL_SCALE:
            raise ConfigError(
                f"--change {text!r}: {key} must be from {MIN_ARRIVAL_SCALE:g} to "
                f"{MAX_ARRIVAL_SCALE:g} (the window's load, at most a thousand times over)"
            )
        return key, scale
    if key == "kv_cache_dtype":
        if raw.lower() not in ("fp8", "fp8_e4m3", "fp8_e5m2", "auto", "bfloat16", "float16"):
            raise ConfigError(f"--change {text!r}: kv_cache_dtype is fp8 (or auto)")
        return key, raw.lower()
    if key == "dtype":
        bytes_per_param(raw)  # raises ConfigError naming the accepted dtypes
        return key, raw.lower()
    return key, find_gpu(raw).name  # gpu: raises ConfigError naming the table's cards


def parse_changes(texts: Iterable[str]) -> dict[str, ChangeValue]:
    out: dict[str, ChangeValue] = {}
    for text in texts:
        key, value = parse_change(text)
        if key in out:
            raise ConfigError(f"--change {key} given twice")
        out[key] = value
    return out
