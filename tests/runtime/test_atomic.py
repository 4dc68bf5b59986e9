"""Tests for daemon/vllm_triage/atomic.py: a file is replaced whole or not at all, and a
failed write leaves no temporary file behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from vllm_triage.atomic import write_atomically


def test_text_and_bytes_replace_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "rules.yaml"
    target.write_text("old\n", encoding="utf-8")
    write_atomically(target, "new ✓\n")
    assert target.read_text(encoding="utf-8") == "new ✓\n"
    write_atomically(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rules.yaml"]


@pytest.mark.parametrize("fails_at", ["write", "replace"])
def test_a_full_disk_keeps_the_old_file_and_leaves_no_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails_at: str
) -> None:
    target = tmp_path / "report.html"
    target.write_text("old", encoding="utf-8")

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    real_fdopen = os.fdopen

    class FullDisk:
        """The temporary file, on a disk that takes no more bytes."""

        def __init__(self, fd: int, mode: str) -> None:
            self.file = real_fdopen(fd, mode)
            self.write = full

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *_: object) -> None:
            self.file.close()

    if fails_at == "replace":
        monkeypatch.setattr(os, "replace", full)
    else:
        monkeypatch.setattr(os, "fdopen", FullDisk)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(target, "new")
    assert target.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
