"""Hostile input, round two: the probe, the store, the receivers' identities and the
bounds on what a peer controls, each finding of the second round of probes as a test
against the daemon as its own process (``vllm-triage run``), with the figure it measures
(``pytest -n 0 -s tests/system/test_hostile_round_two.py | grep FIGURE``). The fleet's
findings are tested on the fleet's own ticks in tests/runtime/fleet/test_fleet.py
(``TestHostileAnswers``).

Every daemon here runs under an address-space limit (tests/support/daemonproc.py); each
test also holds the bounds every probe must leave: ``/healthz`` within a second, under
300 MB, no incident the target did not cause, no notification lost or misrouted.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_triage.assemble import unnamed_receiver

from support.daemonproc import (
    GOOD,
    RSS_MB,
    Daemon,
    Endless,
    body,
    cli,
    failures,
    figure,
    gzip_bomb,
    restarted,
    run_daemon,
    target,
)
from support.localserver import Exchange, LocalServer, serving
from support.scenarios import recorded

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def stuck_body() -> bytes:
    """GOOD with work outstanding; served unchanged, nothing moves: a hung engine."""
    text = GOOD.decode()
    for name, value in (("num_requests_waiting", "5.0"), ("num_requests_running", "2.0")):
        line = f'vllm:{name}{{engine="0",model_name="{MODEL}"}} 0.0'
        assert line in text, line
        text = text.replace(line, line.removesuffix("0.0") + value)
    return text.encode()


STUCK = stuck_body()
#: A hang is judged after this long (the default is 30 s): the tests need one quickly.
FAST_STALL = {"interval_seconds": 0.5, "thresholds": {"stall_after_seconds": 2}}


def incidents_opened(d: Daemon) -> float:
    return d.total("vllm_triage_incidents_opened_total")


def tracebacks(d: Daemon) -> list[str]:
    return [
        line for line in d.log_path.read_text(errors="replace").splitlines() if "Traceback" in line
    ]


class Receiver:
    """A webhook receiver on 127.0.0.1 that answers ``status`` (settable) and keeps the
    payloads it was sent."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.payloads: list[dict[str, Any]] = []

    def __call__(self, x: Exchange) -> None:
        if self.status == 200:
            self.payloads.append(json.loads(x.request.body))
        x.reply(self.status, b"{}", content_type="application/json")

    def firing(self) -> list[dict[str, Any]]:
        return [p for p in self.payloads if p.get("status") == "firing"]


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, LocalServer]]:
    rx = Receiver(status=503)
    with serving(rx) as server:
        yield rx, server


# -- 1. and 2. the active probe --------------------------------------------------------------


