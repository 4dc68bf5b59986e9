"""vllm-triage with the real components, all on 127.0.0.1 (Debian's `prometheus` and
`prometheus-alertmanager` packages; CI installs them):

- a real Prometheus scrapes two simulated vLLM servers on two cards, DCGM-shaped
  series for their GPUs, and vllm-triage; vllm-triage's derived series appear in
  Prometheus; fleet mode against that Prometheus gives each server its own card and
  diagnoses both as the direct scrapes do; two shards split them;
- vllm-triage pushes into a real Alertmanager, which delivers to a local webhook
  receiver: the alert arrives with its diagnosis labels and annotations.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from vllm_triage.assemble import build_fleet, build_rulebook
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import Settings
from vllm_triage.core.diagnose import diagnose
from vllm_triage.core.evaluate import Evaluation
from vllm_triage.core.model import Signals
from vllm_triage.core.names import SAMPLES
from vllm_triage.core.parse import parse_snapshot
from vllm_triage.core.totals import Window
from vllm_triage.fleet.source import PrometheusSource, shard_of
from vllm_triage.simulator import get_scenario, record

from support.components import alertmanager, binary, ok, process, prometheus
from support.fleet_sim import PodGpus, dcgm_exposition, relabel, serving
from support.harness import free_port, metrics_url, running_daemon, simulated, wait_for
from support.paths import FIXTURES
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


def pods_in_two_shards() -> tuple[str, str]:
    """Two pod names whose servers (``llm/<pod>``) fall in different shards of two."""
    names = [f"vllm-{i}" for i in range(20)]
    first = next(n for n in names if shard_of(f"llm/{n}", 2) == 0)
    second = next(n for n in names if shard_of(f"llm/{n}", 2) == 1)
    return first, second


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
                # Two shards of the same fleet, each its half.
                shards = [
                    one_tick(
                        load_settings(
                            flags={
                                "interval_seconds": 1.0,
                                "window_seconds": 20,
                                "source": "prometheus",
                                "prometheus": {**fleet_prom, "shard": {"index": k, "count": 2}},
                            }
                        )
                    )
                    for k in (0, 1)
                ]
    assert 'vllm_triage_target_up{target="prometheus"} 1.0' in text
    for pod, (_, card, dcgm_card, dram) in zip(pods, SERVERS, strict=True):
        name = f"llm/{pod}"
        cause = want[name]
        assert f'diagnosis="{cause}",model_name="{MODEL}",target="{name}"}} 1.0' in text
        assert (
            f'vllm_triage_gpu_dram_active_ratio{{model_name="{MODEL}",target="{name}"}} {dram}'
            in text
        )
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
        assert f'vllm_triage_decode_roofline_ratio{{model_name="{MODEL}",target="{name}"}}' in text
    assert [sorted(s) for s in shards] == [[f"llm/{pods[0]}"], [f"llm/{pods[1]}"]]


def one_tick(settings: Any) -> set[str]:
    """The servers one fleet tick judges, with these settings."""

    async def go() -> set[str]:
        async with httpx.AsyncClient() as client:
            source = build_fleet(settings, client=client, notifier=None)
            await source.tick()
            assert source.api.state.up, source.api.state.last_error
            return {n for n, w in source.targets.items() if w.state.view is not None}

    return asyncio.run(go())


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


def openmetrics(recordings: dict[str, list[tuple[float, str]]]) -> str:
    """Recorded scrapes of servers ({instance: [(time, body)]}) as one OpenMetrics text
    with timestamps, for ``promtool tsdb create-blocks-from openmetrics``: the series the
    fleet reads, each family typed ``unknown`` (its samples keep their own names)."""
    series: dict[str, dict[str, list[str]]] = {}
    for instance, scrapes in recordings.items():
        for at, body in scrapes:
            for line in relabel(
                body, f'job="vllm",instance="{instance}"', lambda n: n in SAMPLES
            ).splitlines():
                name, _, rest = line.partition("{")
                labels, _, value = rest.rpartition("} ")
                series.setdefault(name, {}).setdefault(labels, []).append(f"{value} {at:.3f}")
    out = []
    for name in sorted(series):
        out.append(f"# TYPE {name} unknown")
        for labels, points in series[name].items():
            out.extend(f"{name}{{{labels}}} {point}" for point in points)
    return "\n".join([*out, "# EOF"]) + "\n"


def fleet_over_backfill(
    tmp_path: Path,
    recordings: dict[str, list[tuple[float, str]]],
    step: float,
    window: float,
    at: float,
) -> tuple[PrometheusSource, Settings]:
    """The recordings backfilled into a real Prometheus (promtool's blocks) and fleet mode
    judging them in one tick at ``at``: the source, and its settings."""
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
    port = free_port()
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
    args = [
        binary("prometheus"),
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={data}",
        "--storage.tsdb.retention.time=10y",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    url = f"http://127.0.0.1:{port}"
    settings = load_settings(
        flags={
            "interval_seconds": step,
            "window_seconds": window,
            "source": "prometheus",
            "prometheus": {"url": url, "selector": '{job="vllm"}'},
        }
    )

    async def judged() -> PrometheusSource:
        async with httpx.AsyncClient() as client:
            source = build_fleet(settings, client=client, notifier=None, clock=lambda: at)
            await source.tick()
            return source

    with process(args, tmp_path / "prometheus.log"):
        wait_for(lambda: ok(url + "/-/ready"), timeout=30, every=0.2)
        source = asyncio.run(judged())
    assert source.api.state.up, source.api.state.last_error
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


def test_fleet_signals_equal_the_sidecars_on_a_recording(tmp_path: Path) -> None:
    """The same recordings, windowed by the sidecar's own window and by Prometheus (the
    fleet's PromQL over backfilled blocks): the same quantiles (and where they fell),
    means, rates, gauges, and the same diagnosis."""
    step, window = 5.0, 60.0
    end = time.time() - 3600
    end -= end % step
    recordings = {
        f"{scenario}:8000": list(
            record(get_scenario(scenario), start_at=end - 300, interval_s=step, duration_s=300)
        )
        for scenario in ("kv_pressure", "decode_bound", "prefill_bound")
    }
    source, settings = fleet_over_backfill(tmp_path, recordings, step, window, end)
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
            assert getattr(got, name) == pytest.approx(getattr(want, name), rel=1e-6), (
                instance,
                name,
            )
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


def test_fleet_judges_each_data_parallel_engine(tmp_path: Path) -> None:
    """Two servers of two data-parallel engines each, backfilled into a real Prometheus:
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
    source, settings = fleet_over_backfill(tmp_path, recordings, step, window, end)
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
