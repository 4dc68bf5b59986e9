"""Fixtures shared by the whole suite; the helpers they and the tests use are in
``tests/support/``."""

from __future__ import annotations

import inspect
import os
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.captures import VLLM_FIXTURES
from support.paths import TESTS

#: pytester runs a small suite in a test (the plugins' own tests); support.testids fails a
#: parametrized case whose id pytest made up.
pytest_plugins = ("pytester", "support.testids")

# The suite is hermetic: a VLLM_TRIAGE_* variable in the caller's shell would change the
# settings every test builds (and an unknown one makes load_settings refuse to start), so
# none reaches the tests. Tests that exercise the environment set it themselves.
for _name in [n for n in os.environ if n.upper().startswith("VLLM_TRIAGE_")]:
    del os.environ[_name]


@pytest.fixture(params=VLLM_FIXTURES, ids=[p.name for p in VLLM_FIXTURES])
def vllm_fixture(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path


@pytest.fixture(scope="session", autouse=True)
def session_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Before any module-scoped fixture starts a daemon: never the user's own state."""
    home = tmp_path_factory.mktemp("session-state-home")
    saved = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(home)
    yield home
    if saved is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = saved


@pytest.fixture(autouse=True)
def own_state_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """`vllm-triage run` keeps alert state in $XDG_STATE_HOME/vllm-triage unless told: each
    test gets a folder of its own, so that no test restores another's alerts (or the
    user's). Subprocesses inherit it."""
    home = tmp_path_factory.mktemp("state-home")
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


#: The folders (under tests/) whose files run longest (whole-product runs, long
#: simulations, the installed command in subprocesses), first.
FIRST = ("system", "diagnosis", "commands", "simulator")

#: What makes a test a ``timing`` one when it uses it (in its body, its fixtures, or the
#: helpers of its own module it calls): the wall clock, sockets, threads, processes, and
#: what starts servers, daemons, commands or the live demo.
TIMING_MODULES = frozenset(
    {
        "time",
        "socket",
        "selectors",
        "subprocess",
        "threading",
        "pty",
        "support.browser",
        "support.clirun",
        "support.daemonproc",
        "support.harness",
        "support.localserver",
        "support.receiver",
        "vllm_triage.demo.live",
        "vllm_triage.simulator.serve",
    }
)


def _is_timing(value: object) -> bool:
    name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
    return name in TIMING_MODULES


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """A function's code and the code of the lambdas and functions inside it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _followed(value: object) -> bool:
    """A helper of the tests' own (a test module's, or ``support``'s): looked into."""
    module = str(getattr(value, "__module__", ""))
    return module.startswith(("support.", "test_", "tests.", "conftest"))


def touches_timing(func: object, seen: set[types.CodeType] | None = None) -> bool:
    """Whether ``func`` uses, by a global name, something of ``TIMING_MODULES``, or calls
    a helper of the tests' own that does (followed, once each; classes by their methods)."""
    seen = set() if seen is None else seen
    func = inspect.unwrap(func)  # type: ignore[arg-type]  # a contextmanager's own code
    if inspect.isclass(func):
        return any(touches_timing(m, seen) for m in vars(func).values() if callable(m))
    code = getattr(func, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    module_globals = getattr(func, "__globals__", {})
    for inner in _codes(code):
        for name in inner.co_names:
            value = module_globals.get(name)
            if value is None:
                continue
            if _is_timing(value):
                return True
            if _followed(value) and touches_timing(value, seen):
                return True
    return False


def _item_touches_timing(item: pytest.Item) -> bool:
    """The test's function, and every fixture it uses."""
    funcs = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs:
            funcs.append(defs[-1].func)
    seen: set[types.CodeType] = set()
    return any(touches_timing(f, seen) for f in funcs if f is not None)


@pytest.hookimpl(tryfirst=True)  # marked before -m selects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``timing`` the tests that touch the wall clock, sockets, threads or processes
    (``touches_timing``): CI runs them a second time beside busy processes. Then longest
    first: the parallel run hands out whole files in collection order, so a long file
    collected last would run alone at the end while the other workers idle."""
    for item in items:
        if _item_touches_timing(item):
            item.add_marker(pytest.mark.timing)

    def rank(item: pytest.Item) -> int:
        folder = item.path.relative_to(TESTS).parts[0]
        return FIRST.index(folder) if folder in FIRST else len(FIRST)

    items.sort(key=rank)
