"""The daemon as a process of its own, for the hostile-input tests: started with
``vllm-triage run`` under an address-space limit (an unbounded read or decompression
fails its test instead of taking the machine's memory), its peak resident memory
(``VmHWM``) and its answer to ``/healthz`` measured as a liveness probe would see them,
and the hostile servers it is pointed at (on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from support.clirun import stop
from support.localserver import Exchange, Handler
from support.paths import ROOT
from support.scenarios import recorded


def _liveness() -> tuple[float, int]:
    """The sidecar's liveness probe (deploy/kubernetes/sidecar-patch.yaml): how long one
    /healthz may take, and how many in a row may fail before Kubernetes restarts it."""
    patch = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "sidecar-patch.yaml").read_text())
    [container] = [
        c for c in patch["spec"]["template"]["spec"]["initContainers"] if "livenessProbe" in c
    ]
    probe = container["livenessProbe"]
    return float(probe["timeoutSeconds"]), int(probe["failureThreshold"])


#: What every hostile probe must leave: a daemon its liveness probe would not restart
#: (``restarted``), under 300 MB.
PROBE_TIMEOUT_S, PROBE_FAILURES = _liveness()
RSS_MB = 300.0
#: How long a test waits for the daemon to do what it waits for: a guard against a hang
#: (or a daemon stuck for good, as a frozen event loop was), not a measure of speed.
PATIENCE_S = 120.0
#: The scrape timeout of these daemons unless a test sets its own: a scrape of a target
#: on 127.0.0.1 that waits on a busy machine is late, not failed.
SCRAPE_TIMEOUT_S = 30.0


def restarted(latencies: list[float]) -> bool:
    """Whether the liveness probe would have restarted the daemon: ``PROBE_FAILURES``
    /healthz answers in a row slower than ``PROBE_TIMEOUT_S`` (or none). One slow answer
    on a busy machine is not a freeze; a frozen event loop fails every probe."""
    run = 0
    for seconds in latencies:
        run = run + 1 if seconds >= PROBE_TIMEOUT_S else 0
        if run >= PROBE_FAILURES:
            return True
    return False


#: The daemon's address space; an unbounded decompression or read dies against it.
ADDRESS_SPACE = 3 * 2**30
SECRET = "S3CRET"


def figure(test: str, **values: object) -> None:
    """What a test measured, for ``pytest -n 0 -s tests/system/test_hostile.py | grep FIGURE``
    (one process: -s shows nothing of what xdist's workers print)."""
    shown = " ".join(
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )
    print(f"FIGURE {test}: {shown}")


def good_body() -> bytes:
    """A healthy vLLM scrape (simulated, vLLM 0.19 names)."""
    (_, text), *_ = recorded("healthy", start_at=0, interval_s=5, duration_s=0)
    return text.encode()


GOOD = good_body()


# -- the daemon as a process -----------------------------------------------------------------


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def listening(self) -> bool:
        """Whether the daemon has said where it listens (its URL is then known)."""
        started = [e for e in self.logs() if e.get("event") == "started"]
        if started:
            self.url = f"http://{started[0]['listen']}"
        return bool(started)

    def healthz(self, timeout: float = PROBE_TIMEOUT_S) -> float:
        """Seconds /healthz took to answer 200 (infinity if it did not)."""
        started = time.monotonic()
        try:
            ok = httpx.get(self.url + "/healthz", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            ok = False
        return time.monotonic() - started if ok else float("inf")

    def watch(self, seconds: float, every: float = 0.2) -> list[float]:
        """/healthz latencies over ``seconds``."""
        out, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            out.append(self.healthz())
            time.sleep(every)
        return out

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=PATIENCE_S).text

    def value(self, name: str, **labels: str) -> float:
        """A sample of the daemon's /metrics (0 when absent)."""
        try:
            for family in text_string_to_metric_families(self.metrics()):
                for s in family.samples:
                    if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                        return float(s.value)
        except (httpx.HTTPError, ValueError):
            pass  # not answering, or an error page instead of metrics
        return 0.0

    def total(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples that carry ``labels`` (0 when absent)."""
        out = 0.0
        try:
            for family in text_string_to_metric_families(self.metrics()):
                for s in family.samples:
                    if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                        out += float(s.value)
        except (httpx.HTTPError, ValueError):
            pass  # not answering, or an error page instead of metrics
        return out

    def api(self, path: str) -> Any:
        return httpx.get(self.url + path, timeout=PATIENCE_S).json()

    def until(self, check: Callable[[], bool], timeout: float = PATIENCE_S) -> bool:
        """Whether ``check`` came true before the daemon exited or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if check():
                return True
            time.sleep(0.2)
        return False

    def peak_mb(self) -> float:
        """Peak resident memory so far (VmHWM), in MB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


def _limit(pid: int, nofile: int | None = None) -> None:
    """Set a process's limits from outside (``preexec_fn`` is unsafe in a threaded
    process); it has just started, long before it could use either. With a file limit
    the address space is left alone: a listener with a thread per connection (as before)
    must run out of descriptors, not of address space for its threads' stacks."""
    if nofile is None:
        resource.prlimit(pid, resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    else:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (nofile, nofile))


def _copy(source: IO[bytes], log_path: Path) -> None:
    """The daemon's output into its log file, written by this process: a file-size limit
    on the daemon (a full disk) must not cut its log short."""
    with log_path.open("ab") as log:
        for line in source:
            log.write(line)
            log.flush()


@contextlib.contextmanager
def run_daemon(
    tmp_path: Path,
    config: dict[str, Any],
    *,
    nofile: int | None = None,
    log_name: str = "daemon.log",
    fsize: int | None = None,
) -> Iterator[Daemon]:
    """``vllm-triage run`` with ``config`` (listening on any free port, its state in
    ``tmp_path/state``). ``fsize`` caps the size of any file it writes (RLIMIT_FSIZE:
    writes past it fail with EFBIG, as on a full disk)."""
    path = tmp_path / "triage.yaml"
    # A state folder of its own: module-scoped runs start before the per-test one exists.
    state = {"state_dir": str(tmp_path / "state")}
    # Any free port: the daemon says which in its "started" line.
    defaults = {"listen": "127.0.0.1:0", "scrape_timeout_seconds": SCRAPE_TIMEOUT_S}
    path.write_text(yaml.safe_dump({**defaults, **state, **config}))
    log_path = tmp_path / log_name
    log_path.write_bytes(b"")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_triage.cli", "--log-format", "json", "run", "--config", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,  # not the checkout: ``-m`` puts the working folder first on the path
    )
    _limit(proc.pid, nofile)
    if fsize is not None:
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (fsize, resource.RLIM_INFINITY))
    assert proc.stdout is not None
    copier = threading.Thread(target=_copy, args=(proc.stdout, log_path), daemon=True)
    copier.start()
    d = Daemon(proc, "", log_path)
    try:
        assert d.until(d.listening), "never started"
        assert d.until(lambda: d.healthz() < PROBE_TIMEOUT_S), "never came up"
        yield d
    finally:
        stop(proc)
        copier.join(timeout=10)


