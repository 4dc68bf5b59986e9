"""Counts as people read them: "1 incident", "2 incidents", "0 incidents"."""

from __future__ import annotations


def counted(n: float, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, the noun plural unless ``n`` is exactly 1 (``plural``: when it
    is not the noun with an ``s``). A float is shown as ``:g`` shows it."""
    shown = f"{n:g}" if isinstance(n, float) else str(n)
    return f"{shown} {noun if n == 1 else plural or noun + 's'}"
