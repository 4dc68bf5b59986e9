"""The house's rules. The core (``daemon/vllm_triage/core/``) is pure: it imports only itself,
``vllm_triage.errors`` and a short list of standard-library modules that touch no clock,
network, file or process state. Each room of the package imports only the rooms below it
(``WINGS``), and only the assembly reads the root settings.

The test tree holds to the same rules: the core's tests import only what the core may,
through the helpers too (one bridge builds the default rulebook), and the test folders
mirror the package's rooms and wings.

The test reads the source (it does not import it), so a forbidden import is caught even
where it sits in a function body or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from support.paths import PACKAGE, TESTS

CORE = PACKAGE / "core"

#: Standard-library modules the core may use: data shapes and arithmetic only.
ALLOWED_STDLIB = frozenset(
    {
        "__future__",
        "array",  # fixed-size numeric columns (``core.series``)
        "collections",
        "collections.abc",
        "dataclasses",
        "datetime",  # formatting a given unix time; ``now()`` is refused below
        "enum",
        "functools",
        "hashlib",  # a stable digest keeps a long label value distinct (``core.names``)
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
    return sorted(CORE.rglob("*.py"))


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
        "drive",
        "series",
    } <= names


def _core_id(path: Path) -> str:
    return path.relative_to(CORE).as_posix()


@pytest.mark.parametrize("path", _modules(), ids=_core_id)
def test_imports_only_itself_the_errors_and_pure_stdlib(path: Path) -> None:
    """No pydantic, httpx, apscheduler, structlog, prometheus_client, time, os, socket..."""
    assert forbidden(imports(path)) == []


@pytest.mark.parametrize("path", _modules(), ids=_core_id)
def test_reads_no_clock(path: Path) -> None:
    """Time comes from the snapshots, never from ``datetime.now()`` or ``time.time()``."""
    assert clock_calls(path) == []


#: The decode step roofline's room (``core/roofline/``): arithmetic over the core's shapes,
#: importing nothing of the core but them and its own modules.
ROOFLINE = CORE / "roofline"
SHAPES = {"vllm_triage.core.model", "vllm_triage.core.rulebook"}


@pytest.mark.parametrize("path", sorted(ROOFLINE.glob("*.py")), ids=_core_id)
def test_the_roofline_room_reads_only_the_shapes(path: Path) -> None:
    used = {m for m in imports(path) if m.startswith("vllm_triage.")}
    assert used <= SHAPES | {m for m in used if m.startswith("vllm_triage.core.roofline")}


def test_the_shapes_import_nothing_of_the_core() -> None:
    """``core/model.py`` holds the data shapes; arithmetic imports them, never the reverse."""
    assert [m for m in imports(CORE / "model.py") if m.startswith("vllm_triage.")] == []


def public_names(path: Path) -> set[str]:
    """The names a module defines at its top level and does not mark private."""
    out: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return {n for n in out if not n.startswith("_") and n != "__all__"}


def test_public_names_are_unique_across_the_core() -> None:
    """One name, one meaning: a reader who meets ``Window`` knows which one it is."""
    seen: dict[str, list[str]] = {}
    for path in _modules():
        for name in public_names(path):
            seen.setdefault(name, []).append(_core_id(path))
    assert {n: where for n, where in seen.items() if len(where) > 1} == {}


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


#: What each wing may import from the package, besides itself (docs/architecture.md draws
#: it). A wing is a folder of the package; each module directly in the package is its own
#: room, named by its stem. ``version`` is ``from vllm_triage import __version__``.
LEAVES = {"atomic", "errors", "rules", "version"}
WINGS: dict[str, set[str]] = {
    # The pure core and what it is given.
    "core": {"errors"},
    "ceiling": {"core", "errors", "rules"},
    "simulator": {"ceiling", "errors", "rules"},
    "page": {"core", "errors", "rules", "version"},
    # The SLOs written into Prometheus rules and the Grafana dashboard: values in, text out.
    "render": {"core", "errors"},
    # Settings, and the edges of the runtime.
    "net": {"errors", "version"},
    "config": {"ceiling", "core", "net"} | LEAVES,
    "logs": set(),
    "buildinfo": set(),
    "state": {"core"},
    "store": {"core", "state"},
    # The runtime's rooms: each is handed its parts; none reads the root settings.
    "notify": {"core", "config", "net", "state", "store"} | LEAVES,
    "target": {"core", "logs", "notify", "state", "store"} | LEAVES,
    "scrape": {"core", "config", "net", "logs", "recording", "state", "target"} | LEAVES,
    "fleet": {"core", "config", "ceiling", "net", "logs", "notify", "state", "store", "target"}
    | LEAVES,
    "serve": {"core", "page", "net", "state"} | LEAVES,
    "recording": {"core", "page", "net"} | LEAVES,
    "service": {"fleet", "notify", "scrape", "serve", "state", "store", "target"} | LEAVES,
    # The one assembly point, and what is built on it.
    "assemble": {
        "core",
        "ceiling",
        "config",
        "page",
        "net",
        "state",
        "store",
        "target",
        "notify",
        "scrape",
        "fleet",
        "serve",
        "recording",
        "service",
    }
    | LEAVES,
    "demo": {
        "core",
        "ceiling",
        "config",
        "page",
        "net",
        "state",
        "store",
        "target",
        "notify",
        "scrape",
        "fleet",
        "serve",
        "recording",
        "service",
        "assemble",
        "simulator",
        "logs",
    }
    | LEAVES,
}
# What-if: a recording's window, the simulator calibrated to it (docs/physics.md).
WINGS["whatif"] = {"core", "ceiling", "config", "simulator", "recording"} | LEAVES
WINGS["commands"] = WINGS["demo"] | {"demo", "render", "whatif"}
WINGS["cli"] = {"commands", "buildinfo", "logs"} | LEAVES
#: rules/, linked into the package as bundled_rules: data, not a room.
BUNDLED = PACKAGE / "bundled_rules"
#: Where the root ``Settings`` (or the loader that makes them) may be read: the loader
#: itself, the assembly, and the entry points that load the settings and hand them over.
READS_ROOT_SETTINGS = {"config", "assemble", "commands", "demo"}


def room_of_module(module: str) -> str:
    """``vllm_triage.core.parse`` -> core; ``vllm_triage.target`` -> target; the package
    itself -> version."""
    parts = module.split(".")
    if parts == ["vllm_triage"]:
        return "version"
    return parts[1]


def room_of_path(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _all_modules() -> list[Path]:
    return sorted(
        p
        for p in PACKAGE.rglob("*.py")
        if (p.name != "__init__.py" or p.parent != PACKAGE) and not p.is_relative_to(BUNDLED)
    )


@pytest.mark.parametrize("path", _all_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_room_imports_only_what_it_may(path: Path) -> None:
    own = room_of_path(path)
    if own in LEAVES:  # errors.py, rules.py: leaves every room may use
        return
    assert own in WINGS, f"{own}: a new room; give it a row in WINGS (and docs/architecture.md)"
    allowed = WINGS[own] | {own}
    used = {
        room_of_module(m)
        for m in imports(path)
        if m == "vllm_triage" or m.startswith("vllm_triage.")
    }
    assert used <= allowed, f"{path.relative_to(PACKAGE)} imports {sorted(used - allowed)}"


def root_settings_reads(path: Path) -> list[str]:
    """The imports of ``path`` that read the root settings: the ``Settings`` class or the
    loader."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "vllm_triage.config.schema":
            out.extend(f"{node.module}.Settings" for a in node.names if a.name == "Settings")
        elif isinstance(node, ast.ImportFrom) and node.module == "vllm_triage.config.load":
            out.append(node.module)
    return out


