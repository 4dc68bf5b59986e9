"""deploy/kubernetes/sidecar-patch.yaml joins a vLLM Deployment a user already runs: applied
as ``kubectl patch`` and kustomize apply it (``support.smp``, and the real kubectl under
``-m kubectl``), it adds the sidecar and its two volumes and leaves every other byte of the
Deployment as it was: the vLLM container, its other containers, the selector, the labels.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from vllm_triage.config.load import load_settings, service_links

from support import smp
from support.paths import ROOT

KDIR = ROOT / "deploy" / "kubernetes"
EXAMPLE = ROOT / "deploy" / "examples" / "kubernetes-full"
EXISTING = ROOT / "tests" / "fixtures" / "kubernetes" / "existing-vllm.yaml"
PATCH = KDIR / "sidecar-patch.yaml"
REMOVE = KDIR / "sidecar-remove.yaml"
SIDECAR = "vllm-triage"
VOLUMES = ("triage-config", "triage-state")


def load(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return found


def pod(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in items}


def named(patch: dict[str, Any], name: str) -> dict[str, Any]:
    """The patch with its one parameter, the Deployment's name, set to ``name``."""
    out = copy.deepcopy(patch)
    out["metadata"]["name"] = name
    return out


def targets() -> list[dict[str, Any]]:
    """Deployments to join: a user's (Helm-shaped, with init containers, volumes and a
    second container of its own) and the example's plain vLLM."""
    example = next(
        d
        for d in yaml.safe_load_all((EXAMPLE / "deployment.yaml").read_text(encoding="utf-8"))
        if d and d["kind"] == "Deployment"
    )
    return [load(EXISTING), example]


def outside_the_patch(deployment: dict[str, Any]) -> dict[str, Any]:
    """Everything of the Deployment but the lists the patch adds to."""
    rest = copy.deepcopy(deployment)
    spec = pod(rest)
    spec.pop("volumes", None)
    spec.pop("initContainers", None)
    return rest


@pytest.mark.parametrize("target", targets(), ids=["existing", "example"])
class TestJoin:
    def test_the_vllm_container_is_byte_identical(self, target: dict[str, Any]) -> None:
        merged = smp.apply(target, named(load(PATCH), target["metadata"]["name"]))
        before = by_name(pod(target)["containers"])
        after = by_name(pod(merged)["containers"])
        assert "vllm" in before
        assert list(after) == list(before)  # no container added or reordered
        for name, container in before.items():
            assert json.dumps(after[name], sort_keys=False) == json.dumps(container), name

    def test_nothing_outside_the_added_entries_changes(self, target: dict[str, Any]) -> None:
        """Selector, labels, replicas, annotations, the pod's other fields: as they were;
        the init containers and volumes it had are kept, unchanged, in their order."""
        merged = smp.apply(target, named(load(PATCH), target["metadata"]["name"]))
        assert outside_the_patch(merged) == outside_the_patch(target)
        assert merged["spec"]["selector"] == target["spec"]["selector"]
        for section in ("initContainers", "volumes"):
            kept = [i for i in pod(merged).get(section, []) if i["name"] not in (SIDECAR, *VOLUMES)]
            assert kept == pod(target).get(section, []), section

    def test_the_sidecar_and_its_volumes_are_added(self, target: dict[str, Any]) -> None:
        patch = load(PATCH)
        merged = smp.apply(target, named(patch, target["metadata"]["name"]))
        sidecar = by_name(pod(merged)["initContainers"])[SIDECAR]
        assert sidecar == by_name(pod(patch)["initContainers"])[SIDECAR]
        assert sidecar["restartPolicy"] == "Always"
        volumes = by_name(pod(merged)["volumes"])
        assert set(VOLUMES) <= set(volumes)
        assert {m["name"] for m in sidecar["volumeMounts"]} == set(VOLUMES)
        assert set(volumes) == {v["name"] for v in pod(target).get("volumes", [])} | set(VOLUMES)

    def test_patching_twice_changes_nothing_more(self, target: dict[str, Any]) -> None:
        patch = named(load(PATCH), target["metadata"]["name"])
        once = smp.apply(target, patch)
        assert smp.apply(once, patch) == once

    def test_the_remove_patch_gives_back_the_deployment(self, target: dict[str, Any]) -> None:
        name = target["metadata"]["name"]
        merged = smp.apply(target, named(load(PATCH), name))
        back = smp.apply(merged, named(load(REMOVE), name))
        if not pod(target).get("initContainers"):
            pod(back).pop("initContainers", None)  # an empty list where there was none
        assert back == target


