"""deploy/compose/: both stacks are consistent, and every config file they mount is valid
(promtool check config, amtool check-config, vllm-triage's own settings). No Docker
engine runs here, so the stacks are not started; these checks keep them honest."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_triage.cli import build_parser
from vllm_triage.config.load import load_settings

from support.clirun import HANG_S
from support.paths import ROOT

COMPOSE = ROOT / "deploy" / "compose"
STACKS = ("compose.yaml", "compose.simulated.yaml")
SERVICES = {"vllm", "vllm-triage", "prometheus", "alertmanager", "grafana"}


def stack(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((COMPOSE / name).read_text(encoding="utf-8"))
    return data


def binds(service: dict[str, Any]) -> list[tuple[Path, str]]:
    """(source on the host, target in the container) of each bind mount."""
    out = []
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith((".", "/")) and "$" not in source:
            out.append(((COMPOSE / source).resolve(), target))
    return out


def mounted(name: str, service: str, target: str) -> Path:
    for source, where in binds(stack(name)["services"][service]):
        if where == target:
            return source
    raise AssertionError(f"{service} in {name} mounts nothing at {target}")


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install Debian's prometheus and prometheus-alertmanager")
    return found


@pytest.mark.parametrize("name", STACKS)
class TestStacks:
    def test_services_and_mounts_exist(self, name: str) -> None:
        services = stack(name)["services"]
        assert set(services) == SERVICES
        for service in services.values():
            for source, _ in binds(service):
                assert source.exists(), source
            if "build" in service:
                assert (COMPOSE / service["build"] / "Dockerfile").exists()

    def test_triage_settings_load_and_watch_the_vllm_service(self, name: str) -> None:
        service = stack(name)["services"]["vllm-triage"]
        command = service["command"]
        config = command[command.index("--config") + 1]
        settings = load_settings(mounted(name, "vllm-triage", config))
        assert [t.url for t in settings.targets] == ["http://vllm:8000/metrics"]
        assert [r.type for r in settings.receivers] == ["alertmanager"]
        assert settings.receivers[0].url.get_secret_value() == "http://alertmanager:9093"
        assert service.get("read_only") is True

    def test_prometheus_scrapes_the_stack(self, name: str) -> None:
        config = yaml.safe_load(
            mounted(name, "prometheus", "/etc/prometheus/prometheus.yml").read_text()
        )
        targets = {
            t
            for job in config["scrape_configs"]
            for sc in job["static_configs"]
            for t in sc["targets"]
        }
        assert targets == {"vllm:8000", "vllm-triage:9468"}

    def test_the_daemon_names_vllm_as_prometheus_does(self, name: str) -> None:
        """The target's server labels are the job and instance Prometheus gives vLLM's
        series, so the inhibit rule matches the daemon's alert and the rules' per server."""
        service = stack(name)["services"]["vllm-triage"]
        command = service["command"]
        settings = load_settings(
            mounted(name, "vllm-triage", command[command.index("--config") + 1])
        )
        config = yaml.safe_load(
            mounted(name, "prometheus", "/etc/prometheus/prometheus.yml").read_text()
        )
        [job] = [j for j in config["scrape_configs"] if j["job_name"] == "vllm"]
        [[instance]] = [sc["targets"] for sc in job["static_configs"]]
        [target] = settings.targets
        assert settings.server_labels_of(target) == {"job": "vllm", "instance": instance}

    def test_the_monitor_gates_nothing(self, name: str) -> None:
        """vLLM never waits on vllm-triage (started or healthy), nothing else waits on
        its health, and it restarts alone."""
        services = stack(name)["services"]
        assert "vllm-triage" not in services["vllm"].get("depends_on", [])
        for other, service in services.items():
            needs = service.get("depends_on", {})
            if isinstance(needs, dict) and "vllm-triage" in needs:
                assert needs["vllm-triage"].get("condition") != "service_healthy", other
        triage = services["vllm-triage"]
        assert triage["restart"] in ("unless-stopped", "always", "on-failure")

    def test_state_volume_grace_and_memory(self, name: str) -> None:
        """The read-only container keeps its state on a named volume where its settings
        say; stop_grace_period covers the delivery grace; the memory limit is the
        Kubernetes sidecar's (derived there)."""
        service = stack(name)["services"]["vllm-triage"]
        command = service["command"]
        settings = load_settings(
            mounted(name, "vllm-triage", command[command.index("--config") + 1])
        )
        state = settings.state_path(None)
        assert state is not None
        named = [v.split(":") for v in service["volumes"] if not v.startswith((".", "/"))]
        assert len(named) == 1, named
        source, target = named[0][:2]
        assert target == str(state) and source in stack(name)["volumes"]
        assert service["read_only"] is True
        grace = float(service["stop_grace_period"].removesuffix("s"))
        assert grace >= settings.shutdown_grace_seconds + 5
        limit = service["deploy"]["resources"]["limits"]["memory"]
        deployment = yaml.safe_load_all(
            (ROOT / "deploy" / "kubernetes" / "sidecar-patch.yaml").read_text(encoding="utf-8")
        )
        pod = next(d for d in deployment if d and d["kind"] == "Deployment")["spec"]["template"]
        sidecar = next(c for c in pod["spec"]["initContainers"] if c["name"] == "vllm-triage")
        assert limit.removesuffix("M") == sidecar["resources"]["limits"]["memory"].removesuffix(
            "Mi"
        )


def test_vllm_drains_within_its_stop_grace_period() -> None:
    vllm = stack("compose.yaml")["services"]["vllm"]
    drain = int(vllm["command"][vllm["command"].index("--shutdown-timeout") + 1])
    assert drain > 0
    assert float(vllm["stop_grace_period"].removesuffix("s")) >= drain + 5


def test_the_simulated_stack_runs_a_real_simulate_command() -> None:
    vllm = stack("compose.simulated.yaml")["services"]["vllm"]
    args = build_parser().parse_args(vllm["command"])
    assert args.command == "simulate" and args.port == 8000 and args.host == "0.0.0.0"
    assert "deploy" not in vllm  # no GPU reservation


def test_the_gpu_stack_reserves_a_gpu_for_vllm() -> None:
    vllm = stack("compose.yaml")["services"]["vllm"]
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert shlex.join(vllm["command"]).startswith("--model ")


@pytest.mark.prometheus
def test_promtool_check_config(tmp_path: Path) -> None:
    """prometheus.yml, laid out as the containers see it, with the rules it loads."""
    shutil.copy(COMPOSE / "prometheus.yml", tmp_path / "prometheus.yml")
    rules_dir = mounted("compose.yaml", "prometheus", "/etc/prometheus/rules")
    shutil.copytree(rules_dir, tmp_path / "rules")
    result = subprocess.run(
        [tool("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


@pytest.mark.prometheus
def test_amtool_check_config() -> None:
    result = subprocess.run(
        [tool("amtool"), "check-config", str(COMPOSE / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_documented_inhibit_rules_are_the_shipped_ones() -> None:
    """docs/operations.md's alert-label contract shows the inhibit rules users copy: the
    compose stack's, the ones tests/system/test_inhibit.py runs through Alertmanager."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text.split("### The alert-label contract", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    shipped = yaml.safe_load((COMPOSE / "alertmanager.yml").read_text(encoding="utf-8"))
    assert yaml.safe_load(block)["inhibit_rules"] == shipped["inhibit_rules"]
