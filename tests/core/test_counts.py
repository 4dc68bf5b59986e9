"""Counts said as people say them, everywhere one is printed (daemon/vllm_triage/core/counts.py):
"1 incident", never "1 incidents"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_triage.core.counts import counted

from support.paths import PACKAGE, ROOT


@pytest.mark.parametrize(
    ("n", "said"),
    [
        (0, "0 incidents"),
        (1, "1 incident"),
        (2, "2 incidents"),
        (1.0, "1 incident"),
        (1.5, "1.5 incidents"),
    ],
)
def test_singular_only_for_exactly_one(n: float, said: str) -> None:
    assert counted(n, "incident") == said


def test_an_irregular_plural() -> None:
    assert counted(3, "GPU", "GPUs") == "3 GPUs" and counted(1, "GPU", "GPUs") == "1 GPU"


#: The nouns the product counts in its messages.
NOUNS = (
    "incidents|scenarios|alerts|receivers|engines|targets|notifications|scrapes|files"
    "|evaluations|clear evaluations|points"
)
#: ``{n} incidents`` in an f-string: a count printed with a fixed plural.
FIXED_PLURAL = re.compile(r"\{[A-Za-z_][\w.()\[\], ]*\} (?:" + NOUNS + r")\b")


def test_no_message_prints_a_count_with_a_fixed_plural() -> None:
    """Every count of these nouns goes through ``counted`` (a count that is always more
    than one, ``{n} of {m}``'s ``m``, too: one rule is easier to keep than exceptions)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if FIXED_PLURAL.search(line) and ('f"' in line or "f'" in line):
                found.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert found == []


def test_the_page_counts_its_evaluations_and_points() -> None:
    page = Path(PACKAGE / "page" / "assets" / "page.js").read_text(encoding="utf-8")
    assert '+ " evaluations"' not in page and '" points' not in page
    assert 'counted(s.evaluations, "evaluation")' in page
