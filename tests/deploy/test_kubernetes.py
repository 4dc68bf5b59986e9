"""deploy/kubernetes/ (the sidecar patch, its ConfigMap, the rules) and the whole example
deploy/examples/kubernetes-full/ (a vLLM Deployment the patch joins): the manifests parse,
validate, and agree with the code and the image. The pod checked here is the example's
Deployment with sidecar-patch.yaml applied (``support.smp``, as kubectl and kustomize apply
it); tests/deploy/test_sidecar_patch.py checks the patch itself against other Deployments.

The core objects (ConfigMap, Deployment, Service) are validated against Kubernetes 1.31's
OpenAPI schemas by kubernetes-validate (strict: unknown fields are errors). It has no
schemas for the Prometheus Operator's CRDs: on a PodMonitor or PrometheusRule it only
warns "Couldn't find schema" and exits 0, so those two are checked here by structure, and
the PrometheusRule's groups with promtool (`pytest -m prometheus`).

No cluster runs where this project is built; these checks keep the files true to the
repository instead: the sidecar's port, config path and user are the daemon's and the
image's, its probes are its own endpoints, and the rules are the rules file's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_triage.cli import build_parser
from vllm_triage.commands.render import objectives_of, origin
from vllm_triage.commands.run import flags
from vllm_triage.config.load import load_settings
from vllm_triage.render.templates import prometheusrule
from vllm_triage.serve.listener import split_listen

from support import smp
from support.clirun import HANG_S
from support.paths import ROOT

KDIR = ROOT / "deploy" / "kubernetes"
EXAMPLE = ROOT / "deploy" / "examples" / "kubernetes-full"
RULES = ROOT / "rules" / "prometheus" / "vllm-triage.rules.yaml"
DOCKERFILE = ROOT / "Dockerfile"
KUBERNETES_VERSION = "1.31.0"
#: Our own objects' label, and the example's (which selects no pod of a user's).
LABEL = {"app.kubernetes.io/name": "vllm-triage"}
EXAMPLE_LABEL = {"app.kubernetes.io/name": "vllm-triage-example"}
MANIFESTS = sorted(p.name for p in KDIR.glob("*.yaml"))
EXAMPLE_MANIFESTS = sorted(p.name for p in EXAMPLE.glob("*.yaml"))


def docs(name: str, folder: Path = KDIR) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((folder / name).read_text(encoding="utf-8")) if d]


def one(name: str, kind: str, folder: Path = KDIR) -> dict[str, Any]:
    found = [d for d in docs(name, folder) if d.get("kind") == kind]
    assert len(found) == 1, f"{name}: expected one {kind}, found {len(found)}"
    return found[0]


def example_deployment() -> dict[str, Any]:
    """The example's Deployment as applied: its vLLM with the sidecar patch merged in."""
    return smp.apply(
        one("deployment.yaml", "Deployment", EXAMPLE), one("sidecar-patch.yaml", "Deployment")
    )


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = example_deployment()["spec"]["template"]["spec"]
    return spec


def container(name: str, section: str = "containers") -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in pod_spec().get(section, []) if c["name"] == name]
    assert len(found) == 1, f"no {section} entry named {name!r}"
    return found[0]


def sidecar() -> dict[str, Any]:
    return container("vllm-triage", "initContainers")


def named_ports() -> dict[str, int]:
    """Every named container port of the pod (containers and init containers)."""
    spec = pod_spec()
    out: dict[str, int] = {}
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        for p in c.get("ports", []):
            assert p["name"] not in out, f"port name {p['name']!r} used twice"
            out[p["name"]] = p["containerPort"]
    return out


def dockerfile_cmd() -> list[str]:
    """The final CMD of the Dockerfile, in exec form."""
    cmds = [
        line.partition(" ")[2]
        for line in DOCKERFILE.read_text(encoding="utf-8").splitlines()
        if line.startswith("CMD ")
    ]
    assert cmds, "Dockerfile has no CMD"
    cmd: list[str] = json.loads(cmds[-1])
    return cmd


def triage_yaml() -> str:
    text: str = one("configmap.yaml", "ConfigMap")["data"]["triage.yaml"]
    return text


