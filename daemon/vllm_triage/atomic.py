"""Writing a file whole or not at all, the one way every room does it.

A reader (Prometheus reloading its rules, Grafana its dashboard, ``replay`` a recording
being written, a person opening a report) sees the old file or the new one, never half of
one: the text goes to a temporary file in the same folder (so the rename stays on one file
system), which then replaces the target in one ``os.replace``. Whatever fails on the way
(a full disk, a signal) removes the temporary file, so no ``.tmp`` is left behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: str | Path, data: bytes | str) -> Path:
    """Replace ``path`` with ``data`` (``str`` is written as UTF-8), whole or not at all."""
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target