@contextlib.contextmanager
def servers(handlers: dict[str, Any]) -> Iterator[dict[str, LocalServer]]:
    """Several local servers at once, by name."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(serving(h)) for name, h in handlers.items()}


def nested_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.slow
def test_hostile_probe_answers_are_bad_answers_read_within_bounds(tmp_path: Path) -> None:
    """Before: the probe read any answer whole and inflated it without bound: a 3,477-byte
    stacked gzip took the daemon to 2.1 GB and froze /healthz for 7.6 s (a healthy target
    got 1 scrape in 25 s instead of 5); an endless answer 3.2 GB; one layer of 1 GiB
    3.0 GB. A deeply nested JSON answer raised RecursionError: the probe never recorded an
    answer, and an idle server that answers in 3 ms was paged as stalled, with a 30-line
    traceback per probe. Now each is a counted ``bad_response``, logged once; the engine,
    idle, is not judged stalled."""
    answers = {
        "stacked": body(gzip_bomb(2), Content_Encoding="gzip, gzip"),
        "one-layer": body(gzip_bomb(1), Content_Encoding="gzip"),
        "endless": Endless(),
        "nested": body(nested_json(200_000), Content_Type="application/json"),
    }
    with serving(body(GOOD)) as idle, servers(answers) as probes:
        config = {
            **FAST_STALL,
            "interval_seconds": 1.0,
            "targets": [
                target(
                    name,
                    idle.url("/metrics"),
                    probe={
                        "enabled": True,
                        "interval_seconds": 1,
                        "timeout_seconds": 5,
                        "url": probes[name].url("/v1/completions"),
                        "model": MODEL,
                    },
                )
                for name in answers
            ],
        }
        with run_daemon(tmp_path, config) as d:
            started = time.monotonic()
            latencies = d.watch(20.0)
            elapsed = time.monotonic() - started
            scrapes = {n: d.value("vllm_triage_scrapes_total", target=n) for n in answers}
            bad = {
                n: d.value("vllm_triage_probe_failures_total", target=n, reason="bad_response")
                for n in answers
            }
            opened, peak = incidents_opened(d), d.peak_mb()
            said = [e for e in d.logs() if e.get("event") == "probe_failed"]
            crashes = tracebacks(d)
    figure(
        "probe",
        peak_rss_mb=peak,
        healthz_max_s=max(latencies),
        min_scrapes=min(scrapes.values()),
        min_bad=min(bad.values()),
        incidents=opened,
        log_lines=len(said),
    )
    assert peak < RSS_MB, f"peak RSS {peak:.0f} MB"
    assert not restarted(latencies), f"/healthz: {latencies}"
    # One scrape a second: every target kept its schedule beside its hostile probe.
    assert min(scrapes.values()) >= 0.7 * elapsed, scrapes
    assert min(bad.values()) >= 5, bad
    assert opened == 0, "an idle server that answers was judged as an incident"
    assert not crashes, crashes[:3]
    # Logged once per target (then once a minute while it lasts).
    assert sorted(e["target"] for e in said) == sorted(answers), said


# -- 4. a full disk at start -----------------------------------------------------------------


def outbox_rows(state_dir: Path) -> dict[str, int]:
    """Pending notifications in the state file, by receiver key (read as a person would)."""
    conn = sqlite3.connect(f"file:{state_dir / 'state.sqlite3'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT receiver, COUNT(*) FROM outbox GROUP BY receiver").fetchall()
    finally:
        conn.close()
    return {str(k): int(n) for k, n in rows}


def hung(stuck: LocalServer, receivers: list[dict[str, Any]]) -> dict[str, Any]:
    """A daemon's settings: the hung target ``stuck`` serves, judged quickly."""
    return {
        **FAST_STALL,
        "targets": [target("hung", stuck.url("/metrics"))],
        "receivers": receivers,
    }


def pending_firing(tmp_path: Path, receivers: list[dict[str, Any]]) -> dict[str, int]:
    """Run a daemon on a hung target until its firing waits for every receiver (each
    answers 503), then stop it: what the state file holds, by receiver key."""
    with (
        serving(body(STUCK)) as stuck,
        run_daemon(
            tmp_path,
            hung(stuck, receivers),
            log_name="first.log",
        ) as d,
    ):
        assert d.until(
            lambda: d.total("vllm_triage_notifications_pending") >= len(receivers), timeout=40
        ), "the firing never waited for the receivers"
    return outbox_rows(tmp_path / "state")


@pytest.mark.slow
def test_a_full_disk_at_start_keeps_the_file_and_delivers_what_it_holds(
    tmp_path: Path, receiver: tuple[Receiver, LocalServer]
) -> None:
    """Before: "database or disk is full" and "disk I/O error" at start were taken for a
    corrupt file and moved aside: 0 of 5 pending notifications delivered, still 0 after the
    disk was freed and the daemon restarted. Now the file is kept, read read-only, its
    pending notifications delivered from memory (``vllm_triage_state_durable`` 0), and
    once the disk takes writes again the state is durable again."""
    rx, server = receiver
    receivers = [
        {
            "type": "alertmanager_webhook",
            "name": "pager",
            "url": server.url("/hook"),
            "retry_initial_seconds": 0.2,
        }
    ]
    before = pending_firing(tmp_path, receivers)
    assert before.get("pager", 0) >= 1, before
    rx.status = 200
    # Every file write past one byte fails (EFBIG), as on a full disk: the state file
    # and its journal cannot be written; the test copies the log through a pipe.
    with (
        serving(body(STUCK)) as stuck,
        run_daemon(
            tmp_path,
            hung(stuck, receivers),
            log_name="second.log",
            fsize=1,
        ) as d,
    ):
        delivered = d.until(lambda: len(rx.firing()) >= before["pager"], timeout=30)
        durable_full = d.value("vllm_triage_state_durable")
        degraded = [e for e in d.logs() if e.get("event") == "state_degraded"]
        resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        back = d.until(lambda: d.value("vllm_triage_state_durable") == 1, timeout=60)
        lost = [e for e in d.logs() if e.get("event") == "state_unreadable"]
    aside = sorted(p.name for p in (tmp_path / "state").iterdir() if "unreadable" in p.name)
    figure(
        "full-disk",
        pending_before=before["pager"],
        delivered=len(rx.firing()),
        durable_while_full=durable_full,
        durable_after=int(back),
    )
    assert delivered, f"{len(rx.firing())} of {before['pager']} pending delivered"
    assert degraded and durable_full == 0, (degraded, durable_full)
    assert not aside and not lost, (aside, lost)
    assert back, "the state never became durable again after the disk was freed"
    # Delivered once: the log of what the receiver was told was written back.
    assert outbox_rows(tmp_path / "state").get("pager", 0) == 0


