"""Fixtures shared by the whole suite; the helpers they and the tests use are in
``tests/support/``."""

from __future__ import annotations

import inspect
import os
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

#: What a test module uses that makes its tests ``timing`` ones: the wall clock, sockets,
#: threads, processes, and the helpers that start servers, daemons and commands.
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
    }
)


def touches_timing(module: object) -> bool:
    """Whether a test module imports one of ``TIMING_MODULES`` (or a name from one)."""
    for value in vars(module).values():
        name = getattr(value, "__name__", None) if inspect.ismodule(value) else None
        name = name or getattr(value, "__module__", None)
        if name in TIMING_MODULES:
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # marked before -m selects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``timing`` the tests of modules that touch the wall clock, sockets or
    processes (``touches_timing``): CI runs them a second time beside busy processes.
    Then longest first: the parallel run hands out whole files in collection order, so
    a long file collected last would run alone at the end while the other workers idle."""
    verdicts: dict[object, bool] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and verdicts.setdefault(module, touches_timing(module)):
            item.add_marker(pytest.mark.timing)

    def rank(item: pytest.Item) -> int:
        folder = item.path.relative_to(TESTS).parts[0]
        return FIRST.index(folder) if folder in FIRST else len(FIRST)

    items.sort(key=rank)