class TestTheOneParameter:
    def test_the_name_is_the_deployments(self) -> None:
        """The patch names its target and nothing else: kind Deployment, metadata.name."""
        patch = load(PATCH)
        assert patch["apiVersion"] == "apps/v1" and patch["kind"] == "Deployment"
        assert patch["metadata"] == {"name": "vllm"}

    def test_another_name_is_refused_as_kubectl_refuses_it(self) -> None:
        existing = load(EXISTING)
        with pytest.raises(smp.PatchError, match="does not match"):
            smp.apply(existing, named(load(PATCH), "llama-70b"))
        renamed = copy.deepcopy(existing)
        renamed["metadata"]["name"] = "llama-70b"
        merged = smp.apply(renamed, named(load(PATCH), "llama-70b"))
        assert SIDECAR in by_name(pod(merged)["initContainers"])

    def test_it_reaches_only_the_sidecar_entry_and_two_volumes(self) -> None:
        """The whole patch, field by field: one init container by name and two volumes,
        no `containers` (the vLLM container is never named), no selector, no labels, no
        pod-level setting."""
        patch = load(PATCH)
        assert set(patch) == {"apiVersion", "kind", "metadata", "spec"}
        assert set(patch["spec"]) == {"template"}
        assert set(patch["spec"]["template"]) == {"spec"}
        assert set(pod(patch)) == {"initContainers", "volumes"}
        assert [c["name"] for c in pod(patch)["initContainers"]] == [SIDECAR]
        assert [v["name"] for v in pod(patch)["volumes"]] == list(VOLUMES)

    def test_the_remove_patch_removes_exactly_what_the_patch_adds(self) -> None:
        patch, remove = load(PATCH), load(REMOVE)
        assert remove["metadata"] == patch["metadata"] and remove["kind"] == patch["kind"]
        for section in ("initContainers", "volumes"):
            assert [i["name"] for i in pod(remove)[section]] == [
                i["name"] for i in pod(patch)[section]
            ]
            assert all(i == {"name": i["name"], "$patch": "delete"} for i in pod(remove)[section])

    def test_the_config_volume_is_the_configmap(self) -> None:
        volume = by_name(pod(load(PATCH))["volumes"])["triage-config"]
        assert volume["configMap"]["name"] == load(KDIR / "configmap.yaml")["metadata"]["name"]

    def test_the_sidecar_reads_vllm_over_the_loopback(self, tmp_path: Path) -> None:
        """The ConfigMap's one target is 127.0.0.1 on vLLM's default port, 8000 (the
        example's vLLM serves there; docs say where to change it)."""
        path = tmp_path / "triage.yaml"
        path.write_text(load(KDIR / "configmap.yaml")["data"]["triage.yaml"], encoding="utf-8")
        (target,) = load_settings(path).targets
        assert str(target.url) == "http://127.0.0.1:8000/metrics"


