"""Tests for daemon/vllm_triage/cli.py: the installed command, run as a user would, from elsewhere:
help, global flags, pipes, the version. Each subcommand has its own test_<command>_cmd.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.clirun import COMMAND, HANG_S, vllm_triage
from support.paths import PACKAGE, ROOT


class TestHelp:
    def test_help_lists_the_commands(self, tmp_path: Path) -> None:
        """--help explains the tool and names every subcommand."""
        result = vllm_triage("--help", cwd=tmp_path)
        assert result.returncode == 0
        commands = ("demo", "run", "check", "record", "replay", "report", "ceiling", "check-config")
        for command in commands:
            assert command in result.stdout
        assert "VLLM_TRIAGE_" in result.stdout

    def test_no_command_is_usage_error(self, tmp_path: Path) -> None:
        """With no subcommand it prints the help and exits 2."""
        result = vllm_triage(cwd=tmp_path)
        assert result.returncode == 2 and "usage:" in result.stdout

    def test_bad_flag_value(self, tmp_path: Path) -> None:
        """A nonsense flag value is refused by name."""
        result = vllm_triage(
            "record", "http://127.0.0.1:1/metrics", "--out", "x", "--interval", "-1", cwd=tmp_path
        )
        assert result.returncode == 2 and "--interval" in result.stderr


def closed_early(*args: str, cwd: Path) -> tuple[int, str]:
    """Run the command with its stdout a pipe whose reader has gone before the first
    line is written (what `| head -1` does once it has its line): exit code and stderr."""
    proc = subprocess.Popen(
        [str(COMMAND), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=HANG_S), err


class TestPipes:
    def test_ceiling_into_a_closed_pipe_is_quiet(self, tmp_path: Path) -> None:
        code, err = closed_early("ceiling", "--parameters-billion", "8", cwd=tmp_path)
        assert (code, err) == (0, "")

    def test_replay_into_a_closed_pipe_is_quiet(self, tmp_path: Path) -> None:
        made = vllm_triage(
            "simulate", "--scenario", "kv_pressure", "--record", "rec", "--duration", "120",
            cwd=tmp_path,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        for fmt in ("text", "json"):
            code, err = closed_early("replay", "rec", "--format", fmt, cwd=tmp_path)
            assert code == 0 and "Traceback" not in err and "BrokenPipe" not in err, err

    def test_head_reads_its_lines(self, tmp_path: Path) -> None:
        """Through a real shell pipe: `ceiling ... | head -2` prints two lines, exit 0."""
        done = subprocess.run(
            f"'{COMMAND}' ceiling --parameters-billion 8 | head -2; exit ${{PIPESTATUS[0]}}",
            shell=True,
            executable="/bin/bash",
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=HANG_S,
            check=False,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert len(done.stdout.splitlines()) == 2


class TestGlobalFlags:
    @pytest.mark.parametrize(
        "args",
        [
            ("--log-format", "json", "check-config"),
            ("check-config", "--log-format", "json"),
            ("check-config", "--log-level", "debug", "--log-format", "console"),
        ],
        ids=" ".join,
    )
    def test_before_or_after_the_command(self, tmp_path: Path, args: tuple[str, ...]) -> None:
        result = vllm_triage(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["window_seconds"] == 60

    def test_after_the_command_wins_over_before(self, tmp_path: Path) -> None:
        """`run --log-format console` once said "unrecognized arguments"; now it runs (and
        stops at the missing targets, a settings error: 2), logging as told."""
        result = vllm_triage("--log-format", "json", "run", "--log-format", "console", cwd=tmp_path)
        assert result.returncode == 2
        assert "unrecognized arguments" not in result.stderr
        assert "no targets" in result.stderr

    @pytest.mark.parametrize("command", ["run", "check", "demo", "replay", "ceiling"])
    def test_each_commands_help_lists_them(self, tmp_path: Path, command: str) -> None:
        result = vllm_triage(command, "--help", cwd=tmp_path)
        assert result.returncode == 0
        for flag in ("--log-level", "--log-format", "-V, --version"):
            assert flag in result.stdout


class TestVersion:
    @pytest.mark.parametrize("args", [("--version",), ("-V",), ("replay", "-V")], ids=" ".join)
    def test_version_names_the_commit(self, tmp_path: Path, args: tuple[str, ...]) -> None:
        """From this checkout (an editable install), the commit comes from git."""
        result = vllm_triage(*args, cwd=tmp_path)
        assert result.returncode == 0
        assert re.fullmatch(
            r"vllm-triage \d+\.\d+\.\d+ \(commit [0-9a-f]{12}(\+dirty)?\)\n", result.stdout
        ), result.stdout

    def test_a_wheel_built_from_a_clone_carries_its_commit(self, tmp_path: Path) -> None:
        """`pip install .` in a fresh clone: the wheel holds vllm_triage/_commit.txt (setup.py)."""
        repo = ROOT
        clone = tmp_path / "clone"
        git = ["git", "-c", "advice.detachedHead=false"]
        subprocess.run([*git, "clone", "-q", str(repo), str(clone)], check=True, timeout=HANG_S)
        head = subprocess.run(
            ["git", "-C", str(clone), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "-w",
                str(tmp_path),
                str(clone),
            ],
            check=True,
            timeout=HANG_S,
            capture_output=True,
        )
        [wheel] = tmp_path.glob("vllm_triage-*.whl")
        with zipfile.ZipFile(wheel) as z:
            assert z.read("vllm_triage/_commit.txt").decode().strip() == head
            names = z.namelist()
        # The import package is vllm_triage: nothing claims the top-level name `daemon`,
        # which python-daemon owns (installed beside it, one would shadow the other).
        assert {n.split("/")[0] for n in names if not n.startswith("vllm_triage-")} == {
            "vllm_triage"
        }
        # The wheel holds the package as the source root has it: every module (rules/,
        # linked in as bundled_rules, included), the data files each wing reads when
        # installed, and nothing else: no tests, no top-level `daemon`.
        assert set(names) - {"vllm_triage/_commit.txt"} - _dist_info(names) == _expected_files()
        for template in ("vllm-triage.rules.yaml.tmpl", "vllm-triage.json.tmpl"):
            assert f"vllm_triage/render/assets/{template}" in names, template


def _dist_info(names: list[str]) -> set[str]:
    return {n for n in names if n.split("/")[0].endswith(".dist-info")}


#: The data files shipped beside the modules (pyproject.toml's package-data). The
#: bundled rules are not listed here: every file of rules/ ships, whatever folder it is
#: in (a new folder the package-data forgets fails here), but for rules/prometheus/,
#: which users copy into their Prometheus from the repository or `render`.
_DATA = (
    "py.typed",
    "page/assets/*.html",
    "page/assets/*.js",
    "page/assets/*.css",
    "page/assets/vendor/*",
    "render/assets/*.tmpl",
)


def _expected_files() -> set[str]:
    """What the wheel must hold, read from the source root (the link to rules/ followed)."""
    files = {
        Path(folder, name)
        for folder, _, names in os.walk(PACKAGE, followlinks=True)
        for name in names
        if name.endswith(".py") and "__pycache__" not in Path(folder).parts
    }
    for pattern in _DATA:
        files |= {p for p in PACKAGE.glob(pattern) if p.is_file()}
    rules = PACKAGE / "bundled_rules"
    files |= {
        p
        for p in rules.rglob("*")
        if p.is_file()
        and p.relative_to(rules).parts[0] != "prometheus"
        and "__pycache__" not in p.parts
    }
    return {"vllm_triage/" + p.relative_to(PACKAGE).as_posix() for p in files}


class TestMisspeltVariables:
    def test_refused_with_a_did_you_mean_exit_2(self, tmp_path: Path) -> None:
        """`VLLM_TRIAGE_INTERVAL_SECOND=1 vllm-triage check-config` once exited 0 having
        changed nothing."""
        env = {**os.environ, "VLLM_TRIAGE_INTERVAL_SECOND": "1"}
        result = subprocess.run(
            [str(COMMAND), "check-config"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_S,
            check=False,
        )
        assert result.returncode == 2
        assert (
            "VLLM_TRIAGE_INTERVAL_SECOND: unknown variable; "
            "did you mean VLLM_TRIAGE_INTERVAL_SECONDS?"
        ) in result.stderr
