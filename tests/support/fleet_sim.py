"""A simulated fleet's extra series, for the fleet tests and bench/bench_fleet.py: what
NVIDIA's DCGM exporter shows for each pod's GPUs (with its Kubernetes pod mapping on),
and a vLLM scrape relabelled as one of many servers behind one endpoint.

The DCGM shape follows dcgm-exporter's output: one series per GPU per field, labelled
``gpu``, ``UUID``, ``device``, ``modelName`` (the name nvidia-smi prints), ``Hostname``,
and ``namespace``, ``pod``, ``container`` of the pod the GPU is assigned to.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from support import localserver
from support.localserver import METRICS_TYPE, Exchange


@dataclass(frozen=True)
class PodGpus:
    namespace: str
    pod: str
    card: str  # DCGM's modelName, e.g. "NVIDIA H100 80GB HBM3"
    gpus: int = 1
    dram_active: float = 0.5
    host: str = "node-0"


def dcgm_exposition(pods: list[PodGpus]) -> str:
    """DCGM_FI_DEV_FB_USED and DCGM_FI_PROF_DRAM_ACTIVE for every GPU of ``pods``."""
    lines = [
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
    ]
    dram = [
        "# HELP DCGM_FI_PROF_DRAM_ACTIVE Ratio of cycles the device memory interface is "
        "active sending or receiving data.",
        "# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge",
    ]
    n = 0
    for p in pods:
        for _ in range(p.gpus):
            labels = (
                f'gpu="{n % 8}",UUID="GPU-{n:08x}-0000-0000-0000-000000000000",'
                f'device="nvidia{n % 8}",modelName="{p.card}",Hostname="{p.host}",'
                f'DCGM_FI_DRIVER_VERSION="550.90.07",container="vllm",'
                f'namespace="{p.namespace}",pod="{p.pod}"'
            )
            lines.append(f"DCGM_FI_DEV_FB_USED{{{labels}}} 71234")
            dram.append(f"DCGM_FI_PROF_DRAM_ACTIVE{{{labels}}} {p.dram_active}")
            n += 1
    return "\n".join(lines + dram) + "\n"


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?( .*)$")


def relabel(body: str, labels: str, keep: Callable[[str], bool] = lambda name: True) -> str:
    """A scrape's sample lines with ``labels`` (``a="x",b="y"``) added to each, comments
    and the samples ``keep`` refuses left out: one server's series among many."""
    out = []
    for line in body.splitlines():
        m = _SAMPLE.match(line)
        if m is None or not keep(m.group(1)):
            continue
        inner = (m.group(2) or "{}")[1:-1]
        both = ",".join(part for part in (labels, inner) if part)
        out.append(f"{m.group(1)}{{{both}}}{m.group(3)}")
    return "\n".join(out) + "\n"


@contextmanager
def serving(body: Callable[[str], bytes]) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering GET <path> with ``body(path)``; its URL."""

    def handle(x: Exchange) -> None:
        x.reply(200, body(x.request.path), content_type=METRICS_TYPE)

    with localserver.serving(handle, http11=True) as server:
        yield server.url()
