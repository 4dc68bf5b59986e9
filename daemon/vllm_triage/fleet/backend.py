"""What each query API needs for fleet mode's PromQL to mean what it means on Prometheus
(``docs/deploy.md``, "Backends"): the request parameters, the functions, the headers.

- **VictoriaMetrics** evaluates an instant query within 30 s of now at now - 30 s
  (``-search.latencyOffset``) unless the request says ``nocache=1``: a stall would be
  seen a whole window late. Its ``increase`` and ``changes`` count from the sample just
  before the window; ``increase_prometheus`` and ``changes_prometheus`` are Prometheus'.
  A cluster answers ``isPartial`` when a storage node is down: ``deny_partial_response=1``
  makes that an error instead. Its ranges are open on the left (``(t - d, t]``) where
  Prometheus 2's hold both ends: a millisecond more keeps the sample exactly a window
  old, as the sidecar's window keeps it.
- **Thanos** answers with ``warnings`` when a store fails (partial responses are its
  default): ``partial_response=false`` refuses them. An HA pair's series come back twice
  unless deduplicated: ``dedup=true`` with the pair's ``replicaLabels[]``.
- **Mimir** wants its tenant in ``X-Scope-OrgID`` on every request; it deduplicates HA
  pairs at ingestion and has no partial answers.
- **Prometheus**: none of these.

Every parameter is one the backend documents; another backend ignores an unknown one,
but each gets only its own. ``auto`` asks ``/api/v1/status/buildinfo`` once: Mimir names
itself (``application``), VictoriaMetrics 1.79 answers an empty ``data``; anything else
is read as Prometheus. Thanos answers as Prometheus does there, so it is only ever named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

Kind = Literal["prometheus", "victoriametrics", "thanos", "mimir"]
BUILDINFO = "/api/v1/status/buildinfo"


@dataclass(frozen=True, slots=True)
class Backend:
    """How to ask one kind of query API."""

    kind: Kind
    #: How the kind is known: ``settings``, or what the build-info probe said.
    known_from: str = "settings"
    #: Form fields sent with every query and label call.
    params: tuple[tuple[str, str], ...] = ()
    #: The functions with Prometheus' semantics for a counter's increase and a series'
    #: changes over a range.
    increase: str = "increase"
    changes: str = "changes"
    #: Added to every range, so that a sample exactly a range old is in it.
    range_pad_seconds: float = 0.0


def backend(
    kind: Kind, *, replica_labels: tuple[str, ...] = (), known_from: str = "settings"
) -> Backend:
    """The backend ``kind``, with Thanos' replica labels when it is Thanos."""
    if kind == "victoriametrics":
        return Backend(
            kind,
            known_from,
            params=(("nocache", "1"), ("deny_partial_response", "1")),
            increase="increase_prometheus",
            changes="changes_prometheus",
            range_pad_seconds=0.001,
        )
    if kind == "thanos":
        dedup = (("dedup", "true"), *(("replicaLabels[]", label) for label in replica_labels))
        return Backend(kind, known_from, params=(("partial_response", "false"), *dedup))
    return Backend(kind, known_from)


def detect(body: bytes) -> tuple[Kind, str]:
    """The kind a build-info answer says, and how it was told."""
    try:
        doc = json.loads(body)
        data = doc.get("data") if isinstance(doc, dict) else None
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return "prometheus", "build info unreadable: read as Prometheus"
    application = data.get("application")
    if isinstance(application, str) and "mimir" in application.lower():
        return "mimir", f"build info: {application[:60]}"
    if not data:
        return "victoriametrics", "build info: empty, as VictoriaMetrics answers"
    version = data.get("version")
    shown = version[:40] if isinstance(version, str) else "no version"
    return "prometheus", f"build info: version {shown} (Prometheus, or Thanos)"
