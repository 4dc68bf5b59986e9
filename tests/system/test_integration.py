"""vllm-triage with the real components, all on 127.0.0.1 (Debian's `prometheus`,
`prometheus-alertmanager` and `victoria-metrics` packages; CI installs them):

- a real Prometheus scrapes two simulated vLLM servers on two cards, DCGM-shaped
  series for their GPUs, and vllm-triage; vllm-triage's derived series appear in
  Prometheus; fleet mode against that Prometheus gives each server its own card and
  diagnoses both as the direct scrapes do; two shards split them, each asking only
  for its own buckets of a hashmod shard label;
- recordings backfilled into a real Prometheus and imported into a real
  VictoriaMetrics: fleet mode's signals equal the sidecar's on both, and a hung
  data-parallel engine fires stalled at the same tick on both;
- vllm-triage pushes into a real Alertmanager, which delivers to a local webhook
  receiver: the alert arrives with its diagnosis labels and annotations.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from vllm_triage.assemble import build_fleet, build_rulebook
from vllm_triage.commands.render import shard_rule
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.core.diagnose import diagnose
from vllm_triage.core.evaluate import Evaluation
from vllm_triage.core.model import Signals
from vllm_triage.core.totals import Window
from vllm_triage.fleet.queries import SAMPLES as FLEET_READS
from vllm_triage.fleet.source import PrometheusSource, shard_of
from vllm_triage.render.relabel import relabel as shard_relabel
from vllm_triage.simulator import get_scenario, record

from support.components import alertmanager, binary, ok, process, prometheus
from support.fleet_sim import PodGpus, dcgm_exposition, relabel, serving
from support.harness import free_port, metrics_url, running_daemon, simulated, wait_for
from support.parsing import parse_snapshot
from support.paths import FIXTURES, RUNTIME_FIXTURES
from support.receiver import Receiver

pytestmark = pytest.mark.prometheus

SPEED = 5.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def query(url: str, promql: str) -> list[dict[str, Any]]:
    doc = httpx.get(url + "/api/v1/query", params={"query": promql}, timeout=5).json()
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


def host_port(server_url: str) -> str:
    return server_url.split("//", 1)[1].split("/", 1)[0]


def firing(states: list[Any]) -> dict[str, str | None]:
    """{target: the cause of its open incident, or None} for every target with a view."""
    out: dict[str, str | None] = {}
    for st in states:
        if st.view is not None:
            active = [a.cause for a in st.view.active]
            out[st.name] = active[0] if active else None
    return out


def prometheus_hashmod(value: str, modulus: int) -> int:
    """Prometheus' ``hashmod`` relabel action (MD5, its last 8 bytes big-endian), to pick
    pods for a test; the real Prometheus below holds it to what it computes."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


def pods_in_two_shards() -> tuple[str, str]:
    """Two pod names whose servers (``llm/<pod>``) fall in different shards of two: by
    their shard bucket (``render relabel``'s rule, 256 buckets) and by their name's hash."""

    def shard(pod: str) -> tuple[int, int]:
        return prometheus_hashmod(f"llm/{pod}", 256) % 2, shard_of(f"llm/{pod}", 2)

    names = [f"vllm-{i}" for i in range(40)]
    return next(n for n in names if shard(n) == (0, 0)), next(
        n for n in names if shard(n) == (1, 1)
    )


#: Two simulated servers on two cards: the scenario, its card in rules/gpus.yaml, the
#: name DCGM gives that card, and the memory activity its DCGM series show.
SERVERS = (
    ("kv_pressure", "NVIDIA A100 80GB SXM", "NVIDIA A100-SXM4-80GB", 0.35),
    ("queue_bound", "NVIDIA H100 SXM", "NVIDIA H100 80GB HBM3", 0.62),
)
LLAMA_8B = {"parameters_billion": 8.03, "dtype": "bfloat16"}


