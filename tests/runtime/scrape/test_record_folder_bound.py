"""Recording is bounded by the folder, not the process (daemon/vllm_triage/scrape/keep.py),
and a recording the disk cannot hold is refused at start (``assemble.check_record_room``);
the sidecar's manifest sets the bound below its volume (deploy/kubernetes/).

Before: ``run --record``'s byte cap counted this process's writes only: three starts
wrote three times the cap, and a crash-looping pod filled its disk. The sidecar's only
writable volume is a 64 Mi ``emptyDir`` while the default cap is 1 GiB: recording there
got the whole pod evicted, vLLM included."""

from __future__ import annotations

import os
import re
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
import yaml
from structlog.testing import capture_logs

from vllm_triage import assemble
from vllm_triage.assemble import RECORD_DISK_RESERVE, check_record_room
from vllm_triage.config.load import load_settings
from vllm_triage.errors import ConfigError
from vllm_triage.scrape.keep import ScrapeKeeper, folder_bytes

from support.paths import ROOT

MIB = 2**20
KDIR = ROOT / "deploy" / "kubernetes"


def fill(folder: Path, files: int, size: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (folder / f"{1_767_225_600_000 + i}.prom").write_bytes(b"x" * size)


class TestTheFolderIsTheBound:
    def test_what_the_folder_holds_counts(self, tmp_path: Path) -> None:
        folder = tmp_path / "rec" / "t"
        fill(folder, 9, 100_000)  # 900 KB from earlier runs
        keeper = ScrapeKeeper("t", folder, max_bytes=MIB)
        body = b"y" * 50_000
        for i in range(5):
            keeper.keep(1_767_300_000 + i, body)
        st = keeper.stats
        # 900,000 + 50,000 x 2 fits 1 MiB (1,048,576); the third would not.
        assert (st.bytes_found, st.written, st.failures["full"]) == (900_000, 2, 3)
        assert folder_bytes(folder) <= MIB

    def test_three_starts_write_the_bound_once(self, tmp_path: Path) -> None:
        folder = tmp_path / "t"
        body = b"z" * 100_000
        written = []
        for start in range(3):
            keeper = ScrapeKeeper("t", folder, max_bytes=MIB)
            for i in range(20):
                keeper.keep(1_767_300_000 + 100 * start + i, body)
            written.append(keeper.stats.written)
        assert written == [10, 0, 0] and folder_bytes(folder) == 1_000_000

    def test_a_full_folder_is_said_at_start(self, tmp_path: Path) -> None:
        fill(tmp_path / "t", 11, 100_000)
        with capture_logs() as logs:
            ScrapeKeeper("t", tmp_path / "t", max_bytes=MIB)
        said = [e for e in logs if e["event"] == "recording_full"]
        assert len(said) == 1 and said[0]["bytes"] == 1_100_000

    def test_only_the_folders_own_files_count(self, tmp_path: Path) -> None:
        fill(tmp_path / "t", 2, 1000)
        fill(tmp_path / "t" / "sub", 5, 1000)
        (tmp_path / "t" / "link").symlink_to(
            tmp_path / "t" / "sub" / os.listdir(tmp_path / "t" / "sub")[0]
        )
        assert folder_bytes(tmp_path / "t") == 2000
        assert folder_bytes(tmp_path / "missing") == 0


Usage = namedtuple("Usage", "total used free")


def recording(tmp_path: Path, max_bytes: int, targets: int = 2) -> Any:
    return load_settings(
        flags={
            "targets": [
                {"name": f"t{i}", "url": "http://127.0.0.1:1/metrics"} for i in range(targets)
            ],
            "record": {"dir": str(tmp_path / "rec"), "max_bytes": max_bytes},
        }
    )


class TestTheDiskMustHoldTheBound:
    def test_a_bound_the_disk_cannot_hold_is_refused(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(assemble.shutil, "disk_usage", lambda _: Usage(0, 0, 64 * MIB))
        with pytest.raises(ConfigError, match=r"record\.max_bytes: 2 target\(s\) x 32 MiB"):
            check_record_room(recording(tmp_path, 32 * MIB))
        check_record_room(recording(tmp_path, 16 * MIB))  # 32 + 16 of reserve: fits

    def test_what_the_folders_hold_already_is_not_needed_again(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        fill(tmp_path / "rec" / "t0", 30, MIB)
        fill(tmp_path / "rec" / "t1", 30, MIB)
        monkeypatch.setattr(assemble.shutil, "disk_usage", lambda _: Usage(0, 0, 20 * MIB))
        check_record_room(recording(tmp_path, 32 * MIB))
        with pytest.raises(ConfigError):
            check_record_room(recording(tmp_path, 40 * MIB))


def quantity(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", text).groups()  # type: ignore[union-attr]
    return int(number) * {"Mi": MIB, "Gi": 1024 * MIB}[unit]


def test_the_sidecar_bounds_recording_below_its_volume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recording's bound, set where the settings file cannot override it, plus the
    state store's reserve, fits the one writable volume: recording cannot evict the pod."""
    (patch,) = yaml.safe_load_all((KDIR / "sidecar-patch.yaml").read_text())
    pod = patch["spec"]["template"]["spec"]
    (sidecar,) = [c for c in pod["initContainers"] if c["name"] == "vllm-triage"]
    env = {e["name"]: e.get("value") for e in sidecar.get("env", [])}
    writable = [m for m in sidecar["volumeMounts"] if not m.get("readOnly")]
    (state,) = [v for v in pod["volumes"] if v["name"] == writable[0]["name"]]
    assert len(writable) == 1 and sidecar["securityContext"]["readOnlyRootFilesystem"]
    (config,) = yaml.safe_load_all((KDIR / "configmap.yaml").read_text())
    file = yaml.safe_load(config["data"]["triage.yaml"])
    # The variable wins over the settings file, and over `record: {max_bytes}` in it.
    file["record"] = {"dir": writable[0]["mountPath"] + "/rec", "max_bytes": 10 * 2**30}
    path = tmp_path / "triage.yaml"
    path.write_text(yaml.safe_dump(file))
    monkeypatch.setenv("VLLM_TRIAGE_RECORD__MAX_BYTES", env["VLLM_TRIAGE_RECORD__MAX_BYTES"])
    settings = load_settings(path)
    bound = settings.record.max_bytes * len(settings.targets) + RECORD_DISK_RESERVE
    assert bound <= quantity(state["emptyDir"]["sizeLimit"]), (bound, state)