def kubernetes_validate() -> str:
    sibling = Path(sys.executable).parent / "kubernetes-validate"
    found = str(sibling) if sibling.exists() else shutil.which("kubernetes-validate")
    if found is None:
        pytest.fail("kubernetes-validate not found: pip install kubernetes-validate (test extras)")
    return found


class TestFiles:
    @pytest.mark.parametrize(
        ("folder", "name"),
        [(KDIR, n) for n in MANIFESTS] + [(EXAMPLE, n) for n in EXAMPLE_MANIFESTS],
        ids=[*MANIFESTS, *(f"example/{n}" for n in EXAMPLE_MANIFESTS)],
    )
    def test_parses(self, folder: Path, name: str) -> None:
        found = docs(name, folder)
        assert found, f"{name} is empty"
        for doc in found:
            assert {"apiVersion", "kind"} <= doc.keys(), name

    def test_the_example_kustomization_lists_every_manifest(self) -> None:
        kust = one("kustomization.yaml", "Kustomization", EXAMPLE)
        listed = kust["resources"]
        assert len(listed) == len(set(listed)), listed
        assert sorted(listed) == sorted(set(EXAMPLE_MANIFESTS) - {"kustomization.yaml"})

    def test_namespace_agnostic_and_labelled(self) -> None:
        """No file sets a namespace; ours carry vllm-triage's label, the example's its own
        (never a `vllm` label that could select a user's pods)."""
        for folder, names, label in (
            (KDIR, MANIFESTS, LABEL),
            (EXAMPLE, EXAMPLE_MANIFESTS, EXAMPLE_LABEL),
        ):
            for name in names:
                for doc in docs(name, folder):
                    assert "namespace" not in doc.get("metadata", {}), name
                    assert "namespace" not in doc, name
                    if doc["kind"] in (
                        "ConfigMap",
                        "PrometheusRule",
                        "Deployment",
                        "Service",
                        "PodMonitor",
                    ) and name not in ("sidecar-patch.yaml", "sidecar-remove.yaml"):
                        assert doc["metadata"]["labels"].items() >= label.items(), name


