"""Where things are: the checkout, the test tree and its committed fixtures."""

from __future__ import annotations

from pathlib import Path

#: The checkout's root (pyproject.toml, daemon/, rules/, deploy/, docs/).
ROOT = Path(__file__).resolve().parents[2]
#: The import package vllm_triage, in its source root daemon/.
PACKAGE = ROOT / "daemon" / "vllm_triage"
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"
CONFIGS = FIXTURES / "configs"
RECORDINGS = FIXTURES / "recordings"
SCENARIO_FIXTURES = FIXTURES / "scenarios"
VLLM_CAPTURES = FIXTURES / "vllm"
#: Other serving engines' bodies, from their own metrics code (runtimes/SOURCES.md).
RUNTIME_FIXTURES = FIXTURES / "runtimes"
ALERTMANAGER = FIXTURES / "alertmanager"
#: The exporter's golden /metrics (written by support/golden_metrics.py).
GOLDEN = TESTS / "golden" / "metrics.prom"
#: The real-vLLM suite's folder: its settings files are also the recordings' settings.
REALVLLM = TESTS / "system" / "realvllm"
#: The bundled scenarios (rules/scenarios/*.yaml).
BUNDLED_SCENARIOS = ROOT / "rules" / "scenarios"
