"""Scrapes of simulated servers for tests/simulator, read back with prometheus_client's
own text parser (not the simulator's code), so that a test sees what a scraper sees."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.simulator import Scenario, Simulation, load_scenario_file, parse_scenario

from support.paths import SCENARIO_FIXTURES

SCENARIOS = SCENARIO_FIXTURES
START = 1_800_000_000.0
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(frozen=True)
class Scrape:
    """One ``/metrics`` body at virtual time ``t``: its samples by name and labels."""

    t: float
    text: str
    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float]
    types: Mapping[str, str]

    def rows(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        """Samples of ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return [(dict(lab), v) for (n, lab), v in self.samples.items() if n == name and want <= lab]

    def by_engine(self, name: str, **labels: str) -> dict[str, float]:
        """``name`` by its ``engine`` label (one sample per engine expected)."""
        out: dict[str, float] = {}
        for lab, value in self.rows(name, **labels):
            assert lab["engine"] not in out, f"{name} {labels}: two samples for one engine"
            out[lab["engine"]] = value
        return out

    def value(self, name: str, **labels: str) -> float:
        """The one sample of ``name`` with ``labels``."""
        rows = self.rows(name, **labels)
        assert len(rows) == 1, f"{name} {labels}: {len(rows)} samples"
        return rows[0][1]

    def total(self, name: str, **labels: str) -> float:
        return sum(v for _, v in self.rows(name, **labels))

    def families(self) -> set[str]:
        return set(self.types)


def parse(t: float, text: str) -> Scrape:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = s.value
    return Scrape(t, text, samples, types)


def fixture(name: str) -> Scenario:
    """A scenario of tests/fixtures/scenarios by its file's stem."""
    return load_scenario_file(SCENARIOS / f"{name}.yaml")


def inline(data: Mapping[str, Any]) -> Scenario:
    return parse_scenario(dict(data), source="<test>")


def scrapes(scenario: Scenario, times: Iterable[float], **kwargs: Any) -> list[Scrape]:
    """Scrape ``scenario`` at each of ``times`` (ascending), in one run."""
    sim = Simulation(scenario, **kwargs)
    out: list[Scrape] = []
    for t in times:
        sim.advance_to(t)
        out.append(parse(t, sim.render(created_at=START)))
    return out


@cache
def fixture_scrapes(name: str, times: tuple[float, ...]) -> tuple[Scrape, ...]:
    """``scrapes`` of a fixture, run once per test session for each set of times."""
    return tuple(scrapes(fixture(name), times))


def server(**changes: Any) -> dict[str, Any]:
    """healthy.yaml's H100 as a ``server:`` block, with ``changes``."""
    base: dict[str, Any] = {
        "gpu": "NVIDIA H100 SXM",
        "num_gpu_blocks": 25000,
        "max_num_batched_tokens": 8192,
        "max_model_len": 32768,
    }
    return {**base, **changes}


def load(**changes: Any) -> dict[str, Any]:
    """healthy.yaml's load (3 requests/s of 600-token chats) as a ``workload:``."""
    base: dict[str, Any] = {
        "arrival_rate_per_s": 3.0,
        "prompt_tokens": 600,
        "output_tokens": 180,
        "spread": 0.5,
        "seed": 0,
    }
    return {**base, **changes}