def test_prometheus_scrapes_triage_and_fleet_mode_diagnoses_the_fleet(tmp_path: Path) -> None:
    """Prometheus holds two simulated servers on two different cards, labelled with
    their Kubernetes namespace and pod, and DCGM-shaped series for their GPUs. Fleet
    mode finds each server's card through DCGM and its model in the model table: each
    gets its own card's ceiling and roofline, and the same diagnosis as a sidecar that
    was told each card by hand. Two shards together diagnose each server once."""
    pods = pods_in_two_shards()
    gpus = [
        PodGpus("llm", pod, dcgm_card, gpus=1, dram_active=dram)
        for pod, (_, _, dcgm_card, dram) in zip(pods, SERVERS, strict=True)
    ]
    dcgm_body = dcgm_exposition(gpus).encode()
    # ``render relabel``'s shard buckets on the vLLM and DCGM jobs, as a user pastes them.
    rendered = yaml.safe_load(shard_relabel(shard_rule(load_settings(), "test")))
    with (
        simulated(get_scenario(SERVERS[0][0]), speed=SPEED) as first,
        simulated(get_scenario(SERVERS[1][0]), speed=SPEED) as second,
        serving(lambda _: dcgm_body) as dcgm,
    ):
        sims = (first, second)
        sidecar_settings = load_settings(
            flags={
                "listen": "127.0.0.1:0",
                "interval_seconds": 1.0,
                "window_seconds": 20,
                "targets": [
                    {
                        "name": pod,
                        "url": metrics_url(sim),
                        "hardware": {"gpu": card},
                        "model": LLAMA_8B,
                    }
                    for pod, sim, (_, card, _, _) in zip(pods, sims, SERVERS, strict=True)
                ],
            }
        )
        with running_daemon(sidecar_settings) as sidecar:
            vllm_targets = [host_port(metrics_url(sim)) for sim in sims]
            with prometheus(
                tmp_path,
                {
                    "vllm": vllm_targets,
                    "vllm-triage": [host_port(sidecar.url)],
                    "dcgm": [host_port(dcgm)],
                },
                labels={
                    addr: {"namespace": "llm", "pod": pod}
                    for addr, pod in zip(vllm_targets, pods, strict=True)
                },
                honor_labels=("dcgm",),
                metric_relabel={
                    "vllm": rendered["vllm"]["metric_relabel_configs"],
                    "dcgm": rendered["dcgm"]["metric_relabel_configs"],
                },
            ) as prom:
                want_sidecar = {
                    pod: scenario for pod, (scenario, *_) in zip(pods, SERVERS, strict=True)
                }

                # The sidecar's own diagnoses, as Prometheus stores them.
                def stored() -> dict[str, str]:
                    rows = query(prom, "vllm_triage_diagnosis == 1")
                    return {r["metric"]["target"]: r["metric"]["diagnosis"] for r in rows}

                wait_for(lambda: stored() == want_sidecar, timeout=90, every=1)
                assert query(prom, 'up{job="vllm-triage"}')[0]["value"][1] == "1"
                # Fleet mode: the same diagnosis from Prometheus' copy of the series.
                fleet_prom = {
                    "url": prom,
                    "selector": '{job="vllm"}',
                    "identity_labels": ["namespace", "pod"],
                    "models": {MODEL: LLAMA_8B},
                }
                fleet_settings = load_settings(
                    flags={
                        "listen": "127.0.0.1:0",
                        "interval_seconds": 1.0,
                        "window_seconds": 20,
                        "source": "prometheus",
                        "prometheus": fleet_prom,
                    }
                )
                with running_daemon(fleet_settings) as fleet:
                    want = {f"llm/{pod}": cause for pod, cause in want_sidecar.items()}
                    wait_for(lambda: firing(fleet.target_states()) == want, timeout=90, every=0.5)
                    text = httpx.get(fleet.url + "/metrics", timeout=5).text
                    fleet_states = {st.name: st for st in fleet.target_states()}
                    sidecar_states = {st.name: st for st in sidecar.target_states()}
                # Two shards of the same fleet, each its half: by the hash of the server's
                # name (each reads the whole fleet), then by its bucket (each asks only
                # for its own buckets, DCGM's series included).
                shards = {
                    (buckets, k): one_tick(
                        load_settings(
                            flags={
                                "interval_seconds": 1.0,
                                "window_seconds": 20,
                                "source": "prometheus",
                                "prometheus": {
                                    **fleet_prom,
                                    "shard": {"index": k, "count": 2, "buckets": buckets},
                                },
                            }
                        )
                    )
                    for buckets in (0, 256)
                    for k in (0, 1)
                }
    assert 'vllm_triage_target_up{target="prometheus"} 1.0' in text
    for pod, (_, card, dcgm_card, dram) in zip(pods, SERVERS, strict=True):
        name = f"llm/{pod}"
        cause = want[name]
        ours = f'model_name="{MODEL}",runtime="vllm",target="{name}"}}'
        assert f'diagnosis="{cause}",{ours} 1.0' in text
        assert f"vllm_triage_gpu_dram_active_ratio{{{ours} {dram}" in text
        mine, theirs = fleet_states[name], sidecar_states[pod]
        # Each server its own card's ceiling: the one the sidecar was told by hand.
        assert mine.ceiling is not None and theirs.ceiling is not None
        assert mine.ceiling == theirs.ceiling and mine.ceiling.gpu == card
        assert mine.view is not None
        evidence = mine.view.evaluation.diagnoses[MODEL].evidence
        assert evidence["gpu_source"] == f"dcgm ({dcgm_card})"
        assert evidence["tensor_parallel_source"] == "dcgm (1 GPU in the pod)"
        assert evidence["model_source"] == "model table"
        assert "decode_roofline_ratio" in evidence
        assert f"vllm_triage_decode_roofline_ratio{{{ours}" in text
    for (buckets, k), (judged, seen, cards) in shards.items():
        assert judged == {f"llm/{pods[k]}"}, (buckets, k)
        assert seen == (1 if buckets else 2), (buckets, k)
        assert cards == {f"llm/{pods[k]}": f"dcgm ({SERVERS[k][2]})"}, (buckets, k)