def test_the_readmes_deploy_section_starts_with_the_patch() -> None:
    """The first thing Deploy says is how to join a running vLLM, with commands whose
    files exist and whose name is the patch's."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    deploy = readme.split("\n## Deploy\n", 1)[1].split("\n## ", 1)[0]
    first = deploy.strip().split("\n\n", 1)[0]
    assert "sidecar-patch.yaml" in first and "Deployment" in first
    block = deploy.split("```sh\n", 1)[1].split("```", 1)[0]
    name = load(PATCH)["metadata"]["name"]
    assert block.splitlines() == [
        "kubectl apply -f deploy/kubernetes/configmap.yaml",
        f"kubectl patch deployment {name} --patch-file deploy/kubernetes/sidecar-patch.yaml",
    ]
    for word in block.split():
        if word.startswith("deploy/"):
            assert (ROOT / word).is_file(), word


class TestKustomization:
    def test_a_component_with_the_configmap_and_the_patch(self) -> None:
        kust = load(KDIR / "kustomization.yaml")
        assert kust["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
        assert kust["kind"] == "Component"
        assert kust["resources"] == ["configmap.yaml"]
        # The target is the Deployment by name, in any namespace (a Helm chart's manifest
        # names one): the name the patch carries for kubectl, the one parameter.
        [entry] = kust["patches"]
        assert entry["path"] == "sidecar-patch.yaml"
        assert entry["target"] == {
            "group": "apps",
            "version": "v1",
            "kind": "Deployment",
            "name": load(PATCH)["metadata"]["name"],
        }
        # Nothing else: no namespace, label, name prefix or image of its own on yours.
        assert set(kust) == {"apiVersion", "kind", "resources", "patches"}
        for listed in (*kust["resources"], *(p["path"] for p in kust["patches"])):
            assert (KDIR / listed).is_file(), listed

    def test_every_file_is_listed_or_said_to_be_applied_apart(self) -> None:
        kust = load(KDIR / "kustomization.yaml")
        text = (KDIR / "kustomization.yaml").read_text(encoding="utf-8")
        listed = {*kust["resources"], *(p["path"] for p in kust["patches"])}
        apart = {p.name for p in KDIR.glob("*.yaml")} - listed - {"kustomization.yaml"}
        assert apart == {"prometheusrule.yaml", "sidecar-remove.yaml"}
        assert "prometheusrule.yaml" in text
        assert "sidecar-remove.yaml" in PATCH.read_text(encoding="utf-8")

    def test_the_example_joins_its_vllm_through_the_component(self) -> None:
        """The example lists the Component, its Deployment carries the patch's name (so the
        patch finds it), and its name prefix puts every object under names and labels of
        its own: nothing `vllm` of a user's is replaced or selected."""
        kust = load(EXAMPLE / "kustomization.yaml")
        assert kust["kind"] == "Kustomization"
        assert [(EXAMPLE / c).resolve() for c in kust["components"]] == [KDIR.resolve()]
        prefix = kust["namePrefix"]
        assert prefix == "vllm-triage-example-"
        objects = [
            d
            for name in kust["resources"]
            for d in yaml.safe_load_all((EXAMPLE / name).read_text(encoding="utf-8"))
            if d
        ]
        [deployment] = [d for d in objects if d["kind"] == "Deployment"]
        assert deployment["metadata"]["name"] == load(PATCH)["metadata"]["name"]
        for obj in objects:
            spec = obj.get("spec", {})
            selector = spec.get("selector", {})
            maps = [obj["metadata"].get("labels", {}), selector.get("matchLabels", selector)]
            for labels in maps:
                assert labels == {"app.kubernetes.io/name": "vllm-triage-example"}, obj["kind"]


