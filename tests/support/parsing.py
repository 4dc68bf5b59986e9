"""The parser as the tests use it: every bundled runtime (``rules/runtimes/``), so a test
reads any engine's body the way the daemon does."""

from __future__ import annotations

from typing import Any

from vllm_triage.core.model import Snapshot
from vllm_triage.core.names import NameTable, Spec
from vllm_triage.core.parse import parse_snapshot as parse_with

from support.rulebooks import runtime_table

RUNTIMES = runtime_table()


def parse_snapshot(text: str, at: float, **options: Any) -> Snapshot:
    """``core.parse.parse_snapshot`` with the bundled runtimes."""
    return parse_with(text, at, RUNTIMES, **options)


def samples_of(runtime: str) -> dict[str, tuple[str, Spec]]:
    """One runtime's sample names: name -> (its prefix, what it is); one reading each (a
    family that feeds several fields by label value gives its first)."""
    table = NameTable.of(RUNTIMES)
    spec = RUNTIMES.spec(runtime)
    return {
        name: (r.prefix, r.specs[0])
        for name, r in table.samples.items()
        if table.spec(r.runtime) is spec
    }


#: vLLM's sample names (both prefixes, every era): what the tests of vLLM bodies read.
SAMPLES = samples_of("vllm")