def one_tick(settings: Any) -> tuple[set[str], int, dict[str, object]]:
    """One fleet tick with these settings: the servers it judged, the servers its answers
    held, and each judged server's card source."""

    async def go() -> PrometheusSource:
        async with httpx.AsyncClient() as client:
            source = build_fleet(settings, client=client, notifier=None)
            await source.tick()
            assert source.api.state.up, source.api.state.last_error
            return source

    source = asyncio.run(go())
    views = {n: t.state.view for n, t in source.targets.items() if t.state.view is not None}
    cards = {n: v.evaluation.diagnoses[MODEL].evidence["gpu_source"] for n, v in views.items()}
    return set(views), source.seen, cards


def test_alerts_reach_a_receiver_through_a_real_alertmanager(tmp_path: Path) -> None:
    with Receiver() as rx:
        config = (
            "route:\n  receiver: hook\n  group_by: [alertname, target, model_name]\n"
            "  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n"
            f"receivers:\n  - name: hook\n    webhook_configs:\n      - url: {rx.url}\n"
        )
        with (
            alertmanager(tmp_path, config) as am,
            simulated(get_scenario("kv_pressure"), speed=10.0) as kv,
        ):
            settings = load_settings(
                flags={
                    "listen": "127.0.0.1:0",
                    "interval_seconds": 0.5,
                    "targets": [{"name": "kv", "url": metrics_url(kv)}],
                    "receivers": [{"type": "alertmanager", "name": "am", "url": am}],
                }
            )
            with running_daemon(settings):
                body = wait_for(rx.bodies, timeout=60, every=0.5)[0]
    alert = body["alerts"][0]
    assert body["receiver"] == "hook" and body["version"] == "4"
    assert alert["status"] == "firing"
    assert alert["labels"]["alertname"] == "VllmKvPressure"
    assert alert["labels"]["diagnosis"] == "kv_pressure"
    assert alert["labels"]["target"] == "kv"
    assert alert["labels"]["model_name"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert "KV" in alert["annotations"]["summary"]
    assert "kv_usage_max=" in alert["annotations"]["evidence"]
    assert alert["annotations"]["remediation"].startswith("- ")


def samples(recordings: dict[str, list[tuple[float, str]]]) -> dict[str, dict[str, list[str]]]:
    """Recorded scrapes of servers ({instance: [(time, body)]}) as the series the fleet
    reads: {name: {labels: ["value time", ...]}}, time in seconds."""
    series: dict[str, dict[str, list[str]]] = {}
    for instance, scrapes in recordings.items():
        for at, body in scrapes:
            for line in relabel(
                body, f'job="vllm",instance="{instance}"', lambda n: n in FLEET_READS
            ).splitlines():
                name, _, rest = line.partition("{")
                labels, _, value = rest.rpartition("} ")
                series.setdefault(name, {}).setdefault(labels, []).append(f"{value} {at:.3f}")
    return series


def openmetrics(recordings: dict[str, list[tuple[float, str]]]) -> str:
    """The recordings as one OpenMetrics text with timestamps, for ``promtool tsdb
    create-blocks-from openmetrics``: each family typed ``unknown`` (its samples keep
    their own names)."""
    series = samples(recordings)
    out = []
    for name in sorted(series):
        out.append(f"# TYPE {name} unknown")
        for labels, points in series[name].items():
            out.extend(f"{name}{{{labels}}} {point}" for point in points)
    return "\n".join([*out, "# EOF"]) + "\n"


def exposition_ms(recordings: dict[str, list[tuple[float, str]]]) -> str:
    """The recordings as the Prometheus text VictoriaMetrics imports
    (``/api/v1/import/prometheus``): each sample with its time in milliseconds."""
    out = []
    for name, series in samples(recordings).items():
        for labels, points in series.items():
            for point in points:
                value, _, at = point.partition(" ")
                out.append(f"{name}{{{labels}}} {value} {round(float(at) * 1000)}")
    return "\n".join(out) + "\n"


@contextmanager
def backfilled(
    tmp_path: Path, recordings: dict[str, list[tuple[float, str]]], kind: str
) -> Iterator[str]:
    """A real query API holding the recordings, its URL: Debian's Prometheus serving
    promtool's blocks, or Debian's VictoriaMetrics fed them through its import API."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if kind == "victoriametrics":
        args = [
            binary("victoria-metrics"),
            f"-storageDataPath={tmp_path / 'vm-data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y",
        ]
        with process(args, tmp_path / "victoria-metrics.log"):
            wait_for(lambda: ok(url + "/health"), timeout=30, every=0.2)
            body = exposition_ms(recordings).encode()
            answer = httpx.post(url + "/api/v1/import/prometheus", content=body, timeout=60)
            assert answer.status_code == 204, answer.text
            # Imported samples are searchable once flushed from the in-memory buffer.
            assert httpx.get(url + "/internal/force_flush", timeout=30).status_code == 200
            yield url
        return
    (tmp_path / "series.om").write_text(openmetrics(recordings), encoding="utf-8")
    data = tmp_path / "prom-data"
    subprocess.run(
        [
            binary("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(tmp_path / "series.om"),
            str(data),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
    args = [
        binary("prometheus"),
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={data}",
        "--storage.tsdb.retention.time=10y",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with process(args, tmp_path / "prometheus.log"):
        wait_for(lambda: ok(url + "/-/ready"), timeout=30, every=0.2)
        yield url


def ticked(
    settings: Settings,
    times: list[float],
    after: Callable[[PrometheusSource, float], None] = lambda source, at: None,
) -> PrometheusSource:
    """Fleet mode with these settings, one tick at each of ``times`` (``after`` each)."""
    now = [times[0]]

    async def go() -> PrometheusSource:
        async with httpx.AsyncClient() as client:
            source = build_fleet(settings, client=client, notifier=None, clock=lambda: now[0])
            for at in times:
                now[0] = at
                await source.tick()
                assert source.api.state.up, source.api.state.last_error
                after(source, at)
            return source

    return asyncio.run(go())


def fleet_settings(url: str, step: float, window: float, **prometheus: Any) -> Settings:
    return load_settings(
        flags={
            "interval_seconds": step,
            "window_seconds": window,
            "source": "prometheus",
            "prometheus": {"url": url, "selector": '{job="vllm"}', **prometheus},
        }
    )


def fleet_over_backfill(
    tmp_path: Path,
    recordings: dict[str, list[tuple[float, str]]],
    step: float,
    window: float,
    at: float,
    kind: str = "prometheus",
) -> tuple[PrometheusSource, Settings]:
    """The recordings backfilled into a real query API (``backfilled``) and fleet mode
    judging them in one tick at ``at`` (the backend told by its build info): the source,
    and its settings."""
    with backfilled(tmp_path, recordings, kind) as url:
        settings = fleet_settings(url, step, window)
        source = ticked(settings, [at])
    assert source.backend is not None and source.backend.kind == kind
    return source, settings


def side_by_side(
    source: PrometheusSource,
    settings: Settings,
    recordings: dict[str, list[tuple[float, str]]],
    window: float,
) -> Iterator[tuple[str, Signals, Evaluation]]:
    """Each recorded server: its signals from the sidecar's own window over the recording
    and fleet mode's evaluation from Prometheus, (instance, sidecar's, fleet's)."""
    for instance, scrapes in recordings.items():
        w = Window(window, min_observations=settings.thresholds.min_observations)
        for at, body in scrapes:
            w.push(parse_snapshot(body, at))
        view = source.targets[f"vllm/{instance}"].state.view
        assert view is not None
        yield instance, w.signals(MODEL), view.evaluation


@pytest.mark.parametrize("kind", ["prometheus", "victoriametrics"])
def test_fleet_signals_equal_the_sidecars_on_a_recording(tmp_path: Path, kind: str) -> None:
    """The same recordings, windowed by the sidecar's own window and by a real query API
    (the fleet's PromQL over backfilled blocks in Prometheus, over imported samples in
    VictoriaMetrics, told apart by their build info): the same quantiles (and where they
    fell), means, rates, gauges, and the same diagnosis. On VictoriaMetrics only
    because fleet mode asks it for Prometheus' increase and changes, and widens its
    ranges, open on the left, by a millisecond."""
    step, window = 5.0, 60.0
    end = time.time() - 3600
    end -= end % step
    recordings = {
        f"{scenario}:8000": list(
            record(get_scenario(scenario), start_at=end - 300, interval_s=step, duration_s=300)
        )
        for scenario in ("kv_pressure", "decode_bound", "prefill_bound")
    }
    source, settings = fleet_over_backfill(tmp_path, recordings, step, window, end, kind)
    rules = build_rulebook(settings)
    compared: set[str] = set()
    for instance, want, fleet in side_by_side(source, settings, recordings, window):
        got = fleet.signals[MODEL]
        compared.update(f for f in COMPARED if getattr(want, f) is not None)
        for name in ("ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "itl_p99"):
            a, b = getattr(got, name), getattr(want, name)
            assert (a is None) == (b is None), (instance, name)
            if a is not None and b is not None:
                assert a.value == pytest.approx(b.value, rel=1e-6), (instance, name)
                assert a.position == b.position, (instance, name)
        for name in (
            "ttft_mean",
            "itl_mean",
            "ttft_count",
            "itl_count",
            "queue_time_mean",
            "queue_time_count",
            "prefill_time_share",
            "mean_prompt_tokens",
            "mean_generation_tokens",
            "running_mean",
            "waiting_mean",
            "kv_usage_mean",
            "kv_usage_max",
            "kv_pool_tokens",
            "preemptions_per_second",
            "prompt_tokens_per_second",
            "generation_tokens_per_second",
            "decode_tokens_per_second_per_stream",
            "iteration_tokens_mean",
            "iteration_steps",
        ):
            # Both unknown where the window's steps carry prefill (no decode speed).
            assert same(getattr(got, name), getattr(want, name), 1e-6), (instance, name)
        # Maxima and the busy means come from a subquery at the step: the same samples.
        for name in ("running_max", "waiting_max", "running_busy_mean", "kv_usage_busy_mean"):
            assert getattr(got, name) == pytest.approx(getattr(want, name), rel=0.1), (
                instance,
                name,
            )
        assert fleet.diagnoses[MODEL].cause == diagnose(want, rules).cause
    # Not vacuous: every signal had a value on at least one of the servers.
    assert compared == set(COMPARED)


COMPARED = (
    "ttft_p99",
    "itl_p99",
    "queue_time_mean",
    "prefill_time_share",
    "waiting_max",
    "running_busy_mean",
    "kv_usage_busy_mean",
    "preemptions_per_second",
    "iteration_tokens_mean",
    "kv_pool_tokens",
)


@pytest.mark.parametrize("kind", ["prometheus", "victoriametrics"])
def test_fleet_judges_each_data_parallel_engine(tmp_path: Path, kind: str) -> None:
    """Two servers of two data-parallel engines each, backfilled into a real Prometheus
    (and VictoriaMetrics):
    one whose engine 1 has hung for 160 s while engine 0 serves on (the server's merged
    counters still move), one healthy. Fleet mode's PromQL (changes() engine by engine)
    fires stalled on the first, naming engine 1, and not on the second; each engine's
    window means of waiting and KV usage (the balance) are the sidecar's."""
    step, window = 5.0, 60.0
    end = time.time() - 3600
    end -= end % step
    files = {"hung": "dp_one_engine_hung", "healthy": "dp_healthy"}
    recordings = {
        f"{server}:8000": list(
            record(
                get_scenario(str(FIXTURES / "scenarios" / f"{name}.yaml")),
                start_at=end - 400,  # engine 1 hangs from the scenario's 240th second
                interval_s=step,
                duration_s=400,
            )
        )
        for server, name in files.items()
    }
    source, settings = fleet_over_backfill(tmp_path, recordings, step, window, end, kind)
    for instance, want, fleet in side_by_side(source, settings, recordings, window):
        got = fleet.signals[MODEL]
        assert set(got.engine_waiting_mean) == {"0", "1"}, instance
        for name in ("engine_waiting_mean", "engine_kv_usage_mean"):
            a, b = getattr(got, name), getattr(want, name)
            assert a == pytest.approx(b, rel=1e-6), (instance, name)
    hung = source.targets["vllm/hung:8000"]
    assert [a.cause for a in hung.evaluator.incidents.active()] == ["stalled"]
    assert hung.state.view is not None
    evidence = hung.state.view.evaluation.diagnoses[MODEL].evidence
    assert list(evidence["stalled_engines"]) == ["1"], evidence
    assert evidence["engines_stalled"] == "1 of 2 engines", evidence
    assert source.targets["vllm/healthy:8000"].evaluator.incidents.active() == []


#: dp_one_engine_hung: engine 1 hangs at the scenario's 240th second.
HANG_AT = 240.0


@functools.cache
def hung_engine(step: float, lead: float) -> tuple[tuple[float, str], ...]:
    """dp_one_engine_hung scraped every ``step`` seconds until engine 1 has hung for
    ``lead`` seconds, on a clock starting at 0 (``shifted`` places it in time)."""
    scenario = get_scenario(str(FIXTURES / "scenarios" / "dp_one_engine_hung.yaml"))
    return tuple(record(scenario, start_at=0.0, interval_s=step, duration_s=HANG_AT + lead))


def shifted(scrapes: tuple[tuple[float, str], ...], by: float) -> list[tuple[float, str]]:
    return [(at + by, body) for at, body in scrapes]


def first_stalled(settings: Settings, hang: float, lead: float, step: float) -> float | None:
    """Seconds after the hang at which fleet mode's tick first fires ``stalled`` for the
    hung server (a tick every step from the hang until ``lead`` seconds after), or None."""
    fired: list[float] = []

    def look(source: PrometheusSource, at: float) -> None:
        target = source.targets.get("vllm/hung:8000")
        causes = [a.cause for a in target.evaluator.incidents.active()] if target else []
        if causes == ["stalled"] and not fired:
            fired.append(at - hang)

    ticked(settings, [hang + k * step for k in range(round(lead / step) + 1)], look)
    return fired[0] if fired else None


def test_a_hung_engine_is_stalled_as_soon_on_victoriametrics_as_on_prometheus(
    tmp_path: Path,
) -> None:
    """The same two-engine server, engine 1 hung, in a real Prometheus (an hour ago) and
    in a real VictoriaMetrics (until now: where its 30 s latency offset applies). Fleet
    mode ticks every step from the hang on: on Prometheus ``stalled`` fires within the
    stall range and a step or two; on VictoriaMetrics (told by its build info) at the
    very same tick, although that tick is now. Read as if it were Prometheus (no
    ``nocache``, VictoriaMetrics' own ``changes``), the same VictoriaMetrics has not
    fired by then: it evaluates 30 s in the past and counts one change more."""
    step, window = 5.0, 60.0
    hour_ago = time.time() - 3600
    hour_ago -= hour_ago % step
    lead = 120.0
    with backfilled(
        tmp_path / "prom",
        {"hung:8000": shifted(hung_engine(step, lead), hour_ago - HANG_AT - lead)},
        "prometheus",
    ) as url:
        settings = fleet_settings(url, step, window, backend="prometheus")
        on_prometheus = first_stalled(settings, hour_ago - lead, lead, step)
    stall = max(load_settings().thresholds.stall_after_seconds, 60.0)
    assert on_prometheus is not None and on_prometheus <= stall + 2 * step, on_prometheus
    # VictoriaMetrics holds the recording up to now, ending the tick that fired above.
    lead = on_prometheus
    scrapes = hung_engine(step, lead)
    now = time.time()
    end = now - now % step
    with backfilled(
        tmp_path / "vm", {"hung:8000": shifted(scrapes, end - HANG_AT - lead)}, "victoriametrics"
    ) as url:
        as_itself = first_stalled(fleet_settings(url, step, window), end - lead, lead, step)
        as_prometheus = first_stalled(
            fleet_settings(url, step, window, backend="prometheus"), end - lead, lead, step
        )
    assert as_itself == on_prometheus
    assert as_prometheus is None


#: Each engine's dialect of three scenarios: the cause its physics gives (TensorRT-LLM's
#: time per output token is each request's mean at its end, so its decode-bound window
#: reads as the sidecar's does, from the requests that finished in it).
ENGINE_SCENARIOS = ("kv_pressure", "decode_bound", "prefill_bound")


def same(a: float | None, b: float | None, rel: float) -> bool:
    """Both unknown, or both known and within ``rel`` of each other."""
    if a is None or b is None:
        return a is None and b is None
    return a == pytest.approx(b, rel=rel)


@pytest.mark.parametrize("engine", ["sglang", "lmdeploy", "trtllm"])
def test_fleet_reads_each_engines_series_as_the_sidecar_does(tmp_path: Path, engine: str) -> None:
    """The simulator's servers in another engine's dialect (its names, labels, buckets,
    what it observes when), backfilled into a real Prometheus: fleet mode reads them
    through the engine's spec (its matchers, copies read once, its rank as the engine,
    its own progress series) and gives each server the sidecar's signals, its engine and
    the sidecar's cause."""
    step, window = 5.0, 60.0
    end = time.time() - 3600
    end -= end % step
    recordings = {
        f"{scenario}:8000": list(
            record(
                get_scenario(scenario),
                start_at=end - 300,
                interval_s=step,
                duration_s=300,
                naming=engine,  # type: ignore[arg-type]
            )
        )
        for scenario in ENGINE_SCENARIOS
    }
    source, settings = fleet_over_backfill(tmp_path, recordings, step, window, end)
    rules = build_rulebook(settings)
    causes = {}
    for instance, want, fleet in side_by_side(source, settings, recordings, window):
        got = fleet.signals[MODEL]
        assert want.runtime.name == engine
        assert got.runtime.name == engine, instance
        for name in ("ttft_p99", "itl_p99"):
            a, b = getattr(got, name), getattr(want, name)
            assert (a is None) == (b is None), (instance, name)
            if a is not None and b is not None:
                assert a.value == pytest.approx(b.value, rel=1e-6), (instance, name)
        for name in (
            "ttft_mean",
            "itl_mean",
            "queue_time_mean",
            "prefill_time_share",
            "running_mean",
            "waiting_mean",
            "kv_usage_max",
            "kv_pool_tokens",
            "preemptions_per_second",
            "prompt_tokens_per_second",
            "generation_tokens_per_second",
        ):
            assert same(getattr(got, name), getattr(want, name), 1e-6), (instance, name)
        # The decode step from what the engine measures: the last-iteration gauge's busy
        # mean is a subquery at the step (the same samples).
        assert got.step_source == want.step_source, instance
        assert same(got.step_seconds_mean, want.step_seconds_mean, 0.1), instance
        # Not vacuous: the pool from the engine's gauges where it has them, and each
        # rank's progress from its own step-driven series.
        assert (got.kv_pool_tokens is not None) == (engine != "lmdeploy"), instance
        assert got.progress is not None and got.progress.seconds_without_progress == 0
        cause = diagnose(want, rules).cause
        assert fleet.diagnoses[MODEL].cause == cause, instance
        causes[instance.split(":")[0]] = cause
    assert causes["kv_pressure"] == "kv_pressure"
    assert causes["prefill_bound"] == "prefill_bound"


#: Each engine's own bytes (tests/fixtures/runtimes/), as a server whose every scrape is
#: that body: requests outstanding and nothing moving, a hung engine.
FROZEN = {
    "sglang": "sglang/sglang-0.5.23.txt",
    "sglang-dp2": "sglang/sglang-0.5.23-dp2-eagle.txt",
    "lmdeploy": "lmdeploy/lmdeploy-0.18.0.txt",
    "trtllm": "trtllm/trtllm-serve.txt",
}


def test_fleet_reads_each_engines_own_bytes(tmp_path: Path) -> None:
    """Each engine's fixture, made by its own metrics code, scraped unchanged for five
    minutes into a real Prometheus: fleet mode names each server's engine and judges what
    the bytes show, a server whose series never move while requests are outstanding:
    stalled (rank by rank for SGLang's two data-parallel ranks)."""
    step, window = 5.0, 60.0
    end = time.time() - 3600
    end -= end % step
    recordings = {
        f"{name}:8000": [
            (end - 300 + k * step, (RUNTIME_FIXTURES / path).read_text(encoding="utf-8"))
            for k in range(61)
        ]
        for name, path in FROZEN.items()
    }
    source, _ = fleet_over_backfill(tmp_path, recordings, step, window, end)
    for name in FROZEN:
        view = source.targets[f"vllm/{name}:8000"].state.view
        assert view is not None, name
        engine = name.split("-")[0]
        assert {s.runtime.name for s in view.evaluation.signals.values()} == {engine}, name
        causes = {d.cause for d in view.evaluation.diagnoses.values()}
        assert causes == {"stalled"}, (name, causes)
