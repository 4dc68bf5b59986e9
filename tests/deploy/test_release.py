"""The release (.github/workflows/release.yml): it passes actionlint and zizmor offline,
publishes what CI builds (the wheel and the sdist, .ci/dists), and the image it pushes is
the one the Kubernetes sidecar names, at the package's version.

No registry or GitHub runner is reachable where this project is built: these checks keep
the workflow true to the repository instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_triage import __version__
from vllm_triage.render.sidecar import IMAGE_REPOSITORY

from support.clirun import HANG_S
from support.paths import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
PATCH = ROOT / "deploy" / "kubernetes" / "sidecar-patch.yaml"


def tool(name: str) -> str:
    sibling = Path(sys.executable).parent / name
    found = str(sibling) if sibling.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: it is in the test extras (pip install -e '.[test]')")
    return found


def workflow() -> dict[Any, Any]:
    found: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    return found


def steps(job: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = workflow()["jobs"][job]["steps"]
    return found


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=HANG_S, check=False)


def test_actionlint_passes() -> None:
    result = run(tool("actionlint"), "-no-color", str(WORKFLOW))
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_passes_offline_even_pedantic() -> None:
    result = run(tool("zizmor"), "--offline", "--persona", "pedantic", str(WORKFLOW))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings" in result.stdout + result.stderr


def test_it_runs_on_a_version_tag_and_checks_the_tag_is_the_version() -> None:
    doc = workflow()
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert on == {"push": {"tags": ["v*"]}}
    check = next(s for s in steps("build") if s.get("id") == "version")
    assert "pyproject.toml" in check["run"] and '"v${version}" != "${TAG}"' in check["run"]
    assert check["env"] == {"TAG": "${{ github.ref_name }}"}
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version == __version__


def test_pypi_by_trusted_publishing_only() -> None:
    """An OIDC token, no password or API token anywhere; the wheel and sdist the build
    job made and checked."""
    job = workflow()["jobs"]["pypi"]
    assert job["permissions"] == {"id-token": "write"}
    assert job["environment"]["name"] == "pypi" and job["needs"] == "build"
    [publish] = [s for s in job["steps"] if "gh-action-pypi-publish" in s.get("uses", "")]
    assert "with" not in publish
    assert "secrets." not in WORKFLOW.read_text().split("pypi:", 1)[1].split("image:", 1)[0]
    build = "\n".join(s.get("run", "") for s in steps("build"))
    assert "python -m build" in build and "import vllm_triage.cli" in build


def test_the_image_is_multi_arch_and_the_one_the_sidecar_names() -> None:
    doc = workflow()
    assert doc["env"]["IMAGE"] == IMAGE_REPOSITORY
    [push] = [s for s in steps("image") if "build-push-action" in s.get("uses", "")]
    assert set(push["with"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert push["with"]["tags"] == "${{ env.IMAGE }}:${{ needs.build.outputs.version }}"
    assert doc["jobs"]["image"]["permissions"] == {"contents": "read", "packages": "write"}
    pinned = re.findall(r"^\s+image: (\S+)$", PATCH.read_text(encoding="utf-8"), re.M)
    assert pinned == [f"{IMAGE_REPOSITORY}:{__version__}"]


def test_every_action_is_pinned_to_a_commit() -> None:
    uses = re.findall(r"uses: (\S+)", WORKFLOW.read_text(encoding="utf-8"))
    assert uses
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), ref


def test_ci_builds_installs_and_imports_both() -> None:
    """.ci/run runs .ci/dists, which builds both and installs each from a clean
    environment (the build itself runs in CI: it takes a minute)."""
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash .ci/dists" in script
    dists = (ROOT / ".ci" / "dists").read_text(encoding="utf-8")
    assert "python -m build" in dists and '*.whl "$out"/dist/*.tar.gz' in dists
    assert 'python3 -m venv "$venv"' in dists and "import vllm_triage.cli" in dists
