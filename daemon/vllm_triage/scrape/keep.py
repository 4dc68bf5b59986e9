"""The daemon's own recording of a target (``run --record DIR``): each body its scrape loop
fetched, kept as ``DIR/<target>/<unix_time_ms>.prom``, the format ``record`` writes and
``replay`` and ``report`` read (``recording.files``).

Kept by the loop itself, not by a second scraper beside it, so a report made from the
folder replays exactly the bodies, at exactly the times, that the daemon judged: its
incidents are the alerts' incidents, to the second and the confidence.

Bounded as every recording is: a body over the recording's per-file bound
(``MAX_FILE_BYTES``, which ``replay`` would refuse) is not kept, and past ``max_bytes`` in
the folder the recording stops. The bound is the folder's, not the process's: what the
folder holds when the daemon starts counts (before, a daemon restarted three times wrote
three times the bound, and one in a crash loop filled the disk). Nothing the disk does
reaches the scrape loop: a failed write is counted (``RecordingStats.failures``,
``vllm_triage_recording_failures_total``) and logged, at once and then once a minute
while it lasts.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import structlog

from vllm_triage.logs import Throttle
from vllm_triage.recording.files import MAX_FILE_BYTES, write_scrape
from vllm_triage.state import RecordingStats

log = structlog.get_logger("vllm_triage.watcher")


def folder_bytes(folder: Path) -> int:
    """What the regular files directly in ``folder`` hold (0 for a folder not there)."""
    total = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    return total


class ScrapeKeeper:
    """Writes one target's scraped bodies into ``folder`` (made on the first write)."""

    def __init__(
        self,
        target: str,
        folder: Path,
        *,
        max_bytes: int,
        max_file_bytes: int = MAX_FILE_BYTES,
    ) -> None:
        self.target = target
        self.folder = folder
        self.max_bytes = max_bytes
        self.max_file_bytes = max_file_bytes
        self.stats = RecordingStats(str(folder), bytes_found=folder_bytes(folder))
        self._failures = Throttle()
        if self.stats.bytes_found >= max_bytes:
            log.warning(
                "recording_full",
                target=target,
                folder=str(folder),
                bytes=self.stats.bytes_found,
                max_bytes=max_bytes,
                consequence="no scrape is kept: move the folder away or raise record.max_bytes",
            )

    @staticmethod
    def file_time(at: float) -> float:
        """``at`` as the recording keeps it, to the millisecond: the daemon judges the
        scrape at this time, so a replay of the file sees the very same one."""
        return round(at * 1000) / 1000

    def keep(self, at: float, body: bytes) -> None:
        """Write ``body`` as the scrape taken at ``at`` (``file_time``); never raises."""
        st = self.stats
        if len(body) > self.max_file_bytes:
            self._failed(
                "too_large",
                f"a body of {len(body)} bytes is over a recording file's "
                f"{self.max_file_bytes} bytes (replay would refuse it): not kept",
            )
            return
        if st.bytes_found + st.bytes_written + len(body) > self.max_bytes:
            self._failed(
                "full",
                f"the recording's folder reached record.max_bytes ({self.max_bytes} bytes): "
                "no more scrapes are kept; move the folder away or raise the bound",
            )
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_scrape(self.folder, round(at * 1000), body)
        except OSError as exc:
            self._failed("disk", f"cannot write into {self.folder}: {exc.strerror or exc}")
            return
        st.written += 1
        st.bytes_written += len(body)
        self._failures.recovered(log, "recording_recovered", target=self.target)

    def _failed(self, reason: str, message: str) -> None:
        self.stats.failures[reason] += 1
        self._failures.warn(
            log, "recording_failed", key=reason, target=self.target, reason=reason, err=message
        )