class TestServiceLinks:
    """A Service named vllm-triage-... (the fleet's, the example's) puts its variables in
    every pod of the namespace, the user's vLLM pods included; the sidecar must start."""

    FLEET: ClassVar[
        dict[str, str]
    ] = {  # what Kubernetes sets for deploy/kubernetes/fleet/service.yaml
        "VLLM_TRIAGE_FLEET_SERVICE_HOST": "10.96.0.12",
        "VLLM_TRIAGE_FLEET_SERVICE_PORT": "9468",
        "VLLM_TRIAGE_FLEET_SERVICE_PORT_TRIAGE_METRICS": "9468",
        "VLLM_TRIAGE_FLEET_PORT": "tcp://10.96.0.12:9468",
        "VLLM_TRIAGE_FLEET_PORT_9468_TCP": "tcp://10.96.0.12:9468",
        "VLLM_TRIAGE_FLEET_PORT_9468_TCP_PROTO": "tcp",
        "VLLM_TRIAGE_FLEET_PORT_9468_TCP_PORT": "9468",
        "VLLM_TRIAGE_FLEET_PORT_9468_TCP_ADDR": "10.96.0.12",
    }

    def test_they_are_recognised(self) -> None:
        assert service_links({**self.FLEET, "VLLM_TRIAGE_SLO__ITL_P99_SECONDS": "0.05"}) == set(
            self.FLEET
        )

    def test_the_sidecar_loads_its_settings_beside_them(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        for key, value in self.FLEET.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("VLLM_TRIAGE_SLO__ITL_P99_SECONDS", "0.05")
        assert load_settings().slo.itl_p99_seconds == 0.05

    def test_a_misspelt_setting_is_still_refused(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Only a Service's own kin count: a `_PORT` setting beside them is not one."""
        for key, value in self.FLEET.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("VLLM_TRIAGE_LISTEN_PORT", "9000")
        with pytest.raises(Exception, match="VLLM_TRIAGE_LISTEN_PORT: unknown variable"):
            load_settings()


# --- The real kubectl: its strategic merge and its kustomize -----------------------------


def kubectl(*args: str, cwd: Path | None = None) -> str:
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.fail("kubectl not found: install it (client only; no cluster is used)")
    # --local and kustomize read no cluster; an empty kubeconfig keeps it from trying.
    env = {**os.environ, "KUBECONFIG": os.devnull}
    result = subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd, env=env
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def patched_by_kubectl(deployment: Path, patch: Path) -> dict[str, Any]:
    out = kubectl(
        "patch", "--local", "-f", str(deployment), "--type", "strategic",
        "--patch-file", str(patch), "-o", "json",
    )  # fmt: skip
    found: dict[str, Any] = json.loads(out)
    return found


@pytest.mark.kubectl
class TestKubectl:
    def test_kubectl_patch_agrees_with_the_model(self) -> None:
        """`kubectl patch` adds what support.smp adds: the same containers, init containers
        and volumes, each byte for byte (kubectl may order the added ones first)."""
        got = patched_by_kubectl(EXISTING, PATCH)
        want = smp.apply(load(EXISTING), load(PATCH))
        for section in ("containers", "initContainers", "volumes"):
            assert by_name(pod(got)[section]) == by_name(pod(want)[section]), section
        assert [c["name"] for c in pod(got)["containers"]] == ["vllm", "log-shipper"]
        assert got["spec"]["selector"] == load(EXISTING)["spec"]["selector"]
        assert got["spec"]["template"]["metadata"] == load(EXISTING)["spec"]["template"]["metadata"]

    def test_kubectl_remove_gives_back_the_deployment(self, tmp_path: Path) -> None:
        patched = tmp_path / "patched.json"
        patched.write_text(json.dumps(patched_by_kubectl(EXISTING, PATCH)), encoding="utf-8")
        back = patched_by_kubectl(patched, REMOVE)
        assert pod(back) == pod(load(EXISTING))

    def test_kustomize_joins_a_users_deployment(self, tmp_path: Path) -> None:
        """A user's kustomization: their Deployment, and deploy/kubernetes as a Component."""
        shutil.copy(EXISTING, tmp_path / "deployment.yaml")
        (tmp_path / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "resources": ["deployment.yaml"],
                    "components": [os.path.relpath(KDIR, tmp_path)],
                }
            ),
            encoding="utf-8",
        )
        built = [d for d in yaml.safe_load_all(kubectl("kustomize", str(tmp_path))) if d]
        assert sorted(d["kind"] for d in built) == ["ConfigMap", "Deployment"]
        [deployment] = [d for d in built if d["kind"] == "Deployment"]
        existing = load(EXISTING)
        assert pod(deployment)["containers"] == pod(existing)["containers"]
        assert deployment["spec"]["selector"] == existing["spec"]["selector"]
        assert by_name(pod(deployment)["initContainers"]) == by_name(
            pod(smp.apply(existing, load(PATCH)))["initContainers"]
        )

    def test_the_example_builds_under_names_of_its_own(self) -> None:
        built = [d for d in yaml.safe_load_all(kubectl("kustomize", str(EXAMPLE))) if d]
        assert sorted(d["kind"] for d in built) == [
            "ConfigMap", "Deployment", "PodMonitor", "Service",
        ]  # fmt: skip
        for d in built:
            assert d["metadata"]["name"].startswith("vllm-triage-example-"), d["kind"]
        [deployment] = [d for d in built if d["kind"] == "Deployment"]
        [configmap] = [d for d in built if d["kind"] == "ConfigMap"]
        volume = by_name(pod(deployment)["volumes"])["triage-config"]
        assert volume["configMap"]["name"] == configmap["metadata"]["name"]
        assert SIDECAR in by_name(pod(deployment)["initContainers"])