@pytest.mark.parametrize("path", _all_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_assembly_reads_the_root_settings(path: Path) -> None:
    """Every other room is handed the parts (or the settings section) it needs."""
    if room_of_path(path) in READS_ROOT_SETTINGS:
        return
    assert root_settings_reads(path) == []


def test_the_settings_check_finds_a_read(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text(
        "from vllm_triage.config.schema import ProbeSettings, Settings\n"
        "from vllm_triage.config.load import load_settings\n",
        encoding="utf-8",
    )
    assert root_settings_reads(src) == [
        "vllm_triage.config.schema.Settings",
        "vllm_triage.config.load",
    ]


def test_few_modules_directly_in_the_package() -> None:
    """The runtime lives in wings; the package's top holds the entry points, the assembly,
    the leaves and the few rooms every wing shares."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert len(top) <= 11, top


def test_there_are_no_import_loops_between_rooms() -> None:
    """Rooms form a layered graph: no room reaches itself through the others."""
    graph = {room: deps - LEAVES - {room} for room, deps in WINGS.items()}
    seen: dict[str, int] = {}

    def visit(room: str, path: tuple[str, ...]) -> None:
        assert room not in path, " -> ".join((*path, room))
        if seen.get(room) == 2:
            return
        for dep in sorted(graph.get(room, set())):
            visit(dep, (*path, room))
        seen[room] = 2

    for room in sorted(graph):
        visit(room, ())


#: The one module that may call an HTTP client: every answer is read through it.
BOUNDED_READER = "net/bounded.py"
HTTP_VERBS = frozenset(
    {"stream", "request", "send", "get", "post", "put", "patch", "delete", "head", "options"}
)
_CLIENTISH = re.compile(r"(^|_)(client|http|httpx)$")


def http_calls(path: Path) -> list[str]:
    """Calls in ``path`` that make an HTTP request: a verb on httpx itself or on anything
    named like a client (``client``, ``self._client``, ``http``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in HTTP_VERBS:
            continue
        owner = node.func.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if _CLIENTISH.search(name):
            out.append(f"{ast.unparse(node.func)} (line {node.lineno})")
    return out


@pytest.mark.parametrize("path", _all_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_answer_is_read_through_the_bounded_reader(path: Path) -> None:
    """A peer controls what it answers: a request made anywhere but ``net/bounded.py``
    would read that answer without the time, size and decoding bounds."""
    if str(path.relative_to(PACKAGE)) == BOUNDED_READER:
        assert http_calls(path), "the reader itself makes the requests"
        return
    assert http_calls(path) == []


def test_the_http_check_finds_a_request(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text(
        "async def f(self, d):\n"
        "    d.get('a')\n"
        "    await self._client.post('u', json={})\n"
        "    httpx.get('u')\n",
        encoding="utf-8",
    )
    assert sorted(http_calls(src)) == ["httpx.get (line 4)", "self._client.post (line 3)"]


# ---- The test tree holds to the same rules ------------------------------------------------

SUPPORT = TESTS / "support"
#: The one helper the core's tests may import that reaches past the core: the default
#: rulebook and evaluator, built as the daemon builds them from the bundled defaults.
BRIDGE = "support.rulebooks"


def imported_modules(path: Path) -> list[str]:
    """``imports``, with ``from support import x`` read as ``support.x``."""
    out = imports(path)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "support" and not node.level:
            out.extend(f"support.{alias.name}" for alias in node.names)
    return out


def past_the_core(path: Path, seen: frozenset[Path] = frozenset()) -> list[str]:
    """What ``path`` imports of the package beyond the core and the errors, itself or
    through the helpers it imports (followed; the bridge is not), each after the chain of
    helpers that leads to it."""
    out = []
    for module in imported_modules(path):
        if module == "vllm_triage" or module.startswith("vllm_triage."):
            if room_of_module(module) not in {"core", "errors"}:
                out.append(module)
        elif module.startswith("support.") and module != BRIDGE:
            helper = SUPPORT / f"{module.removeprefix('support.')}.py"
            if helper.exists() and helper not in seen:
                chain = past_the_core(helper, seen | {helper})
                out.extend(f"{module} -> {m}" for m in chain)
    return out


@pytest.mark.parametrize("path", sorted((TESTS / "core").glob("*.py")), ids=lambda p: p.name)
def test_the_cores_tests_import_only_the_core(path: Path) -> None:
    """A test of the core imports what the core may (and test libraries), the helpers
    that do the same, and the bridge: the simulator, the assembly and the settings are
    tests/diagnosis/'s and tests/runtime/'s."""
    assert past_the_core(path) == []


def test_the_core_check_follows_the_helpers(tmp_path: Path) -> None:
    """Through a helper that runs the simulator: caught; through one that uses the bridge
    (support.diagnosis), or the bridge itself: allowed."""
    src = tmp_path / "test_x.py"
    src.write_text(
        "from support.scenarios import recorded\n"
        "from support import diagnosis, rulebooks\n"
        "from vllm_triage.core.parse import parse_snapshot\n"
        "from vllm_triage.errors import ParseError\n",
        encoding="utf-8",
    )
    assert past_the_core(src) == [
        "support.scenarios -> vllm_triage.demo.offline",
        "support.scenarios -> vllm_triage.simulator",
    ]


def test_the_bridge_reaches_only_the_assembly_and_the_settings() -> None:
    used = {room_of_module(m) for m in imports(SUPPORT / "rulebooks.py") if "vllm_triage" in m}
    assert used <= {"assemble", "config", "core", "errors", "rules"}


def _package_wings() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} - {"bundled_rules"}


def _folders(where: Path) -> set[str]:
    return {p.name for p in where.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}


#: Test folders that are no room of the package: the runtime's wings (each in a folder of
#: its own below), the commands, the whole diagnosis on simulated servers and recordings,
#: deployment, the whole product, and the helpers and committed data.
TEST_GROUPS = {"runtime", "commands", "diagnosis", "deploy", "system", "support", "fixtures"}
TEST_GROUPS |= {"golden"}


def test_each_test_folder_is_a_room_or_a_group() -> None:
    """tests/core/, tests/ceiling/...: a folder named after a room holds that room's tests."""
    assert _folders(TESTS) - _package_wings() - TEST_GROUPS == set()


def test_the_runtimes_test_folders_name_its_wings() -> None:
    """tests/runtime/serve/ for serve/; a top-level module's tests stay in tests/runtime/."""
    wings = _package_wings() - _folders(TESTS)
    assert _folders(TESTS / "runtime") - wings == set()


def test_test_files_have_unique_names_and_no_package_marker() -> None:
    """pytest imports each test file by its basename (no __init__.py), so two files of one
    name would collide; only tests/support/ is a package (imported as support.<module>)."""
    files = [p for p in TESTS.rglob("test_*.py") if not p.is_relative_to(SUPPORT)]
    names = [p.name for p in files]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    markers = [p for p in TESTS.rglob("__init__.py") if p.parent != SUPPORT]
    assert markers == []


MADE_UP_IDS = """
import pytest

@pytest.mark.parametrize("args", [("a",), ("b",)])
def test_made_up(args):
    pass

@pytest.mark.parametrize("args", [("a",), ("b",)], ids=["first", "second"])
def test_named(args):
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_numbers_name_themselves(n):
    pass
"""


def test_a_test_id_pytest_made_up_fails(pytester: pytest.Pytester) -> None:
    """support/testids.py (loaded by tests/conftest.py) fails ``test_made_up[args0]``."""
    pytester.makepyfile(test_ids=MADE_UP_IDS)
    result = pytester.runpytest_inprocess("-p", "support.testids", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, errors=2)
    result.stdout.fnmatch_lines(["*test_made_up[[]args0[]]: pytest made up the id args0*"])