# -- 5. unnamed receivers keep their identity ------------------------------------------------


@pytest.mark.slow
def test_an_unnamed_receiver_keeps_its_queue_when_another_is_inserted_before_it(
    tmp_path: Path, receiver: tuple[Receiver, LocalServer]
) -> None:
    """Before: unnamed receivers were keyed by position; inserting one before another of
    the same type handed the old one's pending notifications, and its log of what it was
    told, to the new one. Now each is keyed by its type and a hash of its URL."""
    old_rx, old = receiver
    hook = {"type": "alertmanager_webhook", "retry_initial_seconds": 0.2}
    before = pending_firing(tmp_path, [{**hook, "url": old.url("/hook")}])
    old_key = unnamed_receiver("alertmanager_webhook", old.url("/hook"))
    assert before == {old_key: before.get(old_key, 0)} and before[old_key] >= 1, before
    new_rx = Receiver(status=200)
    with serving(new_rx) as new, serving(body(STUCK)) as stuck:
        new_key = unnamed_receiver("alertmanager_webhook", new.url("/hook"))
        receivers = [{**hook, "url": new.url("/hook")}, {**hook, "url": old.url("/hook")}]
        with run_daemon(tmp_path, hung(stuck, receivers), log_name="second.log") as d:
            # The old receiver is still down: its queue must still be its own.
            d.until(lambda: len(new_rx.firing()) >= 1, timeout=30)
            time.sleep(2)
            pending_old = d.value("vllm_triage_notifications_pending", receiver=old_key)
            pending_new = d.value("vllm_triage_notifications_pending", receiver=new_key)
            old_rx.status = 200
            delivered = d.until(lambda: len(old_rx.firing()) >= before[old_key], timeout=30)
    figure(
        "receiver-keys",
        pending_before=before[old_key],
        pending_old_after=pending_old,
        pending_new_after=pending_new,
        new_told=len(new_rx.firing()),
    )
    assert pending_old >= before[old_key], (pending_old, before)
    assert pending_new == 0
    # The new receiver hears the open incident once, as a new receiver should.
    assert len(new_rx.firing()) == 1, new_rx.firing()
    assert delivered, "the old receiver's pending notifications never reached it"


# -- 7. counters, numbers, shutdown ----------------------------------------------------------


class Alternating:
    """A target behind a load balancer that alternates between two servers: every scrape
    reads as a counter reset."""

    def __init__(self, first: bytes, second: bytes) -> None:
        self.bodies = (first, second)
        self.n = 0

    def __call__(self, x: Exchange) -> None:
        self.n += 1
        x.reply(200, self.bodies[self.n % 2], content_type="text/plain; version=0.0.4")


def test_counters_going_back_scrape_after_scrape_leave_rates_out(tmp_path: Path) -> None:
    """Before: a target alternating between two servers read as a counter reset every
    scrape, and its rates came out 44x too high without a word. Now it is marked
    inconsistent (a metric, an event, evidence) and its rates are left out."""
    (_, young), (_, old) = (
        recorded("healthy", start_at=0, interval_s=5, duration_s=0)[0],
        recorded("healthy", start_at=0, interval_s=600, duration_s=600)[-1],
    )
    with (
        serving(Alternating(young.encode(), old.encode())) as lb,
        run_daemon(
            tmp_path, {"interval_seconds": 0.3, "targets": [target("lb", lb.url("/metrics"))]}
        ) as d,
    ):
        assert d.until(lambda: d.total("vllm_triage_counter_resets") >= 2)
        resets = d.total("vllm_triage_counter_resets")
        api = d.api("/api/v1/diagnoses?target=lb")
        said = [e for e in d.logs() if e.get("event") == "counters_inconsistent"]
        metrics = d.metrics()
    evidence = json.dumps(api)
    figure("alternating", resets=resets, log_lines=len(said))
    assert said and len(said) <= 2, said
    assert "counter_resets_in_window" in evidence
    assert "vllm_triage_generation_tokens_per_second{" not in metrics