class TestValidate:
    def test_core_objects_pass_kubernetes_validate(self, tmp_path: Path) -> None:
        """The ConfigMap, the example's Service and the example's Deployment with the
        sidecar merged in: what the API server would be sent."""
        merged = tmp_path / "deployment.yaml"
        merged.write_text(yaml.safe_dump(example_deployment()), encoding="utf-8")
        files = [KDIR / "configmap.yaml", EXAMPLE / "service.yaml", merged]
        result = subprocess.run(
            [kubernetes_validate(), "--strict", "-k", KUBERNETES_VERSION, *map(str, files)],
            capture_output=True,
            text=True,
            timeout=HANG_S,
            check=False,
        )
        out = result.stdout + result.stderr
        assert result.returncode == 0, out
        # Each resource was checked against a schema, not skipped for want of one.
        assert out.count("passed for resource") == len(files), out

    def test_podmonitor(self) -> None:
        pm = one("podmonitor.yaml", "PodMonitor", EXAMPLE)
        assert pm["apiVersion"] == "monitoring.coreos.com/v1"
        assert pm["metadata"]["name"]
        spec = pm["spec"]
        template = example_deployment()["spec"]["template"]
        assert spec["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        assert set(spec["selector"]) == {"matchLabels"}
        ports = named_ports()
        endpoints = spec["podMetricsEndpoints"]
        assert {e["port"] for e in endpoints} == {"http", "triage-metrics"}
        for e in endpoints:
            assert e["port"] in ports, e
            assert e["path"] == "/metrics"
            assert e["interval"] == "15s"

    def test_prometheusrule_shape(self) -> None:
        pr = one("prometheusrule.yaml", "PrometheusRule")
        assert pr["apiVersion"] == "monitoring.coreos.com/v1"
        assert pr["metadata"]["name"] == "vllm-triage"
        assert set(pr["spec"]) == {"groups"}

    def test_prometheusrule_is_what_render_writes(self) -> None:
        """`vllm-triage render rules --format prometheusrule` with the defaults writes it
        byte for byte."""
        assert (KDIR / "prometheusrule.yaml").read_text(encoding="utf-8") == prometheusrule(
            objectives_of(load_settings(), origin(None))
        )

    def test_prometheusrule_groups_are_the_rules_files(self) -> None:
        pr = one("prometheusrule.yaml", "PrometheusRule")
        rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
        assert pr["spec"]["groups"] == rules["groups"]

    @pytest.mark.prometheus
    def test_prometheusrule_groups_pass_promtool(self, tmp_path: Path) -> None:
        binary = shutil.which("promtool")
        if binary is None:
            pytest.fail("promtool not found: install Debian's prometheus package")
        pr = one("prometheusrule.yaml", "PrometheusRule")
        rules = tmp_path / "prometheusrule.rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": pr["spec"]["groups"]}), encoding="utf-8")
        result = subprocess.run(
            [binary, "check", "rules", str(rules)],
            capture_output=True,
            text=True,
            timeout=HANG_S,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        count = sum(len(g["rules"]) for g in pr["spec"]["groups"])
        assert f"SUCCESS: {count} rules found" in result.stdout


#: The termination budget's parts that no field states (deployment.yaml's comment):
#: vLLM's exit after its drain (engine processes stop, the GPU is released), and the
#: sidecar's own exit after its delivery grace, with slack.
VLLM_EXIT_S = 5
SIDECAR_EXIT_S = 5
#: The sidecar's memory ceiling, derived from the daemon's bounds (docs/deploy.md):
#: peak RSS under the largest scrape the defaults allow (bench/bench_peak_rss.py), a full
#: delivery queue per receiver, SQLite's page cache; budgeted for this many receivers.
PEAK_RSS_MB = 159
QUEUE_MB_PER_RECEIVER = 3.0
STORE_CACHE_MB = 2
RECEIVERS_BUDGETED = 3
#: The bounds those figures were measured at.
MEASURED_AT = {
    "max_body_bytes": 16 * 2**20,
    "max_models_per_target": 100,
    "max_lines_per_scrape": 50_000,
    "max_label_value_length": 1024,
}


def mebibytes(quantity: str) -> float:
    assert quantity.endswith("Mi"), quantity
    return float(quantity[:-2])


def sidecar_settings(tmp_path: Path) -> Any:
    """The settings the sidecar runs with: the ConfigMap's file under its arguments, read
    as `run` reads them."""
    path = tmp_path / "triage.yaml"
    path.write_text(triage_yaml(), encoding="utf-8")
    return load_settings(path, flags(build_parser().parse_args(sidecar()["args"])))


def references(obj: Any) -> list[Any]:
    """Every port, path and command word anywhere inside ``obj`` (probes, hooks)."""
    out: list[Any] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("port", "path"):
                out.append(value)
            elif key == "command" and isinstance(value, list):
                out.extend(value)
            else:
                out.extend(references(value))
    elif isinstance(obj, list):
        for item in obj:
            out.extend(references(item))
    return out


class TestSidecar:
    def test_is_native(self) -> None:
        """An init container that restarts: a sidecar for the pod's life (Kubernetes 1.29+)."""
        c = sidecar()
        assert c["restartPolicy"] == "Always"
        assert all(x["name"] != "vllm-triage" for x in pod_spec()["containers"])

    def test_gates_nothing(self) -> None:
        """No readiness probe (a native sidecar's readiness is the pod's: a monitor that
        stopped answering would take vLLM out of its Service) and no startup probe (it
        would hold vLLM's start back). Liveness only, on its own endpoint."""
        c = sidecar()
        assert "readinessProbe" not in c
        assert "startupProbe" not in c
        own = {p["name"] for p in c["ports"]} | {p["containerPort"] for p in c["ports"]}
        get = c["livenessProbe"]["httpGet"]
        assert get["path"] == "/healthz"
        assert get["port"] in own

    def test_vllm_never_references_the_sidecars_health(self) -> None:
        """vLLM's probes and hooks, and every other container's, look at vLLM only."""
        c = sidecar()
        own = {p["name"] for p in c["ports"]} | {p["containerPort"] for p in c["ports"]}
        own |= {str(p) for p in own}
        spec = pod_spec()
        others = [x for x in spec["containers"]] + [
            x for x in spec.get("initContainers", []) if x["name"] != "vllm-triage"
        ]
        assert others, "no vLLM container"
        for other in others:
            found = references(
                {k: v for k, v in other.items() if k.endswith("Probe") or k == "lifecycle"}
            )
            assert not own.intersection(str(x) for x in found), other["name"]
            assert not {"/healthz", "/readyz"}.intersection(str(x) for x in found)
            text = json.dumps(other)
            assert "vllm-triage" not in text and "9468" not in text, other["name"]
        assert "readinessGates" not in spec

    def test_termination_budget_adds_up(self, tmp_path: Path) -> None:
        """vLLM's preStop sleep, its drain, its exit, then the sidecar's delivery grace
        and its exit, one after the other, fit in the pod's grace period."""
        vllm = container("vllm")
        args = vllm["args"]
        drain = int(args[args.index("--shutdown-timeout") + 1])
        assert drain > 0, "vLLM would abort running requests on SIGTERM"
        pre_stop = int(vllm["lifecycle"]["preStop"]["sleep"]["seconds"])
        grace = sidecar_settings(tmp_path).shutdown_grace_seconds
        budget = pre_stop + drain + VLLM_EXIT_S + grace + SIDECAR_EXIT_S
        assert pod_spec()["terminationGracePeriodSeconds"] >= budget

    def test_the_image_default_grace_is_the_configmaps(self, tmp_path: Path) -> None:
        image = load_settings(ROOT / "deploy" / "container" / "triage.yaml")
        assert image.shutdown_grace_seconds == sidecar_settings(tmp_path).shutdown_grace_seconds

    def test_memory_limit_covers_the_derived_ceiling(self, tmp_path: Path) -> None:
        """The limit holds the worst case its bounds allow, with a fifth to spare (an
        OOM kill restarts the sidecar alone, but the pod is not ready meanwhile); the
        bounds are the ones it was measured at (raise one, measure again)."""
        settings = sidecar_settings(tmp_path)
        for key, value in MEASURED_AT.items():
            assert getattr(settings, key) == value, key
        assert all(r.queue_size <= 1000 for r in settings.receivers)
        res = sidecar()["resources"]
        ceiling_mb = PEAK_RSS_MB + RECEIVERS_BUDGETED * QUEUE_MB_PER_RECEIVER + STORE_CACHE_MB
        limit_mb = mebibytes(res["limits"]["memory"]) * 2**20 / 1e6
        assert limit_mb >= 1.2 * ceiling_mb
        # The request covers one daemon with one ordinary target (52 MB, docs/deploy.md).
        assert mebibytes(res["requests"]["memory"]) * 2**20 >= 52e6
        assert res["requests"]["cpu"].endswith("m") and res["limits"]["cpu"].endswith("m")
        assert int(res["limits"]["cpu"][:-1]) > int(res["requests"]["cpu"][:-1])

    def test_port_is_the_daemons_default_listen_port(self, tmp_path: Path) -> None:
        _, default_port = split_listen(load_settings().listen)
        assert named_ports()["triage-metrics"] == default_port
        assert split_listen(sidecar_settings(tmp_path).listen)[1] == default_port

    def test_security_context(self) -> None:
        sc = sidecar()["securityContext"]
        assert sc["runAsNonRoot"] is True
        assert sc["runAsUser"] == 65532
        assert sc["runAsGroup"] == 65532
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "add" not in sc["capabilities"]
        assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        # The image's own numeric user.
        user = re.search(r"^USER (\d+):(\d+)$", DOCKERFILE.read_text(encoding="utf-8"), re.M)
        assert user is not None
        assert (sc["runAsUser"], sc["runAsGroup"]) == (int(user[1]), int(user[2]))

    def test_state_dir_is_a_writable_volume(self, tmp_path: Path) -> None:
        """The one writable path (the root filesystem stays read-only): a volume that
        outlives a restart of the container, mounted where the settings keep state."""
        state = sidecar_settings(tmp_path).state_path(None)
        assert state is not None and state.is_absolute()
        c = sidecar()
        mounts = [m for m in c["volumeMounts"] if m["mountPath"] == str(state)]
        assert len(mounts) == 1 and not mounts[0].get("readOnly", False)
        volume = next(v for v in pod_spec()["volumes"] if v["name"] == mounts[0]["name"])
        assert "emptyDir" in volume or "persistentVolumeClaim" in volume
        assert c["securityContext"]["readOnlyRootFilesystem"] is True

    def test_config_mount_matches_the_images_cmd(self) -> None:
        cmd = dockerfile_cmd()
        config_path = Path(cmd[cmd.index("--config") + 1])
        assert str(config_path) == "/etc/vllm-triage/triage.yaml"
        c = sidecar()
        assert c["args"][: len(cmd)] == cmd  # the image's command, then the sidecar's own
        mounts = [m for m in c["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
        assert len(mounts) == 1
        assert mounts[0]["readOnly"] is True
        volume = next(v for v in pod_spec()["volumes"] if v["name"] == mounts[0]["name"])
        configmap = one("configmap.yaml", "ConfigMap")
        assert volume["configMap"] == {"name": configmap["metadata"]["name"], "optional": True}
        assert config_path.name in configmap["data"]


class TestConfigMap:
    def test_loads_with_the_daemons_settings(self, tmp_path: Path) -> None:
        settings = sidecar_settings(tmp_path)
        assert [t.url for t in settings.targets] == ["http://127.0.0.1:8000/metrics"]
        assert settings.interval_seconds == 5
        assert settings.receivers == []
        assert str(settings.state_path(None)) == "/var/lib/vllm-triage"

    def test_target_is_the_vllm_containers_port(self, tmp_path: Path) -> None:
        [target] = sidecar_settings(tmp_path).targets
        assert target.url == f"http://127.0.0.1:{named_ports()['http']}/metrics"
        args = container("vllm")["args"]
        assert args[args.index("--port") + 1] == str(named_ports()["http"])

    def test_the_commented_receiver_is_valid(self, tmp_path: Path) -> None:
        """Uncommenting the Alertmanager example gives valid settings."""
        text = re.sub(r"^# (receivers:|  )", r"\1", triage_yaml(), flags=re.M)
        path = tmp_path / "triage.yaml"
        path.write_text(text, encoding="utf-8")
        (receiver,) = load_settings(path).receivers
        assert receiver.type == "alertmanager"
        assert receiver.url.get_secret_value() == "http://alertmanager-operated.monitoring:9093"


class TestWorkloadAndService:
    def test_vllm_container(self) -> None:
        c = container("vllm")
        assert c["image"] == "vllm/vllm-openai:v0.32.0"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
        shm = next(m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm")
        volume = next(v for v in pod_spec()["volumes"] if v["name"] == shm["name"])
        assert volume["emptyDir"]["medium"] == "Memory"

    def test_no_service_links(self) -> None:
        """A Service named `vllm` would inject VLLM_PORT=tcp://..., which vLLM reads as
        its own setting and refuses."""
        assert pod_spec()["enableServiceLinks"] is False

    def test_selectors_match_the_pod(self) -> None:
        deployment = example_deployment()
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        service = one("service.yaml", "Service", EXAMPLE)
        assert service["spec"]["selector"].items() <= labels.items()

    def test_service_ports(self) -> None:
        ports = {p["name"]: p for p in one("service.yaml", "Service", EXAMPLE)["spec"]["ports"]}
        assert set(ports) == {"http", "triage-metrics"}
        assert ports["http"]["port"] == 8000
        assert ports["triage-metrics"]["port"] == 9468
        named = named_ports()
        for name, p in ports.items():
            target = p["targetPort"]
            assert named[name] == (named[target] if isinstance(target, str) else target)
        # Before Kubernetes 1.32, Service endpoints do not resolve a sidecar's named port.
        assert isinstance(ports["triage-metrics"]["targetPort"], int)


FLEET = KDIR / "fleet"
FLEET_CORE = ("configmap.yaml", "service.yaml", "statefulset.yaml")
#: The fleet daemon's peak resident memory at 2,000 servers (bench/bench_fleet.py,
#: docs/benchmarks.md), what its memory limit is held to.
FLEET_RSS_MB_AT_2000 = 152


def fleet_doc(name: str, kind: str) -> dict[str, Any]:
    found = [d for d in yaml.safe_load_all((FLEET / name).read_text(encoding="utf-8")) if d]
    found = [d for d in found if d.get("kind") == kind]
    assert len(found) == 1, f"fleet/{name}: expected one {kind}"
    return found[0]


def fleet_container() -> dict[str, Any]:
    spec = fleet_doc("statefulset.yaml", "StatefulSet")["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == "vllm-triage"]
    return c


def fleet_settings(tmp_path: Path, env: dict[str, str] | None = None) -> Any:
    path = tmp_path / "triage.yaml"
    path.write_text(fleet_doc("configmap.yaml", "ConfigMap")["data"]["triage.yaml"])
    mp = pytest.MonkeyPatch()
    try:
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        return load_settings(path)
    finally:
        mp.undo()


class TestFleet:
    """deploy/kubernetes/fleet/: fleet mode as a StatefulSet, one shard per replica."""

    def test_core_objects_pass_kubernetes_validate(self) -> None:
        result = subprocess.run(
            [
                kubernetes_validate(),
                "--strict",
                "-k",
                KUBERNETES_VERSION,
                *(str(FLEET / name) for name in FLEET_CORE),
            ],
            capture_output=True,
            text=True,
            timeout=HANG_S,
            check=False,
        )
        out = result.stdout + result.stderr
        assert result.returncode == 0, out
        assert out.count("passed for resource") == len(FLEET_CORE), out

    def test_kustomization_lists_every_manifest(self) -> None:
        kust = yaml.safe_load((FLEET / "kustomization.yaml").read_text(encoding="utf-8"))
        on_disk = {p.name for p in FLEET.glob("*.yaml")} - {"kustomization.yaml"}
        assert sorted(kust["resources"]) == sorted(on_disk) == sorted(FLEET_CORE)
        assert "namespace" not in kust

    def test_one_shard_per_replica(self, tmp_path: Path) -> None:
        """replicas equal shard.count, and each pod's ordinal (the pod-index label,
        through the downward API) is its shard index."""
        sts = fleet_doc("statefulset.yaml", "StatefulSet")
        settings = fleet_settings(tmp_path)
        assert settings.source == "prometheus" and settings.prometheus is not None
        assert settings.prometheus.shard.count == sts["spec"]["replicas"] >= 2
        (env,) = [
            e for e in fleet_container()["env"] if e["name"].startswith("VLLM_TRIAGE_PROMETHEUS")
        ]
        assert env["name"] == "VLLM_TRIAGE_PROMETHEUS__SHARD__INDEX"
        ref = env["valueFrom"]["fieldRef"]["fieldPath"]
        assert ref == "metadata.labels['apps.kubernetes.io/pod-index']"
        for index in range(sts["spec"]["replicas"]):
            prom = fleet_settings(tmp_path, {env["name"]: str(index)}).prometheus
            assert prom is not None and prom.shard.index == index
            assert prom.url == settings.prometheus.url  # the file's other keys stay

    def test_the_governing_service_and_the_pods(self) -> None:
        sts = fleet_doc("statefulset.yaml", "StatefulSet")
        svc = fleet_doc("service.yaml", "Service")
        assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
        assert svc["spec"]["clusterIP"] == "None"
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items()
        assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert sts["spec"]["podManagementPolicy"] == "Parallel"

    def test_the_container(self, tmp_path: Path) -> None:
        c = fleet_container()
        settings = fleet_settings(tmp_path)
        assert c["args"] == dockerfile_cmd()
        port = {p["name"]: p["containerPort"] for p in c["ports"]}["triage-metrics"]
        assert split_listen(settings.listen)[1] == port
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts["/etc/vllm-triage"] == "triage-config"
        state = settings.state_path(None)
        claims = {
            t["metadata"]["name"]
            for t in fleet_doc("statefulset.yaml", "StatefulSet")["spec"]["volumeClaimTemplates"]
        }
        assert mounts[str(state)] in claims  # one state volume per replica

    def test_memory_covers_the_measured_fleet(self) -> None:
        res = fleet_container()["resources"]
        limit_mb = mebibytes(res["limits"]["memory"]) * 2**20 / 1e6
        assert limit_mb >= 2 * FLEET_RSS_MB_AT_2000
        assert mebibytes(res["requests"]["memory"]) * 2**20 / 1e6 >= FLEET_RSS_MB_AT_2000

    def test_the_configmap_names_an_alertmanager_for_deduplication(self) -> None:
        """Overlapping replicas send identical alerts; only Alertmanager merges them."""
        text = fleet_doc("configmap.yaml", "ConfigMap")["data"]["triage.yaml"]
        assert "#   - type: alertmanager" in text
