"""promtool unit tests for rules/prometheus/, generated from the simulator's scenarios.

Each bundled scenario is recorded every 15 s for eight simulated minutes, under vLLM's
current names and under the V0-era names; the samples become promtool ``input_series``.
Each test then asks that exactly the scenario's own alert fires, now and at any time
before (``healthy``: none).

    python tests/support/rule_tests.py      # rewrite rules/prometheus/tests/*.yaml

The files are committed so that users can run ``promtool test rules`` on them;
``tests/deploy/test_prometheus_rules.py`` checks that they are what this script writes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from vllm_triage.rules import runtime_table
from vllm_triage.simulator import get_scenario, record
from vllm_triage.simulator.dialects import spec_document

RUNTIMES = runtime_table()

ROOT = Path(__file__).resolve().parents[2]  # runs as a script too
RULES_DIR = ROOT / "rules" / "prometheus"
TESTS_DIR = RULES_DIR / "tests"
INTERVAL_S = 15
DURATION_S = 480
ALERTNAMES = {
    "healthy": None,
    "prefill_bound": "VllmPrefillBound",
    "decode_bound": "VllmDecodeBound",
    "queue_bound": "VllmQueueBound",
    "kv_pressure": "VllmKvPressure",
    "stalled": "VllmEngineStalled",
}
NAMINGS = ("v1", "v0")
#: The other engines' dialects: each replays the scenarios against its own rules
#: (``render rules --engine NAME``, committed as rules/prometheus/<name>-triage.rules.yaml);
#: vLLM's Rust frontend against vLLM's.
DIALECTS = ("sglang", "lmdeploy", "trtllm", "vllm-rust")
#: A scenario whose alert comes and goes in an engine's dialect: TensorRT-LLM writes its
#: time per output token when a request finishes, and the decode-bound scenario's long
#: generations finish a few a minute, so ITL p99 exists only in the minutes that have
#: finishes (the daemon says "too few observations" there). Its alert fires at some time
#: (and no other), not necessarily at the end.
COMES_AND_GOES = {("trtllm", "decode_bound")}
#: The families the rules read; the rest of the exposition is left out of the inputs.
USED = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
)
TARGET_LABELS = {"job": "vllm", "instance": "vllm-0:8000"}


def _number(value: float) -> str:
    value = float(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _series_name(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def rules_file(naming: str) -> str:
    """The rules file a naming's tests load (relative to the tests' directory)."""
    if naming in DIALECTS and naming != "vllm-rust":
        return f"../{naming}-triage.rules.yaml"
    return "../vllm-triage.rules.yaml"


def alertname(naming: str, scenario: str) -> str | None:
    name = ALERTNAMES[scenario]
    if name is None:
        return None
    if naming in DIALECTS and naming != "vllm-rust":
        prefix = "".join(p.capitalize() for p in naming.split("-"))
        return prefix + name.removeprefix("Vllm")
    return name


def _used(naming: str) -> tuple[str, ...]:
    """The families a naming's rules read."""
    if naming in DIALECTS and naming != "vllm-rust":
        prefix = spec_document(naming)["prefixes"][0]
        return tuple(
            f"{prefix}{f.name.removesuffix('_total')}" for f in RUNTIMES.spec(naming).families
        )
    return USED


def _families(naming: str, body: str) -> Any:
    if naming == "vllm-rust":
        return openmetrics_families(body)
    return text_string_to_metric_families(body)


def input_series(scenario: str, naming: str) -> list[dict[str, str]]:
    steps: list[dict[str, float]] = []
    used = _used(naming)
    for _, body in record(
        get_scenario(scenario),
        start_at=0.0,
        interval_s=INTERVAL_S,
        duration_s=DURATION_S,
        naming=naming,  # type: ignore[arg-type]
    ):
        values: dict[str, float] = {}
        for family in _families(naming, body):
            if family.name not in used:
                continue
            for s in family.samples:
                if s.name.endswith("_created") or not math.isfinite(s.value):
                    continue
                values[_series_name(s.name, {**s.labels, **TARGET_LABELS})] = s.value
        steps.append(values)
    names = sorted({k for step in steps for k in step})
    return [
        {
            "series": name,
            "values": " ".join(_number(st[name]) if name in st else "_" for st in steps),
        }
        for name in names
    ]


def _expect(alertname: str | None) -> list[dict[str, Any]]:
    return [] if alertname is None else [{"labels": f'{{alertname="{alertname}"}}', "value": 1}]


def test_file(naming: str) -> dict[str, Any]:
    end = f"{DURATION_S // 60}m"
    tests = []
    for scenario in ALERTNAMES:
        expected = alertname(naming, scenario)
        at_end = None if (naming, scenario) in COMES_AND_GOES else expected
        tests.append(
            {
                "name": f"{scenario} ({naming} names)",
                "interval": f"{INTERVAL_S}s",
                "input_series": input_series(scenario, naming),
                "promql_expr_test": [
                    {
                        # Exactly this alert is firing at the end ...
                        "expr": 'count by (alertname) (ALERTS{alertstate="firing"})',
                        "eval_time": end,
                        "exp_samples": _expect(at_end),
                    },
                    {
                        # ... and no other alert fired at any time before.
                        "expr": (
                            "count by (alertname) "
                            f'(max_over_time(ALERTS{{alertstate="firing"}}[{end}]))'
                        ),
                        "eval_time": end,
                        "exp_samples": _expect(expected),
                    },
                ],
            }
        )
    return {
        "rule_files": [rules_file(naming)],
        "evaluation_interval": f"{INTERVAL_S}s",
        "tests": tests,
    }


HEADER = """\
# Generated by tests/support/rule_tests.py from the simulator's scenarios: do not edit by hand.
# Run: promtool test rules rules/prometheus/tests/*.yaml
"""


def render(naming: str) -> str:
    body = yaml.safe_dump(test_file(naming), sort_keys=False, width=1_000_000)
    return HEADER + body


def path_for(naming: str) -> Path:
    return TESTS_DIR / f"scenarios-{naming}.test.yaml"


def main() -> None:
    TESTS_DIR.mkdir(parents=True, exist_ok=True)
    for naming in (*NAMINGS, *DIALECTS):
        path_for(naming).write_text(render(naming), encoding="utf-8")
        print(f"wrote {path_for(naming).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
