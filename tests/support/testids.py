"""Every test id says what it is. A parametrized case left to pytest's own id (the
argument's name and the case's index: ``args0``, ``first3``) fails at setup, naming the
id to replace; ``ids=`` on the parametrize (or ``pytest.param(..., id=...)``) fixes it.

A pytest plugin: tests/conftest.py loads it, so the check holds in every tier and in any
selection of the tests.
"""

from __future__ import annotations

import pytest


def made_up_ids(item: pytest.Item) -> list[str]:
    """The parts of ``item``'s id that pytest made up from an argument's name and index."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return []
    parts = set(callspec.id.split("-"))
    made_up = (f"{name}{index}" for name, index in callspec.indices.items())
    return [part for part in made_up if part in parts]


def pytest_runtest_setup(item: pytest.Item) -> None:
    made_up = made_up_ids(item)
    if made_up:
        pytest.fail(
            f"{item.nodeid}: pytest made up the id {', '.join(made_up)}: give the "
            "parametrize ids= (or pytest.param(..., id=...)) that say what each case is",
            pytrace=False,
        )
