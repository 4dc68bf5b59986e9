"""The default rulebook and evaluator, built the way the daemon builds them from the
bundled defaults (``rules/defaults.yaml`` through ``vllm_triage.assemble``): no hardware,
no model, the bundled thresholds, SLOs, incident counts and remediation texts; and the
bundled runtime specs (``rules/runtimes/``), which every parser reads by.

The one bridge from ``tests/core/`` to the rest of the package: a test of the core judges
with what a user gets, and imports nothing of the shell itself. ``tests/test_architecture.py``
allows this helper, and no other that reaches past the core, in the core's tests.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_triage.assemble import build_evaluator, build_rulebook
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.core.evaluate import Evaluator
from vllm_triage.core.rulebook import Rulebook
from vllm_triage.core.runtime import RuntimeTable
from vllm_triage.rules import read_bundled as _read_bundled
from vllm_triage.rules import runtime_table as _runtime_table


@functools.cache
def _defaults() -> Settings:
    return load_settings()


def default_rulebook() -> Rulebook:
    """The rulebook of a daemon given no settings."""
    return build_rulebook(_defaults())


def default_evaluator(**incident: int) -> Evaluator:
    """A fresh evaluator, as ``run`` builds one for a target under the bundled defaults;
    ``incident`` changes the incident counts (``open_after=1``)."""
    settings = _defaults()
    if incident:
        changed = settings.incident.model_copy(update=incident)
        settings = settings.model_copy(update={"incident": changed})
    return build_evaluator(settings)


def runtime_table() -> RuntimeTable:
    """Every bundled runtime spec, as the daemon's parsers read them."""
    return _runtime_table()


def read_bundled(name: str) -> Any:
    """One bundled rules file as YAML (a runtime spec: ``runtimes/sglang.yaml``)."""
    return _read_bundled(name)
