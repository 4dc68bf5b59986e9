"""The daemon builds in dependency order on one cleanup stack (daemon/vllm_triage/assemble.py):
a build that fails after the port was bound and the store opened leaves neither behind, and
a daemon that was built closes both at shutdown."""

from __future__ import annotations

import asyncio
import gc
import socket
import warnings
from pathlib import Path

import pytest

from vllm_triage.assemble import build_daemon
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.errors import ConfigError
from vllm_triage.serve.listener import bind
from vllm_triage.store import StateStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def settings(port: int, state: Path, **target: object) -> Settings:
    return load_settings(
        flags={
            "listen": f"127.0.0.1:{port}",
            "state_dir": str(state),
            "targets": [{"name": "t", "url": "http://127.0.0.1:9/metrics", **target}],
        }
    )


def failed_build(port: int, state: Path, tmp_path: Path) -> list[warnings.WarningMessage]:
    """Build a daemon whose target's config.json is missing (read after the bind and the
    store), and return the ResourceWarnings its leftovers raise once collected."""
    missing = tmp_path / "no-such-config.json"
    bad = settings(port, state, model={"config_json": str(missing)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(ConfigError, match=r"no-such-config\.json"):
            build_daemon(bad)
        gc.collect()
    return [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_a_failed_build_leaves_no_socket_and_no_store_open(tmp_path: Path) -> None:
    port, state = free_port(), tmp_path / "state"
    assert failed_build(port, state, tmp_path) == []
    # The port is free again in the same process, and the store's lock is released.
    bind(f"127.0.0.1:{port}").close()
    store = StateStore.open(state)
    assert store is not None and store.status().durable
    store.close()


def test_the_check_itself_sees_a_leaked_socket(tmp_path: Path) -> None:
    """Without the stack, the socket bound before the failure is what leaks: the check
    above would see its ResourceWarning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        bind("127.0.0.1:0")  # dropped unclosed, as the old build dropped it
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] != []


def test_a_built_daemon_closes_what_it_opened_at_shutdown(tmp_path: Path) -> None:
    port, state = free_port(), tmp_path / "state"
    daemon = build_daemon(settings(port, state))
    stop = asyncio.Event()

    async def run() -> None:
        task = asyncio.create_task(daemon.run(stop))
        await asyncio.sleep(0)
        stop.set()
        await task

    asyncio.run(run())
    bind(f"127.0.0.1:{port}").close()
    store = StateStore.open(state)
    assert store is not None
    store.close()
