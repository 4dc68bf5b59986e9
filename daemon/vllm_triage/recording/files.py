"""The recording format: a directory of ``<unix_time_ms>.prom`` files, each the raw body of
one scrape, as ``record`` and ``simulate --record`` write them and ``replay`` reads them.

Each file is written under a temporary name and renamed, so a replay running beside a
recording never reads half a file.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

from vllm_triage.atomic import write_atomically
from vllm_triage.errors import RecordingError

FILE_NAME = re.compile(r"^(\d{1,16})\.prom$")


def recording_files(directory: str | Path) -> list[tuple[float, Path]]:
    """The scrape files of a recording, oldest first, with their times in unix seconds."""
    d = Path(directory)
    if not d.exists():
        raise RecordingError(f"{d}: no such directory")
    if not d.is_dir():
        raise RecordingError(f"{d}: not a directory (give the folder that `record --out` wrote)")
    try:
        matches = [(FILE_NAME.match(p.name), p) for p in d.iterdir()]
    except OSError as exc:
        raise RecordingError(f"{d}: cannot list: {exc.strerror or exc}") from exc
    found = sorted((int(m.group(1)) / 1000.0, p) for m, p in matches if m is not None)
    if not found:
        raise RecordingError(
            f"{d}: no <unix_time_ms>.prom files: not a recording made by `vllm-triage record`"
        )
    return found


#: A recorded scrape is read only up to this size, the same bound as a live scrape's
#: body (``max_body_bytes``' default): a 200 MB file is refused, not read whole first.
MAX_FILE_BYTES = 16 * 1024 * 1024


def read_scrape(path: Path, max_bytes: int = MAX_FILE_BYTES) -> bytes | str:
    """One recorded scrape's bytes, or why it cannot be used: only a regular file is
    opened (a FIFO would block for ever, ``/dev/zero`` never ends), and only up to
    ``max_bytes``."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_size > max_bytes:
            return f"larger than {max_bytes} bytes (a scrape is at most that)"
        with path.open("rb") as f:
            body = f.read(max_bytes + 1)
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    if len(body) > max_bytes:
        return f"larger than {max_bytes} bytes (a scrape is at most that)"
    return body


def write_scrape(directory: Path, at_ms: int, body: bytes) -> Path:
    """One scrape's body as ``<at_ms>.prom``, written whole or not at all."""
    return write_atomically(directory / f"{at_ms}.prom", body)
