"""The live demo's post-mortem: record one simulated server while the daemon watches it,
then write its report (``vllm-triage report``) when the demo ends.

The recorder scrapes beside the daemon, on the demo's (faster) clock, and writes the
format ``record`` writes, so the report is what ``vllm-triage report`` makes of a real
recording; the folder stays, for ``replay`` and ``report`` by hand.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from vllm_triage.errors import ScrapeError
from vllm_triage.net.fetch import DEFAULT_MAX_BODY_BYTES, BlockingFetcher
from vllm_triage.recording.files import write_atomically


class LiveRecorder:
    """Scrapes ``url`` every ``interval_s`` real seconds into ``folder`` until stopped."""

    def __init__(
        self, url: str, folder: Path, *, clock: Callable[[], float], interval_s: float
    ) -> None:
        self.url = url
        self.folder = folder
        self.written = 0
        self.failed = 0
        self._clock = clock
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-recorder", daemon=True)

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        with BlockingFetcher() as http:
            while not self._stop.is_set():
                at = self._clock()
                try:
                    body = http.fetch(self.url, timeout=2.0, max_body_bytes=DEFAULT_MAX_BODY_BYTES)
                except ScrapeError:
                    self.failed += 1  # the simulator is starting or stopping
                else:
                    write_atomically(self.folder, round(at * 1000), body)
                    self.written += 1
                self._stop.wait(self._interval_s)


def demo_folder() -> Path:
    """A new folder for this run's recording and report (nothing of another run's)."""
    return Path(tempfile.mkdtemp(prefix="vllm-triage-demo-"))
