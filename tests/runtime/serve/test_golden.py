"""The exporter end to end, as node_exporter tests its collectors: committed real-vLLM
recordings replayed through the daemon's watcher and rendered as ``/metrics`` must equal
``tests/golden/metrics.prom`` byte for byte, and promtool must find nothing in it.

A deliberate change to the exports regenerates the file with
``.venv/bin/python tests/support/golden_metrics.py`` (see that module); read the diff.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from support.clirun import HANG_S
from support.golden_metrics import GOLDEN, render
from support.paths import ROOT


def test_metrics_equal_the_golden_file() -> None:
    want = GOLDEN.read_text(encoding="utf-8")
    got = render()
    assert got == want, "exports changed: regenerate with `python tests/support/golden_metrics.py`"


def test_the_golden_file_shows_both_incidents() -> None:
    """The file is not empty of meaning: the KV recording fires kv_pressure, the decode
    recording decode_bound with its ceiling ratio, as the recordings were made to."""
    text = GOLDEN.read_text(encoding="utf-8")
    assert (
        'vllm_triage_diagnosis{diagnosis="kv_pressure",model_name="tiny-llama",runtime="vllm",'
        'target="kv"} 1.0' in text
    )
    decode = 'diagnosis="decode_bound",model_name="tiny-llama",runtime="vllm",target="decode"} 1.0'
    assert "vllm_triage_diagnosis{" + decode in text
    ours = 'model_name="tiny-llama",runtime="vllm",target="decode"}'
    assert "vllm_triage_decode_ceiling_ratio{" + ours in text
    assert "vllm_triage_decode_roofline_ratio{" + ours in text
    for part in ("weights", "kv"):
        assert f'vllm_triage_decode_step_bytes{{model_name="tiny-llama",part="{part}"' in text


@pytest.mark.prometheus
def test_promtool_finds_nothing_in_the_golden_file() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: install Debian's prometheus package")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=GOLDEN.read_text(encoding="utf-8"),
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_the_docs_name_every_exported_metric_in_full() -> None:
    """Each family in the golden output appears, spelt out, in the derived metrics table of
    docs/operations.md (an abbreviation once hid that the table said notifications_retries
    for notification_retries)."""
    doc = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    families = {
        line.split()[2]
        for line in GOLDEN.read_text(encoding="utf-8").splitlines()
        if line.startswith("# TYPE vllm_triage_")
    }
    assert families, "no families in the golden file"
    missing = sorted(f for f in families if f"`{f}" not in doc)
    assert missing == [], missing
