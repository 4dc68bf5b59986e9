# Developer shortcuts. The README's two commands need only Python and pip; these need make.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: help venv test lint bench demo golden clean

help:
	@echo "make venv   create $(VENV) with vllm-triage (editable) and the test tools"
	@echo "make test   run the test suite"
	@echo "make lint   ruff, mypy --strict and basedpyright (every import resolved)"
	@echo "make bench  benchmarks: the core against prometheus_client, targets per core,"
	@echo "            memory over simulated hours, detection and delivery latency,"
	@echo "            the state store's cost per write, peak memory under the largest scrape,"
	@echo "            fleet mode's servers per core against a real Prometheus,"
	@echo "            the daemon and whatif under the hostile probes"
	@echo "make demo   run the built-in demo"
	@echo "make golden regenerate tests/golden/metrics.prom (read the diff before committing)"

$(BIN)/vllm-triage: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'

venv: $(BIN)/vllm-triage

test: venv
	$(BIN)/pytest

lint: venv
	$(BIN)/ruff check daemon tests bench
	$(BIN)/ruff format --check daemon tests bench
	$(BIN)/mypy
	$(BIN)/basedpyright

bench: venv
	$(BIN)/python bench/bench_core.py
	$(BIN)/python bench/bench_daemon.py
	$(BIN)/python bench/bench_store.py
	$(BIN)/python bench/bench_peak_rss.py
	$(BIN)/python bench/bench_fleet.py
	$(BIN)/python bench/bench_hostile.py

demo: venv
	$(BIN)/vllm-triage demo

golden: venv
	$(BIN)/python tests/support/golden_metrics.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