# -- hostile servers on 127.0.0.1 ------------------------------------------------------------


def body(data: bytes, *, status: int = 200, **headers: str) -> Handler:
    def answer(x: Exchange) -> None:
        x.reply(status, data, {k.replace("_", "-"): v for k, v in headers.items()})

    return answer


def redirect(location: str, status: int = 302) -> Handler:
    def answer(x: Exchange) -> None:
        x.reply(status, b"", {"Location": location})

    return answer


def target(name: str, url: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": url, **extra}


def failures(d: Daemon, name: str, reason: str) -> float:
    return d.value("vllm_triage_scrape_failures_total", target=name, reason=reason)


def cli(*args: str, timeout: float = PATIENCE_S) -> tuple[int, str, float, float]:
    """``vllm-triage ARGS`` in a process of its own: (exit code, stdout and stderr,
    seconds, peak RSS in MB), killed after ``timeout`` (exit code -9): a guard against a
    hang (a FIFO read for ever), not a measure: the seconds are for ``figure``."""
    wrapper = (
        "import resource, subprocess, sys, time\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE}))\n"
        "t = time.monotonic()\n"
        "try:\n"
        "    r = subprocess.run(sys.argv[2:], capture_output=True, timeout=float(sys.argv[1]))\n"
        "    rc, out = r.returncode, r.stdout + r.stderr\n"
        "except subprocess.TimeoutExpired as e:\n"
        "    rc, out = -9, (e.stdout or b'') + (e.stderr or b'')\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "sys.stdout.write(f'{rc} {time.monotonic() - t:.3f} {peak:.1f}\\n')\n"
        "sys.stdout.buffer.write(out[:200000])\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            wrapper,
            str(timeout),
            sys.executable,
            "-m",
            "vllm_triage.cli",
            *args,
        ],
        capture_output=True,
        cwd=tempfile.gettempdir(),
        timeout=timeout + 30,
        check=False,
    )
    first, _, rest = done.stdout.partition(b"\n")
    rc, seconds, peak = first.decode().split()
    return int(rc), rest.decode(errors="replace"), float(seconds), float(peak)


@functools.cache
def gzip_bomb(layers: int) -> bytes:
    """1 GiB of zeros, gzipped ``layers`` times (one layer: about 1 MB; two: a few KB)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(2**20)
    data = b"".join(z.compress(zeros) for _ in range(1024)) + z.flush()
    for _ in range(layers - 1):
        data = gzip.compress(data, 9)
    return data


class Endless:
    """200, then bytes without end (until the client hangs up, or 4 GB); ``pushed``
    counts what got out."""

    def __init__(self) -> None:
        self.pushed = 0

    def __call__(self, x: Exchange) -> None:
        x.begin(200, {"Content-Type": "application/json"})
        chunk = b"x" * 65536
        while self.pushed < 4 * 2**30:
            x.write(chunk)
            self.pushed += len(chunk)
