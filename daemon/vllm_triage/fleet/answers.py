"""A query API's answer read as fleet mode needs it: its rows (or label values), and
whether it may be missing data.

A partial answer arrives as HTTP 200 and ``"status": "success"``: VictoriaMetrics'
cluster sets ``"isPartial": true`` when a storage node did not answer, Thanos adds
``warnings`` when a store API failed or timed out. Either makes the answer
``partial``; the tick then judges none of the servers it may be missing
(``fleet.source``). PromQL's own annotations arrive as warnings too
(``PromQL warning: ...``, ``PromQL info: ...``: a query's remarks on its input, the
data whole), so they are kept as notes, not read as missing data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic_core import from_json

from vllm_triage.errors import ScrapeError
from vllm_triage.net.redact import quoted

#: Warnings that are PromQL's remarks on a whole answer, not data that did not come.
ANNOTATIONS = ("PromQL warning:", "PromQL info:")


@dataclass(frozen=True, slots=True)
class Reading:
    """One answer: its rows (an instant query's ``data.result``, or label values)."""

    rows: list[Any]
    #: Why the answer may be missing data (``isPartial``, a store's warning), or None.
    partial: str | None = None
    #: PromQL's annotations on a whole answer (logged, nothing more).
    notes: tuple[str, ...] = ()


def _parsed(body: bytes) -> Any:
    """The answer's JSON. pydantic's parser (already a dependency) reads a fleet's answers
    in two thirds of the time of the standard library's, and keeps one copy of each
    repeated string (the label names and values every row repeats) while the answer is
    read. What it refuses the standard library reads as it always has: a lone surrogate
    escaped in a label value, nesting past its depth limit, a UTF-16 body; so an odd
    byte in one server's label is never a tick lost for the fleet."""
    try:
        return from_json(body, cache_strings="all")
    except ValueError:
        return json.loads(body)


def _document(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = _parsed(body)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if doc.get("status") != "success":
            raise ValueError(doc.get("error", "status is not success"))
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise ScrapeError(
            f"not a query API answer ({what}): {str(exc)[:200]}", reason="parse"
        ) from exc
    return doc


def _completeness(doc: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    if doc.get("isPartial") is True:
        return "isPartial: a storage node did not answer", ()
    warnings = doc.get("warnings")
    if not warnings:
        return None, ()
    if not isinstance(warnings, list):
        return f"warnings: {quoted(str(warnings), 120)}", ()
    notes = tuple(w for w in warnings if isinstance(w, str) and w.startswith(ANNOTATIONS))
    lost = [w for w in warnings if not (isinstance(w, str) and w.startswith(ANNOTATIONS))]
    if lost:
        return f"warnings: {quoted(str(lost[0]), 160)}", notes
    return None, notes


def query_answer(key: str, body: bytes) -> Reading:
    """An instant query's answer; ``ScrapeError`` if it is not one."""
    doc = _document(body, key)
    try:
        if doc["data"]["resultType"] != "vector":
            raise ValueError(f"a {doc['data']['resultType']}, not a vector")
        result = doc["data"]["result"]
        if not isinstance(result, list):
            raise ValueError("data.result is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        raise ScrapeError(
            f"not an instant query answer ({key}): {str(exc)[:200]}", reason="parse"
        ) from exc
    partial, notes = _completeness(doc)
    return Reading(result, partial, notes)


def label_values(what: str, body: bytes) -> Reading:
    """A label values answer (``/api/v1/label/<name>/values``): its string values."""
    doc = _document(body, what)
    data = doc.get("data")
    if not isinstance(data, list):
        raise ScrapeError(f"not a label values answer ({what})", reason="parse")
    partial, notes = _completeness(doc)
    return Reading([v for v in data if isinstance(v, str)], partial, notes)
