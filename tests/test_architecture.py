"""The core (``daemon/core/``) is pure: it imports only itself, ``vllm_triage.errors`` and a short
list of standard-library modules that touch no clock, network, file or process state.

The test reads the source (it does not import it), so a forbidden import is caught even
where it sits in a function body or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "daemon" / "core"

#: Standard-library modules the core may use: data shapes and arithmetic only.
ALLOWED_STDLIB = frozenset(
    {
        "__future__",
        "collections",
        "collections.abc",
        "dataclasses",
        "datetime",  # formatting a given unix time; ``now()`` is refused below
        "enum",
        "functools",
        "itertools",
        "json",
        "math",
        "re",
        "typing",
        "urllib.parse",
    }
)
ALLOWED_DAEMON = "vllm_triage.errors"
#: Calls that read the clock, whatever module they come from.
CLOCK_CALLS = frozenset({"now", "utcnow", "today", "time", "monotonic", "perf_counter"})


def _modules() -> list[Path]:
    return sorted(CORE.glob("*.py"))


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append(("." * node.level) + (node.module or ""))
    return out


def clock_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        ast.unparse(node.func)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCK_CALLS
    ]


def forbidden(names: list[str]) -> list[str]:
    return [
        n
        for n in names
        if not (n.startswith("vllm_triage.core") or n == ALLOWED_DAEMON or n in ALLOWED_STDLIB)
    ]


def test_the_core_has_its_modules() -> None:
    """The stages the architecture names are all here (a rename must update the test)."""
    names = {p.stem for p in _modules()}
    assert {
        "model",
        "names",
        "parse",
        "histogram",
        "totals",
        "signals",
        "diagnose",
        "incidents",
        "evaluate",
        "alerts",
        "report",
        "rulebook",
        "dedup",
        "timeline",
    } <= names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_imports_only_itself_the_errors_and_pure_stdlib(path: Path) -> None:
    """No pydantic, httpx, apscheduler, structlog, prometheus_client, time, os, socket..."""
    assert forbidden(imports(path)) == []


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_reads_no_clock(path: Path) -> None:
    """Time comes from the snapshots, never from ``datetime.now()`` or ``time.time()``."""
    assert clock_calls(path) == []


@pytest.mark.parametrize(
    ("names", "bad"),
    [
        (["vllm_triage.core.model", "math"], []),
        (["pydantic"], ["pydantic"]),
        (["httpx", "vllm_triage.errors"], ["httpx"]),
        (["vllm_triage.settings"], ["vllm_triage.settings"]),
        (["time"], ["time"]),
        (["structlog", "apscheduler.schedulers"], ["structlog", "apscheduler.schedulers"]),
    ],
    ids=["pure", "pydantic", "httpx", "settings", "clock", "shell-libraries"],
)
def test_the_check_itself_refuses_the_shell(names: list[str], bad: list[str]) -> None:
    """The rule would catch each import the core must not make."""
    assert forbidden(names) == bad


def test_the_clock_check_finds_a_clock_read(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text("import datetime\nwhen = datetime.datetime.now()\n", encoding="utf-8")
    assert clock_calls(src) == ["datetime.datetime.now"]


#: What each wing of the package may import from the package (besides itself).
#: ``runtime`` is every module directly in ``daemon/``. See docs/architecture.md.
WINGS: dict[str, set[str]] = {
    "core": {"errors"},
    "ceiling": {"core", "errors", "rules"},
    "simulator": {"ceiling", "errors", "rules"},
    "page": {"core", "errors", "rules", "version"},
    "runtime": {"core", "ceiling", "page", "errors", "version"},
    "demo": {"core", "ceiling", "runtime", "page", "simulator", "errors", "version"},
    "commands": {"core", "ceiling", "runtime", "page", "simulator", "demo", "errors", "version"},
}
PACKAGE = CORE.parent
SUBPACKAGES = {"core", "ceiling", "simulator", "demo", "commands", "page"}


def wing_of(module: str) -> str:
    """``vllm_triage.core.parse`` -> core; ``vllm_triage.watcher`` -> runtime; the package itself
    -> version."""
    parts = module.split(".")
    if parts == ["vllm_triage"]:
        return "version"  # ``from vllm_triage import __version__``
    if parts[1] == "errors":
        return "errors"
    if parts[1] == "rules":
        return "rules"
    return parts[1] if parts[1] in SUBPACKAGES else "runtime"


def _all_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "cli.py")


@pytest.mark.parametrize("path", _all_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_wing_imports_only_what_it_may(path: Path) -> None:
    rel = path.relative_to(PACKAGE)
    own = rel.parts[0] if len(rel.parts) > 1 else "runtime"
    if own not in WINGS:  # errors.py, rules.py: leaves every wing may use
        return
    allowed = WINGS[own] | {own}
    used = {wing_of(m) for m in imports(path) if m == "vllm_triage" or m.startswith("vllm_triage.")}
    # ``rules`` (reading the bundled YAML) is a leaf like ``errors``; the runtime reads it.
    if own == "runtime":
        allowed |= {"rules"}
    assert used <= allowed, f"{rel} imports {sorted(used - allowed)}"
