"""``vllm-triage demo``: the simulator's ``tour`` and the daemon, live, in one command.

Three pieces run in this process, over real sockets on 127.0.0.1: a simulated vLLM
server (``simulator.serve``) playing a scenario at ``speed`` times real time, the daemon
(``service.Daemon``, exactly as ``run`` starts it) scraping it, and a webhook receiver
(``sink``) that the daemon's Alertmanager-format notifications are delivered to.

The daemon's clock runs at the simulator's speed, so its 60 s window, its scrape
interval (5 simulated seconds) and the incident timings are those of a real server
watched in real time: only the wall clock is faster.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon.core.model import Cause, Transition
from daemon.core.report import transition_text
from daemon.demo.offline import EXPECTED, START_AT
from daemon.demo.sink import WebhookSink
from daemon.demo.tour_report import LiveRecorder, demo_folder
from daemon.demo.view import DemoTarget, render
from daemon.errors import RecordingError
from daemon.reportfile import WrittenReport, write_report
from daemon.service import Daemon
from daemon.settings import Settings, load_settings
from daemon.simulator import Scenario, get_scenario
from daemon.simulator.serve import SimulatedServer

#: The default targets: the tour through every cause, and a server at its decode
#: ceiling (the tour swaps cards, so only a one-card scenario shows the ceiling ratio).
DEFAULT_LIVE = ("tour", "decode_bound")
#: Simulated seconds between scrapes, as a default `run` would do in real time.
SCRAPE_EVERY_SIM_S = 5.0
#: After the scenario, long enough for its last incident to resolve.
TAIL_SIM_S = 60.0
REDRAW_S = 0.5
#: Home the cursor and clear the screen: the view redraws in place on a terminal.
CLEAR = "\x1b[H\x1b[2J"


def scaled_clock(speed: float, origin: float = START_AT) -> Callable[[], float]:
    """Unix time that runs ``speed`` times faster than the wall, from ``origin``."""
    t0 = time.monotonic()
    return lambda: origin + (time.monotonic() - t0) * speed


def _hardware(scenario: Scenario) -> dict[str, Any]:
    """The target's card and model, for its decode ceiling. None for a scenario that swaps
    cards between phases (``tour``): no one ceiling is true for all of it."""
    if any(p.spec is not None for p in scenario.phases):
        return {}
    spec = scenario.spec
    return {
        "hardware": {"gpu": spec.gpu, "memory_bandwidth_gb_s": spec.memory_bandwidth_gb_s},
        "model": {"parameters_billion": spec.weight_bytes / 2 / 1e9, "dtype": "bfloat16"},
    }


@dataclass(slots=True)
class LiveDemoResult:
    fired: dict[str, list[Cause]] = field(default_factory=dict)
    resolved: dict[str, list[Cause]] = field(default_factory=dict)
    still_firing: dict[str, list[Cause]] = field(default_factory=dict)
    delivered: int = 0
    failed: int = 0
    #: The post-mortem of the recorded target (``tour_report``), and where it lives.
    report: WrittenReport | None = None
    report_error: str = ""
    status_url: str = ""

    def verdicts(self) -> dict[str, tuple[bool, str]]:
        out = {}
        for name, fired in self.fired.items():
            if name == "tour":
                missing = [c for c in EXPECTED.values() if c and c not in fired]
                ok = not missing and not self.still_firing[name]
                why = f"missed {', '.join(missing)}" if missing else "every cause fired"
                if self.still_firing[name]:
                    why += f"; still firing: {', '.join(self.still_firing[name])}"
            else:
                want = EXPECTED.get(name)
                first = fired[0] if fired else None
                ok = first == want
                why = f"first diagnosis {first or 'none'}, built to show {want or 'none'}"
            out[name] = (ok, why)
        return out


def demo_settings(
    config: str | None,
    *,
    scenarios: dict[str, Scenario],
    urls: dict[str, str],
    speed: float,
    listen: str,
    sink_url: str,
) -> Settings:
    return load_settings(
        config,
        {
            "listen": listen,
            "interval_seconds": SCRAPE_EVERY_SIM_S / speed,
            "scrape_timeout_seconds": 2.0,
            "shutdown_grace_seconds": 5.0,
            "targets": [
                {"name": name, "url": urls[name], **_hardware(s)} for name, s in scenarios.items()
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
        },
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
) -> LiveDemoResult:
    scenarios = {name: get_scenario(name) for name in names}
    total = duration_s or max(s.duration_s for s in scenarios.values()) + TAIL_SIM_S
    servers = {
        name: SimulatedServer(s, host="127.0.0.1", port=0, speed=speed, naming="v1")
        for name, s in scenarios.items()
    }
    stop_sims = threading.Event()
    threads = [
        threading.Thread(target=srv.run, args=(stop_sims.is_set,), daemon=True, name=name)
        for name, srv in servers.items()
    ]
    urls = {n: f"http://127.0.0.1:{srv.address[1]}/metrics" for n, srv in servers.items()}
    # The daemon keeps its alert state as `run` does, in a folder that goes with the demo.
    with WebhookSink() as sink, tempfile.TemporaryDirectory(prefix="vllm-triage-demo-") as tmp:
        state = Path(tmp)

        def settings(at: str) -> Settings:
            return demo_settings(
                config, scenarios=scenarios, urls=urls, speed=speed, listen=at, sink_url=sink.url
            )

        clock = scaled_clock(speed)
        try:
            daemon = Daemon(settings(listen), clock=clock, default_state_dir=state)
        except OSError:
            # The default port is taken (another daemon?): any free port will do.
            daemon = Daemon(settings("127.0.0.1:0"), clock=clock, default_state_dir=state)
        for t in threads:
            t.start()
        # The tour (or the first target) is recorded beside the daemon, for its report.
        reported = "tour" if "tour" in scenarios else next(iter(scenarios))
        recorder = LiveRecorder(
            urls[reported],
            demo_folder() / reported,
            clock=clock,
            interval_s=SCRAPE_EVERY_SIM_S / speed,
        )
        recorder.start()
        demo = _Demo(daemon, servers, scenarios, sink, total=total, speed=speed)
        try:
            asyncio.run(demo.drive(out, sys.stdout.isatty() if tty is None else tty))
        finally:
            recorder.stop()
            stop_sims.set()
            for t in threads:
                t.join(timeout=5)
        received = sink.received
    # The verdict is what the receiver got: the whole pipeline, not the core alone.
    result = LiveDemoResult(delivered=len(received))
    for w in daemon.watchers:
        name = w.state.name
        result.fired[name], result.resolved[name] = [], []
        result.still_firing[name] = [a.cause for a in w.evaluator.incidents.active()]
    for payload in received:
        for alert in payload.get("alerts", []):
            labels = alert.get("labels", {})
            kind = result.fired if alert.get("status") == "firing" else result.resolved
            kind.setdefault(labels.get("target", "?"), []).append(labels.get("diagnosis"))
    result.failed = sum(d.stats.failed for d in daemon.notifier.deliveries)
    result.status_url = f"{daemon.url}/"
    target = next(t for t in daemon.settings.targets if t.name == reported)
    out_file = recorder.folder.parent / f"{reported}-report.html"
    try:
        result.report = write_report(recorder.folder, daemon.settings.for_target(target), out_file)
    except (OSError, RecordingError) as exc:
        result.report_error = f"no report of {reported}: {exc}"
    return result


def _line(t: Transition) -> str:
    return transition_text(t).replace("\n", "\n    ")


@dataclass
class _Demo:
    daemon: Daemon
    servers: dict[str, SimulatedServer]
    scenarios: dict[str, Scenario]
    sink: WebhookSink
    total: float
    speed: float

    @property
    def sim_t(self) -> float:
        return next(iter(self.servers.values())).live.t

    async def drive(self, out: Callable[[str], None], interactive: bool) -> None:
        daemon = self.daemon
        stop = asyncio.Event()
        task = asyncio.create_task(daemon.run(stop, handle_signals=True))
        if not interactive:
            out(
                f"vllm-triage demo: simulated vLLM ({', '.join(self.scenarios)}) at "
                f"{self.speed:g}x -> daemon -> local webhook receiver; "
                f"{self.total:.0f} simulated seconds\n"
                f"  status page:     {daemon.url}/\n"
                f"  derived metrics: {daemon.url}/metrics\n"
                f"  diagnoses:       {daemon.url}/api/v1/diagnoses\n"
            )
        printed = {w.state.name: 0 for w in daemon.watchers}
        while not task.done() and self.sim_t < self.total:
            await asyncio.sleep(REDRAW_S)
            if interactive:
                out(CLEAR + self.screen())
                continue
            for w in daemon.watchers:
                st = w.state
                new = min(st.transitions - printed[st.name], len(st.recent))
                for t in list(st.recent)[len(st.recent) - new :]:
                    out(f"  [{st.name}] " + _line(t))
                printed[st.name] = st.transitions
        if interactive:
            out(CLEAR + self.screen())
        stop.set()
        await task

    def screen(self) -> str:
        targets = []
        for w in self.daemon.watchers:
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