def test_a_hex_float_value_is_read_as_prometheus_reads_it(tmp_path: Path) -> None:
    """Before: ``0x1p3`` failed the whole scrape; Prometheus reads it as 8."""
    text = GOOD.decode()
    line = f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0'
    hexed = text.replace(line, line.removesuffix("0.0") + "0x1p3").encode()
    with (
        serving(body(hexed)) as srv,
        run_daemon(
            tmp_path, {"interval_seconds": 0.3, "targets": [target("hex", srv.url("/metrics"))]}
        ) as d,
    ):
        assert d.until(lambda: d.value("vllm_triage_scrapes_total", target="hex") >= 3)
        up = d.value("vllm_triage_target_up", target="hex")
        parse = failures(d, "hex", "parse")
        running = d.value("vllm_triage_requests_running", target="hex")
    figure("hex-float", up=up, parse_failures=parse, running=running)
    assert up == 1 and parse == 0 and running == 8.0


def test_stopping_in_fleet_mode_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """Before: every fleet-mode stop printed a traceback (the tick's cancellation reached
    the scheduler). Now a stop is the usual "stopped" line."""

    def empty_api(x: Exchange) -> None:
        doc: dict[str, Any] = {"status": "success", "data": []}
        if x.request.method == "POST":
            doc["data"] = {"resultType": "vector", "result": []}
        x.reply(200, json.dumps(doc).encode(), content_type="application/json")

    with serving(empty_api) as api:
        config = {
            "source": "prometheus",
            "interval_seconds": 0.5,
            "prometheus": {"url": api.url(), "selector": '{job="vllm"}'},
        }
        with run_daemon(tmp_path, config) as d:
            assert d.until(lambda: d.value("vllm_triage_scrapes_total", target="prometheus") >= 3)
            proc = d.proc
    events = [e.get("event") for e in d.logs()]
    figure("fleet-stop", rc=proc.returncode, tracebacks=len(tracebacks(d)))
    assert proc.returncode == 0 and not tracebacks(d), tracebacks(d)[:3]
    assert "stopped" in " ".join(str(e) for e in events)


# -- 7. recordings and settings --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "200-MB"])
def test_a_hostile_recording_file_is_refused_quickly(tmp_path: Path, kind: str) -> None:
    """Before: a ``.prom`` that is /dev/zero ended in MemoryError, a FIFO blocked for
    ever, a 200 MB file was read whole before the line bound refused it. Now a recording
    holds regular files of at most 16 MiB, each read when its turn comes."""
    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "1767225600000.prom").write_bytes(GOOD)
    bad = rec / "1767225605000.prom"
    if kind == "dev-zero":
        bad.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(bad)
    else:
        with bad.open("wb") as f:
            f.truncate(200 * 2**20)
    rc, out, seconds, peak = cli("replay", str(rec))
    figure("recording", kind=kind, rc=rc, seconds=seconds, peak_rss_mb=peak)
    # Skipped and said (``--strict`` makes it an error); the rest of the recording is read.
    assert rc == 0 and "Traceback" not in out, out[:500]
    assert f"skipped {bad.name}" in out and "1 skipped" in out and len(out) < 2000, out[:500]
    assert peak < 150, f"peak RSS {peak:.0f} MB"  # the seconds are a figure, not a bound


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("interval_seconds", ".inf"),
        ("window_seconds", ".inf"),
        ("interval_seconds", "1e-9"),
        ("scrape_timeout_seconds", ".nan"),
    ],
)
def test_a_setting_that_is_no_finite_sane_duration_is_refused(
    tmp_path: Path, key: str, value: str
) -> None:
    """Before: ``inf`` and ``1e-9`` passed as intervals and windows (check-config printed
    ``Infinity``, which is not JSON; ``run`` crashed). Now: one error naming the key."""
    config = tmp_path / "triage.yaml"
    config.write_text(f"{key}: {value}\n")
    rc, out, _, _ = cli("check-config", "--config", str(config))
    figure("settings", key=key, value=value, rc=rc)
    assert rc == 2 and key in out and "Traceback" not in out, out[:500]
    assert "Infinity" not in out and "NaN" not in out
