"""vllm-triage: tells why a vLLM server is slow, from its Prometheus /metrics.

The core (``core/``: parse, window, diagnose, incidents) is pure: no clock, no network,
no globals, so that every incident can be recorded and replayed exactly. The runtime
around it lives in wings (``scrape/``, ``fleet/``, ``notify/``, ``serve/``,
``recording/``), built by one assembly point (``assemble``); ``docs/architecture.md``
draws the house.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vllm-triage")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"
