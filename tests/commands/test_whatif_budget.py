"""``whatif`` has a budget (daemon/vllm_triage/whatif/budget.py): an implausible window and
a change beyond the bounds are refused with the reason, a replay's requests, steps,
tokens, scrapes and wall time are bounded, its temporary folder goes even when it is
killed, and ``--target`` shows its URL without the secrets.

Before (each measured on the committed ``queue`` recording): 1e12 requests waiting, a
first-token counter that jumps by 1e12, or ``arrival_rate_scale=1e6`` ran past 90-120 s at
0.8-2.2 GB, still growing; ``1e300`` never advanced time; scrapes 1 ms apart ran past two
minutes; ``tensor_parallel_size=1000000`` gave a confident table; a killed run left its
temporary folder; ``--target`` printed the URL's password and token. The tests assert
counts and bounds; time and memory are measured in bench/bench_hostile.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_triage.assemble import build_evaluator
from vllm_triage.config.load import load_settings
from vllm_triage.core.evaluate import Evaluator
from vllm_triage.whatif import calibrate
from vllm_triage.whatif.budget import (
    MAX_PHASES,
    MIN_REPLAY_INTERVAL,
    Budget,
    BudgetError,
    merged,
    replay_interval,
)
from vllm_triage.whatif.calibrate import whatif
from vllm_triage.whatif.window import read_window

from support.clirun import COMMAND, HANG_S, vllm_triage
from support.daemonproc import GOOD, SECRET, body
from support.harness import wait_for
from support.localserver import serving
from support.paths import REALVLLM, RECORDINGS

QUEUE = RECORDINGS / "queue"
CPU = load_settings(REALVLLM / "triage-cpu.yaml")


def probe(tmp_path: Path, name: str, change: object) -> Path:
    """The queue recording with ``change(index, text, stem) -> (text, stem)`` applied."""
    out = tmp_path / name
    out.mkdir()
    files = sorted(QUEUE.glob("*.prom"))
    for i, f in enumerate(files):
        text, stem = change(i, len(files), f.read_text(), int(f.stem))  # type: ignore[operator]
        (out / f"{stem}.prom").write_text(text)
    return out


def waiting_1e12(i: int, n: int, text: str, stem: int) -> tuple[str, int]:
    return re.sub(r"(vllm:num_requests_waiting\{[^}]*\}) \S+", r"\1 1e12", text), stem


def first_tokens_jump(i: int, n: int, text: str, stem: int) -> tuple[str, int]:
    if i < n - 3:
        return text, stem

    def bump(m: re.Match[str]) -> str:
        return f"{m.group(1)} {float(m.group(2)) + 1e12}"

    pattern = r"(vllm:time_to_first_token_seconds_(?:count|bucket)\{[^}]*\}) (\S+)"
    return re.sub(pattern, bump, text), stem


def one_ms_apart(i: int, n: int, text: str, stem: int) -> tuple[str, int]:
    return text, 1_795_993_434_638 + i


class TestImplausibleWindows:
    @pytest.mark.parametrize(
        ("change", "at", "says"),
        [
            (waiting_1e12, [], "1,000,000,000,000 requests waiting"),
            (first_tokens_jump, ["--at", "1000"], "arrivals a second"),
        ],
        ids=["waiting-1e12", "counter-jump-1e12"],
    )
    def test_refused_with_the_reason(
        self, tmp_path: Path, change: object, at: list[str], says: str
    ) -> None:
        rec = probe(tmp_path, "rec", change)
        out = vllm_triage("whatif", str(rec), *at, cwd=tmp_path)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "implausible" in out.stderr and says in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and not out.stdout

    def test_scrapes_1_ms_apart_replay_at_a_bounded_pace(self, tmp_path: Path) -> None:
        """The window's 1 ms intervals are merged into at most MAX_PHASES phases and the
        replay scrapes at least MIN_REPLAY_INTERVAL apart: counted, evaluation by
        evaluation."""
        rec = probe(tmp_path, "rec", one_ms_apart)
        obs = read_window(rec, build_evaluator(CPU))
        steps: list[int] = []

        def counting() -> Evaluator:
            ev = build_evaluator(CPU)
            step = ev.step

            def counted(snapshot):  # type: ignore[no-untyped-def]
                steps.append(1)
                return step(snapshot)

            ev.step = counted  # type: ignore[method-assign]
            return ev

        budget = Budget()
        result = whatif(obs, counting, {"max_num_seqs": 8}, budget)
        duration = calibrate.scenario(obs, calibrate.base_server(obs)).duration_s
        per_replay = duration / MIN_REPLAY_INTERVAL + 1
        assert result.after and 2 <= budget.replays <= calibrate.FIT_ROUNDS + 1
        assert len(steps) <= budget.replays * per_replay, (len(steps), budget.replays)


class TestChangesBeyondTheBounds:
    @pytest.mark.parametrize(
        ("change", "says"),
        [
            ("arrival_rate_scale=1e6", "at most a thousand times"),
            ("arrival_rate_scale=1e300", "at most a thousand times"),
            ("arrival_rate_scale=1e-300", "from 0.001"),
            ("tensor_parallel_size=1000000", "beyond the card table"),
            ("replicas=100000000", "at most 10,000"),
            ("max_num_seqs=1000000000", "at most 16,384"),
        ],
    )
    def test_refused_exit_2(self, tmp_path: Path, change: str, says: str) -> None:
        out = vllm_triage("whatif", str(QUEUE), "--change", change, cwd=tmp_path)
        assert out.returncode == 2 and says in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and not out.stdout

    def test_a_scale_that_would_simulate_too_many_requests(self, tmp_path: Path) -> None:
        """Within the scale's bound, the requests a replay would simulate are counted
        before it runs."""
        obs = read_window(QUEUE, build_evaluator(CPU))
        budget = Budget(max_requests=20_000)
        with pytest.raises(BudgetError, match="requests") as caught:
            whatif(obs, lambda: build_evaluator(CPU), {"arrival_rate_scale": 1000.0}, budget)
        said = str(caught.value)
        assert "x 1000" in said and "more than whatif simulates in one run (20,000)" in said
        # The calibration's replays ran; the scaled one was refused before it began.
        assert 1 <= budget.replays <= calibrate.FIT_ROUNDS


class TestTheBudget:
    def test_steps_past_the_bound_stop_the_replay(self) -> None:
        obs = read_window(QUEUE, build_evaluator(CPU))
        budget = Budget(max_steps=50)
        with pytest.raises(BudgetError, match="engine steps"):
            whatif(obs, lambda: build_evaluator(CPU), {}, budget)
        assert budget.replays == 1

    def test_wall_time_past_the_bound_stops_the_replay(self) -> None:
        """A clock that has run past the bound by the first look: refused there."""
        ticks = iter([0.0] + [1e6] * 1000)
        obs = read_window(QUEUE, build_evaluator(CPU))
        budget = Budget(clock=lambda: next(ticks))
        with pytest.raises(BudgetError, match="wall time"):
            whatif(obs, lambda: build_evaluator(CPU), {}, budget)

    def test_merged_keeps_every_arrival(self) -> None:
        intervals = tuple((0.001, float(i % 7)) for i in range(60_000))
        out = merged(intervals)
        assert len(out) <= MAX_PHASES
        assert sum(a for _, a in out) == sum(a for _, a in intervals)
        assert sum(s for s, _ in out) == pytest.approx(60.0)
        assert replay_interval(60.0, 60_000) == MIN_REPLAY_INTERVAL
        assert replay_interval(60.0, 30) == 2.0


# -- --target: the URL's secrets, the temporary folder ---------------------------------------


def test_target_shows_its_url_without_the_secrets(tmp_path: Path) -> None:
    with serving(body(GOOD)) as server:
        host = server.url("/metrics").removeprefix("http://")
        url = f"http://user:{SECRET}@{host}?token={SECRET}"
        out = vllm_triage(
            "whatif", "--target", url, "--window", "1", "--interval", "0.25", cwd=tmp_path
        )
    said = out.stdout + out.stderr
    assert "watching http://" in said and SECRET not in said, said


def whatif_watching(tmp: Path, url: str) -> subprocess.Popen[str]:
    """``whatif --target`` watching for a minute, its temporary folder under ``tmp``."""
    return subprocess.Popen(
        [str(COMMAND), "whatif", "--target", url, "--window", "60", "--interval", "0.5"],
        cwd=tmp,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def folders(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("vllm-triage-whatif-*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_killed_run_leaves_no_temporary_folder(tmp_path: Path, sig: signal.Signals) -> None:
    with serving(body(GOOD)) as server:
        proc = whatif_watching(tmp_path, server.url("/metrics"))
        try:
            # A guard against a hang, not a measure: the first scrape kept, or the end.
            kept = "vllm-triage-whatif-*/*.prom"
            wait_for(
                lambda: list(tmp_path.glob(kept)) or proc.poll() is not None,
                timeout=HANG_S,
                every=0.1,
            )
            assert proc.poll() is None, proc.stderr
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=HANG_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    # SIGTERM: 143; SIGINT ends the watch early, one scrape is no window: exit 1.
    assert proc.returncode in (143, 1) and "Traceback" not in err, err
    assert folders(tmp_path) == []


def test_the_folder_of_a_run_killed_outright_is_removed_by_the_next(tmp_path: Path) -> None:
    """SIGKILL runs no handler: the folder stays, named for its process; the next run
    removes the folders of processes that are gone (and leaves a live one's)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = tmp_path / f"vllm-triage-whatif-{gone.pid}-abc"
    (orphan / "x").mkdir(parents=True)
    alive = tmp_path / f"vllm-triage-whatif-{os.getpid()}-def"
    alive.mkdir()
    out = vllm_triage("whatif", str(QUEUE), cwd=tmp_path, env={"TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert folders(tmp_path) == [alive]
    shutil.rmtree(alive)
