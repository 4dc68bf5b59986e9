"""vllm-triage: tells why a vLLM server is slow, from its Prometheus /metrics.

The core (parse, window, diagnose, incidents) is pure: no clock, no network, no globals,
so that every incident can be recorded and replayed exactly. The shell (cli, record,
replay) does the I/O around it.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vllm-triage")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"
