"""The exporter's golden file: committed recordings replayed through the daemon's own
watcher, rendered as ``/metrics``, compared byte for byte with ``tests/golden/metrics.prom``.

Regenerate it (after a deliberate change to what is exported) with:

    .venv/bin/python tests/support/golden_metrics.py

and read the diff before committing it. What varies from machine to machine is pinned:
the version labels of ``vllm_triage_build_info`` and the process collector (left out).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import structlog
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from vllm_triage.assemble import build_scraped
from vllm_triage.config.load import load_settings
from vllm_triage.config.rulebook import slo_of
from vllm_triage.config.schema import ReceiverSettings, TargetSettings
from vllm_triage.core.parse import SnapshotParser
from vllm_triage.notify.delivery import Delivery
from vllm_triage.notify.receivers import build_receiver
from vllm_triage.recording.files import recording_files
from vllm_triage.rules import runtime_table
from vllm_triage.serve.exporter import build_registry
from vllm_triage.state import TargetState

#: tests/, found from here: this module also runs as a script (`make golden`).
TESTS = Path(__file__).resolve().parents[1]
GOLDEN = TESTS / "golden" / "metrics.prom"
RECORDINGS = TESTS / "fixtures" / "recordings"
CONFIG = TESTS / "system" / "realvllm" / "triage-cpu.yaml"
#: (target name, recording, its hardware and model): one target with a ceiling.
TARGETS = (
    ("kv", "kv", None),
    (
        "decode",
        "decode",
        {
            "hardware": {"memory_bandwidth_gb_s": 90, "compute_tflops": 4},
            # tests/system/realvllm/make_model.py: 4 layers x 2 KV heads x 64 dims x 2 x 4 bytes
            "model": {"parameters_billion": 0.03, "dtype": "float32", "kv_bytes_per_token": 4096},
        },
    ),
)
_BUILD_INFO = re.compile(r"^(vllm_triage_build_info)\{[^}]*\}", re.MULTILINE)


def _replayed(name: str, recording: str, extra: dict[str, object] | None) -> TargetState:
    settings = load_settings(CONFIG)
    target = TargetSettings.model_validate(
        {"name": name, "url": "http://127.0.0.1:8000/metrics", **(extra or {})}
    )
    watcher = build_scraped(settings, target, client=httpx.AsyncClient(), notifier=None).target
    parser = SnapshotParser(runtime_table())
    for at, path in recording_files(RECORDINGS / recording):
        watcher.state.attempted(at)
        watcher.consume(parser.parse_bytes(path.read_bytes(), at))
    return watcher.state


def registry(*, process_metrics: bool = False) -> CollectorRegistry:
    """The exporter's registry over the replayed recordings."""
    with structlog.testing.capture_logs():  # the transitions' log lines are not the point
        states = [_replayed(*t) for t in TARGETS]
    receiver = ReceiverSettings(type="alertmanager_webhook", url="http://127.0.0.1:9/hook")
    # Nothing is sent: the exporter only reads the delivery's counters (all zero here).
    ds = [Delivery(build_receiver("ops", receiver, "http://127.0.0.1:9468"), httpx.AsyncClient())]
    slo = slo_of(load_settings(CONFIG).slo)
    return build_registry(lambda: states, lambda: ds, slo=slo, process_metrics=process_metrics)


def render() -> str:
    text = generate_latest(registry()).decode("utf-8")
    return _BUILD_INFO.sub(r'\1{python_version="(pinned)",version="(pinned)"}', text)


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(render(), encoding="utf-8")
    print(f"wrote {GOLDEN.relative_to(TESTS.parent)}", file=sys.stderr)
