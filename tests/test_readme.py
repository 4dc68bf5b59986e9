"""The README is the front door: short, it starts with the two commands a fresh machine
needs, and every relative link in it and in docs/ leads somewhere (a file that exists, and
a heading in it where the link names one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.paths import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

#: The README's first lines, byte for byte: the title and the two set-up commands.
OPENING = (
    "# vllm-triage\n"
    "\n"
    "```sh\n"
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/vllm-triage demo\n"
    "python3 -m venv .venv && .venv/bin/pip install '.[test]' && .venv/bin/pytest\n"
    "```\n"
)

#: A Markdown link or image: [text](target) or ![alt](target), the target up to a space
#: or the closing parenthesis (a title after a space is ignored).
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[^)]*)?\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans: links there are code."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return re.sub(r"`[^`\n]*`", "", "\n".join(kept))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation dropped
    (letters, digits, spaces, hyphens and underscores kept), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file; a repeated heading gets -1, -2, ..."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or heading is None:
            continue
        base = slug(heading.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def relative_links(path: Path) -> list[str]:
    return [
        t
        for t in LINK.findall(prose(path.read_text(encoding="utf-8")))
        if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)  # http:, https:, mailto:
    ]


def test_the_readme_is_at_most_300_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, len(lines)


def test_the_readme_starts_with_the_two_commands() -> None:
    assert README.read_text(encoding="utf-8").startswith(OPENING)


def test_the_docs_exist_and_each_opens_with_what_it_covers() -> None:
    names = {p.name for p in DOCS}
    assert {"operations.md", "deploy.md", "benchmarks.md", "physics.md"} <= names
    for name in ("operations.md", "deploy.md", "benchmarks.md"):
        lines = (ROOT / "docs" / name).read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# ") and lines[1] == "", name
        assert lines[2] and not lines[2].startswith(("#", "`", "|", "-")), name


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_at_what_exists(path: Path) -> None:
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert broken == [], broken


def test_the_link_check_sees_links() -> None:
    """The README links into every new doc, so a link pattern that matched nothing would
    show here, not pass the check above vacuously."""
    targets = relative_links(README)
    for doc in ("operations.md", "deploy.md", "benchmarks.md", "architecture.md"):
        assert any(t.startswith(f"docs/{doc}") for t in targets), doc
    assert "docs/report-tour.png" in targets
    assert any("#" in t for t in targets)


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Alerts: labels, annotations and delivery", "alerts-labels-annotations-and-delivery"),
        (
            "Why the sidecar does not take vLLM out of service",
            "why-the-sidecar-does-not-take-vllm-out-of-service",
        ),
        ("`stalled`", "stalled"),
        ("Speed and memory (2 cores)", "speed-and-memory-2-cores"),
        ("Fleet mode at scale", "fleet-mode-at-scale"),
    ],
)
def test_anchors_follow_githubs_rules(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_every_table_is_whole(path: Path) -> None:
    """A run of table rows starts with its header and separator, and each row has the
    header's cells: a row cut off from its table by a paragraph renders as text."""
    lines = path.read_text(encoding="utf-8").splitlines()
    fenced = False
    runs: list[list[str]] = []
    previous = ""
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            if previous.startswith("|"):
                runs[-1].append(line)
            else:
                runs.append([line])
        previous = "" if fenced else line
    for run in runs:
        assert len(run) >= 2 and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", run[1]), run[0]
        cells = run[0].count("|")
        for row in run[2:]:
            # A cell may hold an escaped pipe or one inside code: count the unescaped.
            assert row.replace("\\|", "").count("|") >= cells, row
