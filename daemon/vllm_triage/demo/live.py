"""``vllm-triage demo``: the simulator's ``tour`` and the daemon, live, in one command.

Three pieces run in this process, over real sockets on 127.0.0.1: a simulated vLLM
server (``simulator.serve``) playing a scenario at ``speed`` times real time, the daemon
(``assemble.build_daemon``, exactly as ``run`` starts it) scraping it, and a webhook receiver
(``sink``) that the daemon's Alertmanager-format notifications are delivered to.

The daemon's clock runs at the simulator's speed (one ``Pace``, shared), so its 60 s
window, its scrape interval (5 simulated seconds) and the incident timings are those of
a real server watched in real time: only the wall clock is faster. On a host that cannot
keep up, the demo slows that pace down (``demo.pacing``); what is judged stays in the
scenario's seconds.

The verdict is what the receiver got (the whole pipeline, not the core alone), checked
against what each phase of the scenario was built to show (``demo.expectations``).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from vllm_triage.assemble import build_daemon, report_parts
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.core.model import Transition
from vllm_triage.core.report import transition_text
from vllm_triage.demo.expectations import Event, Segment, problems, segments
from vllm_triage.demo.offline import START_AT, TAIL_S, expected_of, scenario_facts
from vllm_triage.demo.pacing import LATE_SHARE, Pacer, Strain
from vllm_triage.demo.sink import WebhookSink
from vllm_triage.demo.tour_report import demo_folder, folder_size, write_diagnosis_settings
from vllm_triage.demo.view import DemoTarget, render, status_lines
from vllm_triage.errors import ConfigError, RecordingError
from vllm_triage.recording.reportfile import WrittenReport, write_report
from vllm_triage.service import Daemon
from vllm_triage.simulator import Scenario, get_scenario
from vllm_triage.simulator.serve import Pace, SimulatedServer

#: The default target: the tour through every cause, on one card.
DEFAULT_LIVE = ("tour",)
#: Simulated seconds between scrapes, as a default `run` would do in real time.
SCRAPE_EVERY_SIM_S = 5.0
REDRAW_S = 0.5
#: Off a terminal, the signals are printed this often (simulated seconds).
STATUS_EVERY_SIM_S = 30.0
#: Home the cursor and clear the screen: the view redraws in place on a terminal.
CLEAR = "\x1b[H\x1b[2J"


def scaled_clock(speed: float, origin: float = START_AT) -> Callable[[], float]:
    """Unix time that runs ``speed`` times faster than the wall, from ``origin``."""
    t0 = time.monotonic()
    return lambda: origin + (time.monotonic() - t0) * speed


def shared_slo(scenarios: Mapping[str, Scenario]) -> dict[str, float]:
    """The SLOs the scenarios are built for; one daemon judges them all with one set, so
    scenarios built for different SLOs cannot share a run."""
    slos = {name: dict(s.slo) for name, s in scenarios.items()}
    first = next(iter(slos.values()), {})
    if any(slo != first for slo in slos.values()):
        shown = "; ".join(f"{n}: {slo or 'the defaults'}" for n, slo in slos.items())
        raise ConfigError(
            f"these scenarios are built for different SLOs ({shown}); run them one at a time"
        )
    return first


def _when(text: str) -> float:
    """An Alertmanager time (RFC 3339, UTC) as unix seconds."""
    return datetime.fromisoformat(text).timestamp()


@dataclass(slots=True)
class LiveDemoResult:
    #: Per target, the transitions its alerts told the receiver (seconds since the start).
    events: dict[str, list[Event]] = field(default_factory=dict)
    still_firing: dict[str, list[str]] = field(default_factory=dict)
    segments: dict[str, list[Segment]] = field(default_factory=dict)
    delivered: int = 0
    failed: int = 0
    #: The first notification the receiver got, as it arrived.
    first_payload: dict[str, Any] | None = None
    #: Every notification the receiver got, in order.
    received: list[dict[str, Any]] = field(default_factory=list)
    #: Stopped by Ctrl-C (or SIGTERM) before the scenario was over.
    interrupted: bool = False
    #: Per target, the daemon's failed scrapes of the simulator, by reason.
    scrape_failures: dict[str, dict[str, int]] = field(default_factory=dict)
    #: The speed asked for; the pace it ended at (lower if it slowed itself), and how.
    speed: float = 0.0
    pacer: Pacer | None = None
    #: Signs that the host could not keep up (skipped, late and failed scrapes, a
    #: simulator behind its clock).
    strain: Strain = field(default_factory=Strain)
    #: The daemon's log (JSON lines), kept out of the demo's own output.
    log_file: Path | None = None
    #: The post-mortem of the recorded target (``tour_report``), and where it lives.
    report: WrittenReport | None = None
    report_error: str = ""
    #: The folder the demo leaves behind (the recordings and the report), and its size.
    recording: Path | None = None
    recording_bytes: int = 0
    #: The diagnosis settings of the reported target, for `replay --config`.
    settings_file: Path | None = None
    status_url: str = ""

    def fired(self, name: str) -> list[str]:
        return [e.cause for e in self.events.get(name, []) if e.event == "firing"]

    def resolved(self, name: str) -> list[str]:
        return [e.cause for e in self.events.get(name, []) if e.event == "resolved"]

    @property
    def host_too_slow(self) -> bool:
        """The scenario did not come out as built on a host that showed strain: the host
        may be why, so it cannot be judged (``demo`` exits 3, as ``check``'s "cannot
        tell"). On a host that kept up, a failed check is the diagnosis's."""
        return self.strain.shown and not all(ok for ok, _ in self.verdicts().values())

    def verdicts(self) -> dict[str, tuple[bool, str]]:
        """Per target: as built or not, and why (every problem, or what fired)."""
        out = {}
        for name, events in self.events.items():
            segs = self.segments.get(name, [])
            if not segs:
                out[name] = (True, "no expectations stated; see what fired")
                continue
            found = problems(segs, events, still_firing=self.still_firing.get(name, []))
            if found:
                out[name] = (False, "; ".join(found))
            else:
                causes = [s.expect for s in segs if s.expect != "healthy"]
                said = ", ".join(causes) if causes else "nothing (healthy)"
                out[name] = (True, f"each phase's own cause fired first, nothing else: {said}")
        return out


def demo_settings(
    config: str | None,
    *,
    scenarios: dict[str, Scenario],
    urls: dict[str, str],
    speed: float,
    listen: str,
    sink_url: str,
    record_dir: Path | None = None,
) -> Settings:
    """The daemon's settings: the scenarios' own SLOs under the user's file and variables,
    a scrape every 5 simulated seconds, each target told its card, the local receiver,
    and (``record_dir``) the daemon's own recording of each target, for the report."""
    slo = shared_slo(scenarios)
    return load_settings(
        config,
        {
            "listen": listen,
            "interval_seconds": SCRAPE_EVERY_SIM_S / speed,
            # Wall seconds: a simulator that falls behind on a busy machine answers late
            # rather than not at all (the ticks in between are skipped, and counted).
            "scrape_timeout_seconds": 10.0,
            "shutdown_grace_seconds": 5.0,
            "targets": [
                {"name": name, "url": urls[name], **scenario_facts(s)}
                for name, s in scenarios.items()
            ],
            "receivers": [
                {
                    "type": "alertmanager_webhook",
                    "name": "demo-receiver",
                    "url": sink_url,
                    "retry_initial_seconds": 0.1,
                    "retry_max_seconds": 1.0,
                }
            ],
            **({"record": {"dir": str(record_dir)}} if record_dir is not None else {}),
        },
        base={"slo": slo} if slo else None,
    )


def run_live_demo(
    names: tuple[str, ...],
    *,
    speed: float,
    listen: str,
    config: str | None,
    duration_s: float | None,
    out: Callable[[str], None] = print,
    tty: bool | None = None,
    keep_running: bool = False,
    report: Callable[[LiveDemoResult], None] | None = None,
    record_dir: Path | None = None,
    log_file: Path | None = None,
) -> LiveDemoResult:
    """Run the demo; ``report`` is called with the result when the scenario is over (with
    ``keep_running``, before the demo waits for Ctrl-C with its URLs still serving). The
    daemon's recordings and the report go to ``record_dir`` (else a new temporary
    folder), which is left for the user (``demo.tour_report``). ``log_file``: where the
    caller sent the log lines, to be named in the output."""
    scenarios = {name: get_scenario(name) for name in names}
    total = duration_s or max(s.duration_s for s in scenarios.values()) + TAIL_S
    # One scenario clock for the simulators and the daemon; the demo may slow it down.
    pace = Pace(speed)
    servers = {
        name: SimulatedServer(s, host="127.0.0.1", port=0, speed=speed, naming="v1", pace=pace)
        for name, s in scenarios.items()
    }
    stop_sims = threading.Event()
    threads = [
        threading.Thread(target=srv.run, args=(stop_sims.is_set,), daemon=True, name=name)
        for name, srv in servers.items()
    ]
    urls = {n: f"http://127.0.0.1:{srv.address[1]}/metrics" for n, srv in servers.items()}
    # The daemon keeps its alert state as `run` does, in a folder that goes with the demo.
    # The daemon records what it scrapes itself (`run --record`): the report is made from
    # exactly what the alerts were judged on.
    kept = demo_folder(record_dir)
    with WebhookSink() as sink, tempfile.TemporaryDirectory(prefix="vllm-triage-demo-") as tmp:
        state = Path(tmp)

        def settings(at: str) -> Settings:
            return demo_settings(
                config,
                scenarios=scenarios,
                urls=urls,
                speed=speed,
                listen=at,
                sink_url=sink.url,
                record_dir=kept,
            )

        def clock() -> float:
            return START_AT + pace()

        try:
            own = settings(listen)
            daemon = build_daemon(own, clock=clock, default_state_dir=state)
        except OSError:
            # The default port is taken (another daemon?): any free port will do.
            own = settings("127.0.0.1:0")
            daemon = build_daemon(own, clock=clock, default_state_dir=state)
        for t in threads:
            t.start()
        # The tour (or the first target) gets a post-mortem report from its recording.
        reported = "tour" if "tour" in scenarios else next(iter(scenarios))
        demo = _Demo(
            daemon,
            own,
            servers,
            scenarios,
            sink,
            total=total,
            pace=pace,
            pacer=Pacer(speed),
            reported=reported,
            log_file=log_file,
        )
        try:
            return asyncio.run(
                demo.drive(
                    out,
                    sys.stdout.isatty() if tty is None else tty,
                    keep_running=keep_running,
                    report=report or (lambda result: None),
                )
            )
        finally:
            stop_sims.set()
            for t in threads:
                t.join(timeout=5)


def _line(t: Transition) -> str:
    return transition_text(t).replace("\n", "\n    ")


@dataclass
class _Demo:
    daemon: Daemon
    settings: Settings
    servers: dict[str, SimulatedServer]
    scenarios: dict[str, Scenario]
    sink: WebhookSink
    total: float
    pace: Pace
    pacer: Pacer
    #: The target whose recording the report is made from.
    reported: str
    log_file: Path | None = None
    interrupted: bool = False
    #: Per target, the scrapes counted when the pace last looked, for ``strain``.
    _looked: dict[str, int] = field(default_factory=dict)
    _late: int = 0

    @property
    def speed(self) -> float:
        return self.pace.speed

    @property
    def sim_t(self) -> float:
        return next(iter(self.servers.values())).live.t

    def strain(self) -> Strain:
        """The signs so far that the host cannot keep up (totals over every target). A
        scrape is seen late when the pace looks after it and before the next one: at
        most every other one at 20x, enough to tell a host that keeps being late."""
        late_s = LATE_SHARE * SCRAPE_EVERY_SIM_S / self.speed
        skipped = ticks = failed = 0
        for w in self.daemon.targets:
            st = w.state
            skipped += st.skipped_ticks
            ticks += st.scrapes + st.skipped_ticks
            failed += sum(st.failures.values())
            if st.scrapes > self._looked.get(st.name, 0):
                self._looked[st.name] = st.scrapes
                self._late += (st.last_duration_s or 0.0) > late_s
        behind = sum(srv.live.behind for srv in self.servers.values())
        return Strain(skipped, ticks, self._late, failed, behind)

    def keep_pace(self) -> None:
        """Slow the scenario's clock when the host shows new strain (``Pacer``); the
        daemon then scrapes every 5 of its seconds still, a longer wall interval."""
        slower = self.pacer.observe(self.sim_t, self.strain())
        if slower is None:
            return
        self.pace.set_speed(slower)
        self.daemon.set_interval(SCRAPE_EVERY_SIM_S / slower)

    async def drive(
        self,
        out: Callable[[str], None],
        interactive: bool,
        *,
        keep_running: bool,
        report: Callable[[LiveDemoResult], None],
    ) -> LiveDemoResult:
        daemon = self.daemon
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def interrupt() -> None:
            self.interrupted = True
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, interrupt)
        task = asyncio.create_task(daemon.run(stop))
        if not interactive:
            logged = f"  log:             {self.log_file}\n" if self.log_file else ""
            out(
                f"vllm-triage demo: simulated vLLM ({', '.join(self.scenarios)}) at "
                f"{self.speed:g}x -> daemon -> local webhook receiver; "
                f"{self.total:.0f} simulated seconds\n"
                f"  status page:     {daemon.url}/\n"
                f"  derived metrics: {daemon.url}/metrics\n"
                f"  diagnoses:       {daemon.url}/api/v1/diagnoses\n{logged}"
            )
        scroll = _Scroll(self, out)
        while not task.done() and not stop.is_set() and self.sim_t < self.total:
            await asyncio.sleep(REDRAW_S)
            before = self.speed
            self.keep_pace()
            if self.speed != before and not interactive:
                out(
                    f"  (the host is not keeping up at {before:g}x, so far "
                    f"{self.pacer.slowdowns[-1].strain.said()}: the scenario's clock now "
                    f"runs at {self.speed:g}x; judged in its seconds as before)"
                )
            if interactive:
                out(CLEAR + self.screen())
            else:
                scroll.update()
        if interactive:
            out(CLEAR + self.screen())
        result = self.result()
        self._write_report(result)
        report(result)
        if keep_running and not self.interrupted and not task.done():
            out(
                f"\nStill serving (the simulator holds its last phase): {daemon.url}/metrics, "
                f"{daemon.url}/api/v1/diagnoses. Press Ctrl-C to stop."
            )
            await stop.wait()
        stop.set()
        await task
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        return result

    def _write_report(self, result: LiveDemoResult) -> None:
        """The post-mortem report of the reported target, from the daemon's own recording
        of it so far (``run --record``): the scrapes its alerts were judged on."""
        daemon = self.daemon
        result.status_url = f"{daemon.url}/"
        name = self.reported
        keeper = next(s.keeper for s in daemon.scrapers if s.name == name)
        assert keeper is not None  # the demo's settings always record
        folder = keeper.folder
        result.recording = folder.parent
        target = next(t for t in self.settings.targets if t.name == name)
        settings = self.settings.for_target(target)
        out_file = folder.parent / f"{name}-report.html"
        try:
            result.report = write_report(folder, report_parts(settings), out_file)
            # The settings the diagnosis used (the scenario's SLOs and card): with them,
            # `replay` and `report` of the folder say what the alerts said.
            result.settings_file = write_diagnosis_settings(
                settings, folder.parent / f"{name}-settings.yaml"
            )
        except (OSError, RecordingError) as exc:
            result.report_error = f"no report of {name}: {exc}"
        result.recording_bytes = folder_size(folder.parent)

    def result(self) -> LiveDemoResult:
        """What the receiver got, per target, as the self-check reads it."""
        received = self.sink.received
        res = LiveDemoResult(
            delivered=len(received),
            interrupted=self.interrupted,
            speed=self.pacer.asked,
            pacer=self.pacer,
            strain=self.strain(),
            log_file=self.log_file,
        )
        res.first_payload = received[0] if received else None
        res.received = list(received)
        seen: set[tuple[str, str, str, float]] = set()
        for w in self.daemon.targets:
            name = w.state.name
            res.events[name] = []
            res.still_firing[name] = [a.cause for a in w.evaluator.incidents.active()]
            res.scrape_failures[name] = dict(w.state.failures)
            res.segments[name] = segments(self.scenarios[name], default=expected_of(name))
        for payload in received:
            for alert in payload.get("alerts", []):
                labels = alert.get("labels", {})
                firing = alert.get("status") == "firing"
                at = _when(alert["startsAt"] if firing else alert["endsAt"]) - START_AT
                # The labels name the cause the incident opened with; the annotation its
                # cause now (a change of cause is the same alert, told again).
                cause = alert.get("annotations", {}).get("cause", labels["diagnosis"])
                key = (labels.get("target", "?"), alert.get("status", ""), cause, at)
                if key in seen:  # a repeat notification of the same alert
                    continue
                seen.add(key)
                event = Event(at, "firing" if firing else "resolved", cause)
                res.events.setdefault(key[0], []).append(event)
        for events in res.events.values():
            events.sort(key=lambda e: e.at)
        res.failed = sum(d.stats.failed for d in self.daemon.notifier.deliveries)
        return res

    def screen(self) -> str:
        targets = []
        for w in self.daemon.targets:
            name = w.state.name
            phase = self.scenarios[name].phase_at(self.servers[name].live.t)
            targets.append(DemoTarget(w.state, name, phase.label or name))
        return render(
            targets,
            sim_seconds=self.sim_t,
            total_seconds=self.total,
            speed=self.speed,
            metrics_url=self.daemon.url,
            delivered=len(self.sink.received),
            start_at=START_AT,
        )


@dataclass
class _Scroll:
    """The demo off a terminal: each phase as it starts, the signals every
    ``STATUS_EVERY_SIM_S``, and every transition, as lines that scroll."""

    demo: _Demo
    out: Callable[[str], None]
    printed: dict[str, int] = field(default_factory=dict)
    phases: dict[str, str] = field(default_factory=dict)
    next_status: float = STATUS_EVERY_SIM_S

    def update(self) -> None:
        demo = self.demo
        for w in demo.daemon.targets:
            st = w.state
            label = demo.scenarios[st.name].phase_at(demo.servers[st.name].live.t).label
            if label and self.phases.get(st.name) != label:
                self.phases[st.name] = label
                self.out(f"[{st.name}] now playing: {label}")
            done = self.printed.get(st.name, 0)
            new = min(st.transitions - done, len(st.recent))
            for t in list(st.recent)[len(st.recent) - new :]:
                self.out(f"  [{st.name}] " + _line(t))
            self.printed[st.name] = st.transitions
        if demo.sim_t >= self.next_status:
            self.next_status += STATUS_EVERY_SIM_S
            for w in demo.daemon.targets:
                for line in status_lines(w.state, start_at=START_AT):
                    self.out("  " + line)
