"""Pointers do not go stale: every path of this repository named in a docstring or comment
of ``daemon/`` and ``tests/``, or in the docs, names a file or folder that exists.

A pointer is a path whose first part is a folder of the repository (``tests/core/...``,
``rules/...``), of the package (``core/roofline/step.py`` names
``daemon/vllm_triage/core/roofline/step.py``) or of the tests (``support/scenarios.py``), or
a bare module file name (``expectations.py``, looked up beside the file that names it, then
anywhere in the repository). Paths in other projects (``vllm/v1/metrics/loggers.py``), units
(``GB/s``) and patterns (``test_<command>_cmd.py``, ``*.yaml``) are not pointers.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.paths import PACKAGE, ROOT, TESTS

TOP = {"daemon", "tests", "rules", "docs", "deploy", "bench", ".ci", ".github"}
#: What a relative pointer may start with: the repository's, the package's and the tests'
#: folders.
OURS = (
    TOP
    | {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__")}
    | {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith("__")}
)
_EXT = r"(?:py|md|yaml|yml|json|toml|sh|tmpl|html|js|css|prom)"
#: A path: slash-separated parts, or one file name; not inside a URL, a pattern or a word.
_PATH = re.compile(
    r"(?<![\w/.:<>@-])((?:[\w.-]+/)+[\w.-]*\w/?|[\w-]+\." + _EXT + r")(?![\w/<>*{(-])"
)


def pointers(text: str) -> Iterator[str]:
    """The repository paths ``text`` names (see the module's note)."""
    for match in _PATH.finditer(text):
        token = match.group(1).rstrip(".")
        if "/" in token:
            if token.split("/")[0] in OURS:
                yield token
        elif token.endswith(".py"):
            yield token


def exists(token: str, beside: Path) -> bool:
    if token.split("/", maxsplit=1)[0] in TOP:
        return (ROOT / token).exists()
    if any((base / token).exists() for base in (PACKAGE, TESTS, beside, ROOT)):
        return True
    return "/" not in token and any(".venv" not in p.parts for p in ROOT.glob(f"[!.]*/**/{token}"))


def python_texts(path: Path) -> Iterator[tuple[int, str]]:
    """The comments and docstrings of a Python file, with their lines."""
    source = path.read_text(encoding="utf-8")
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno if node.body else 1, doc


def _sources() -> list[Path]:
    code = [*PACKAGE.rglob("*.py"), *TESTS.rglob("*.py")]
    return sorted(p for p in code if "bundled_rules" not in p.relative_to(ROOT).parts)


def _documents() -> list[Path]:
    return sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *PACKAGE.rglob("*.md")])


def stale(path: Path, texts: Iterator[tuple[int, str]]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{line}: {token}"
        for line, text in texts
        for token in pointers(text)
        if not exists(token, path.parent)
    ]


def test_every_pointer_in_the_code_exists() -> None:
    found = [s for p in _sources() for s in stale(p, python_texts(p))]
    assert found == []


@pytest.mark.parametrize("path", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_pointer_in_the_docs_exists(path: Path) -> None:
    lines = enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
    assert stale(path, iter(lines)) == []


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "see tests/core/test_parse.py and core/roofline/step.py",
            ["tests/core/test_parse.py", "core/roofline/step.py"],
        ),
        ("vLLM's vllm/v1/metrics/loggers.py, 3 GB/s, tokens/s", []),
        ("each subcommand has its own test_<command>_cmd.py; rules/scenarios/*.yaml", []),
        ("https://github.com/x/tests/y.py and expectations.py.", ["expectations.py"]),
    ],
    ids=["ours", "theirs-and-units", "patterns", "urls-and-bare-names"],
)
def test_the_scanner_tells_pointers_from_prose(text: str, named: list[str]) -> None:
    assert list(pointers(text)) == named


def test_the_check_itself_finds_a_stale_pointer(tmp_path: Path) -> None:
    assert not exists("tests/test_dedup.py", tmp_path)
    assert exists("core/roofline/step.py", tmp_path)
