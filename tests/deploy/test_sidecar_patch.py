"""``vllm-triage render sidecar`` joins vllm-triage to a vLLM Deployment a user already
runs, from the Deployment's name said once: applied as ``kubectl patch`` and kustomize
apply it (``support.smp``, and the real kubectl under ``-m kubectl``), it adds the sidecar
and its two volumes and leaves every other byte of the Deployment as it was; applying it
twice adds nothing, the remove patch takes out exactly what it added, and a name that is
not there fails loudly, naming it, instead of patching nothing or renaming anything.

The Deployments joined: a release of vLLM production-stack's Helm chart (two models,
rendered by hand from the chart's templates, tests/fixtures/kubernetes/production-stack/),
a Helm-shaped one with an init container and a second container of its own, and the
example's plain vLLM. deploy/kubernetes/ is what ``render sidecar --deployment vllm``
writes.
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

from vllm_triage import __version__
from vllm_triage.cli import build_parser
from vllm_triage.commands.run import flags
from vllm_triage.config.load import load_settings, service_links
from vllm_triage.render.sidecar import FILES, IMAGE_REPOSITORY, Sidecar, image_of, render

from support import smp
from support.clirun import HANG_S, vllm_triage
from support.paths import ROOT

KDIR = ROOT / "deploy" / "kubernetes"
EXAMPLE = ROOT / "deploy" / "examples" / "kubernetes-full"
EXISTING = ROOT / "tests" / "fixtures" / "kubernetes" / "existing-vllm.yaml"
STACK = ROOT / "tests" / "fixtures" / "kubernetes" / "production-stack" / "release.yaml"
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


def stack() -> list[dict[str, Any]]:
    """The production-stack release's Deployments."""
    return [d for d in yaml.safe_load_all(STACK.read_text(encoding="utf-8")) if d]


def sidecar_for(deployment: dict[str, Any]) -> dict[str, str]:
    """``render sidecar`` for ``deployment``, by its name and namespace."""
    meta = deployment["metadata"]
    return render(Sidecar(meta["name"], image_of(__version__), namespace=meta.get("namespace")))


def patch_of(deployment: dict[str, Any], which: str = "sidecar-patch.yaml") -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(sidecar_for(deployment)[which])
    return found


def targets() -> list[dict[str, Any]]:
    example = next(
        d
        for d in yaml.safe_load_all((EXAMPLE / "deployment.yaml").read_text(encoding="utf-8"))
        if d and d["kind"] == "Deployment"
    )
    return [*stack(), load(EXISTING), example]


IDS = ["stack-llama3", "stack-mistral", "existing", "example"]


def outside_the_patch(deployment: dict[str, Any]) -> dict[str, Any]:
    """Everything of the Deployment but the lists the patch adds to."""
    rest = copy.deepcopy(deployment)
    spec = pod(rest)
    spec.pop("volumes", None)
    spec.pop("initContainers", None)
    return rest


def without_empty_lists_it_lacked(back: dict[str, Any], original: dict[str, Any]) -> None:
    """An empty ``initContainers`` or ``volumes`` where the original had none: what a
    strategic merge leaves of a list whose one item it deleted. The API server stores
    none (the fields are omitted when empty), so the object read back is the original."""
    for section in ("initContainers", "volumes"):
        if section not in pod(original) and pod(back).get(section) == []:
            del pod(back)[section]


@pytest.mark.parametrize("target", targets(), ids=IDS)
class TestJoin:
    def test_the_vllm_container_is_byte_identical(self, target: dict[str, Any]) -> None:
        merged = smp.apply(target, patch_of(target))
        before = by_name(pod(target)["containers"])
        after = by_name(pod(merged)["containers"])
        assert "vllm" in before
        assert list(after) == list(before)  # no container added or reordered
        for name, container in before.items():
            assert json.dumps(after[name], sort_keys=False) == json.dumps(container), name

    def test_nothing_outside_the_added_entries_changes(self, target: dict[str, Any]) -> None:
        """Name, namespace, selector, labels, replicas, strategy, the pod's other fields:
        as they were; the init containers and volumes it had are kept, in their order."""
        merged = smp.apply(target, patch_of(target))
        assert outside_the_patch(merged) == outside_the_patch(target)
        for section in ("initContainers", "volumes"):
            kept = [i for i in pod(merged).get(section, []) if i["name"] not in (SIDECAR, *VOLUMES)]
            assert kept == pod(target).get(section, []), section

    def test_the_sidecar_and_its_volumes_are_added(self, target: dict[str, Any]) -> None:
        patch = patch_of(target)
        merged = smp.apply(target, patch)
        sidecar = by_name(pod(merged)["initContainers"])[SIDECAR]
        assert sidecar == by_name(pod(patch)["initContainers"])[SIDECAR]
        assert sidecar["restartPolicy"] == "Always"
        volumes = by_name(pod(merged)["volumes"])
        assert {m["name"] for m in sidecar["volumeMounts"]} == set(VOLUMES)
        assert set(volumes) == {v["name"] for v in pod(target).get("volumes", [])} | set(VOLUMES)

    def test_patching_twice_changes_nothing_more(self, target: dict[str, Any]) -> None:
        patch = patch_of(target)
        once = smp.apply(target, patch)
        assert smp.apply(once, patch) == once

    def test_the_remove_patch_gives_back_the_deployment(self, target: dict[str, Any]) -> None:
        merged = smp.apply(target, patch_of(target))
        back = smp.apply(merged, patch_of(target, "sidecar-remove.yaml"))
        without_empty_lists_it_lacked(back, target)
        assert back == target


class TestOneName:
    """The Deployment's name is said once, to ``render sidecar``; the patch itself names
    no Deployment, so applied to a file it renames nothing."""

    def test_the_patch_names_no_deployment(self) -> None:
        for deployment in targets():
            for which in ("sidecar-patch.yaml", "sidecar-remove.yaml"):
                patch = patch_of(deployment, which)
                assert set(patch) == {"apiVersion", "kind", "spec"}, which
                assert (patch["apiVersion"], patch["kind"]) == ("apps/v1", "Deployment")

    def test_it_reaches_only_the_sidecar_entry_and_two_volumes(self) -> None:
        """The whole patch, field by field: one init container by name and two volumes,
        no `containers` (the vLLM container is never named), no selector, no labels, no
        pod-level setting."""
        patch = patch_of(stack()[0])
        assert set(patch["spec"]) == {"template"}
        assert set(patch["spec"]["template"]) == {"spec"}
        assert set(pod(patch)) == {"initContainers", "volumes"}
        assert [c["name"] for c in pod(patch)["initContainers"]] == [SIDECAR]
        assert [v["name"] for v in pod(patch)["volumes"]] == list(VOLUMES)

    def test_the_remove_patch_removes_exactly_what_the_patch_adds(self) -> None:
        patch, remove = patch_of(stack()[0]), patch_of(stack()[0], "sidecar-remove.yaml")
        for section in ("initContainers", "volumes"):
            assert [i["name"] for i in pod(remove)[section]] == [
                i["name"] for i in pod(patch)[section]
            ]
            assert all(i == {"name": i["name"], "$patch": "delete"} for i in pod(remove)[section])

    def test_the_configmap_lives_where_the_deployment_lives(self) -> None:
        for deployment in stack():
            files = sidecar_for(deployment)
            cm = yaml.safe_load(files["configmap.yaml"])
            assert cm["metadata"]["namespace"] == deployment["metadata"]["namespace"] == "llm"
            volume = by_name(pod(yaml.safe_load(files["sidecar-patch.yaml"]))["volumes"])
            config = volume["triage-config"]["configMap"]
            assert config == {"name": cm["metadata"]["name"], "optional": True}

    def test_each_deployment_has_a_configmap_of_its_own(self) -> None:
        names = {
            yaml.safe_load(sidecar_for(d)["configmap.yaml"])["metadata"]["name"] for d in stack()
        }
        assert names == {
            "vllm-triage-vllm-llama3-deployment-vllm",
            "vllm-triage-vllm-mistral-deployment-vllm",
        }

    def test_the_sidecar_names_its_server_and_reads_its_vllm(self, tmp_path: Path) -> None:
        """Its alerts carry the pod's namespace and name (the downward API), and its target
        is vLLM's port on the pod's loopback: the settings it runs with, read as `run`
        reads its arguments."""
        files = sidecar_for(stack()[0])
        container = by_name(pod(yaml.safe_load(files["sidecar-patch.yaml"]))["initContainers"])
        sidecar = container[SIDECAR]
        env = {
            e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] if "valueFrom" in e else e["value"]
            for e in sidecar["env"]
        }
        assert env == {
            "VLLM_TRIAGE_ALERTING__SERVER_LABELS__NAMESPACE": "metadata.namespace",
            "VLLM_TRIAGE_ALERTING__SERVER_LABELS__POD": "metadata.name",
            # Recording's bound, below the state volume (tests/runtime/scrape/).
            "VLLM_TRIAGE_RECORD__MAX_BYTES": "33554432",
        }
        args = build_parser().parse_args(sidecar["args"])
        path = tmp_path / "triage.yaml"
        path.write_text(yaml.safe_load(files["configmap.yaml"])["data"]["triage.yaml"])
        settings = load_settings(path, flags(args))
        [target] = settings.targets
        assert (target.name, target.url) == (
            "vllm-llama3-deployment-vllm",
            "http://127.0.0.1:8000/metrics",
        )
        assert args.config == "/etc/vllm-triage/triage.yaml" and args.config_optional

    def test_the_image_is_the_release_at_this_version(self) -> None:
        patch = patch_of(stack()[0])
        [sidecar] = pod(patch)["initContainers"]
        assert sidecar["image"] == f"{IMAGE_REPOSITORY}:{__version__}"


class TestShipped:
    """deploy/kubernetes/ is ``render sidecar --deployment vllm``'s output."""

    def test_deploy_kubernetes_is_what_render_writes(self, tmp_path: Path) -> None:
        result = vllm_triage(
            "render", "sidecar", "--deployment", "vllm", "--output", str(tmp_path), cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
        for name in FILES:
            assert (KDIR / name).read_text(encoding="utf-8") == (tmp_path / name).read_text(
                encoding="utf-8"
            ), f"deploy/kubernetes/{name}: run `vllm-triage render sidecar --deployment vllm "
            "--output deploy/kubernetes`"

    def test_every_file_is_listed_or_said_to_be_applied_apart(self) -> None:
        kust = load(KDIR / "kustomization.yaml")
        assert kust["resources"] == ["configmap.yaml"]
        apart = {p.name for p in KDIR.glob("*.yaml")} - {"configmap.yaml", "kustomization.yaml"}
        assert apart == {"prometheusrule.yaml", "sidecar-patch.yaml", "sidecar-remove.yaml"}


class TestCommand:
    def test_several_names_one_folder_each_and_the_same_bytes_again(self, tmp_path: Path) -> None:
        names = [d["metadata"]["name"] for d in stack()]
        args = ["render", "sidecar", "--deployment", *names, "--namespace", "llm"]
        first = vllm_triage(*args, "--output", str(tmp_path / "a"), cwd=tmp_path)
        again = vllm_triage(*args, "--output", str(tmp_path / "a"), cwd=tmp_path)
        other = vllm_triage(*args, "--output", str(tmp_path / "b"), cwd=tmp_path)
        assert first.returncode == again.returncode == other.returncode == 0, first.stderr
        for name in names:
            assert f"kubectl patch deployment {name} -n llm" in first.stdout
            for file in FILES:
                a = (tmp_path / "a" / name / file).read_bytes()
                assert a == (tmp_path / "b" / name / file).read_bytes(), file

    @pytest.mark.parametrize(
        ("argv", "said"),
        [
            (["--output", "x"], "needs --deployment NAME"),
            (["--deployment", "vllm"], "give --output DIR"),
            (["--deployment", "Llama_3", "--output", "x"], "--deployment 'Llama_3'"),
            (["--deployment", "a", "a", "--output", "x"], "--deployment a given twice"),
            (["--deployment", "a", "--namespace", "LLM", "--output", "x"], "--namespace 'LLM'"),
            (["--deployment", "a", "--port", "9468", "--output", "x"], "--port 9468"),
        ],
        ids=[
            "no-deployment",
            "no-output",
            "not-a-dns-name",
            "named-twice",
            "namespace-not-a-dns-label",
            "port-is-the-sidecars",
        ],
    )
    def test_what_cannot_be_applied_is_refused(
        self, tmp_path: Path, argv: list[str], said: str
    ) -> None:
        result = vllm_triage("render", "sidecar", *argv, cwd=tmp_path)
        assert result.returncode == 2 and said in result.stderr, result.stderr
        assert not (tmp_path / "x").exists()

    def test_a_settings_file_goes_into_the_configmap_checked(self, tmp_path: Path) -> None:
        good = tmp_path / "triage.yaml"
        good.write_text("hardware: {gpu: H100}\nslo: {ttft_p99_seconds: 1.5}\n")
        out = tmp_path / "out"
        result = vllm_triage(
            "render", "sidecar", "--deployment", "vllm", "--config", str(good),
            "--output", str(out), cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        cm = load(out / "configmap.yaml")
        assert cm["data"]["triage.yaml"] == good.read_text()
        for text, said in [
            ("targets: [{url: 'http://x:1/'}]\n", "targets: set by the sidecar's arguments"),
            ("slo: {ttft_p99_seconds: -1}\n", "slo.ttft_p99_seconds"),
            ("hardware: {gpu: H100-80G}\n", "H100-80G"),
        ]:
            bad = tmp_path / "bad.yaml"
            bad.write_text(text)
            result = vllm_triage(
                "render", "sidecar", "--deployment", "vllm", "--config", str(bad),
                "--output", str(tmp_path / "refused"), cwd=tmp_path,
            )  # fmt: skip
            assert result.returncode == 2 and said in result.stderr, result.stderr
            assert not (tmp_path / "refused").exists()


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


def kubectl_binary() -> str:
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.fail("kubectl not found: install it (client only; no cluster is used)")
    return binary


def kubectl_run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # --local and kustomize read no cluster; an empty kubeconfig keeps it from trying.
    env = {**os.environ, "KUBECONFIG": os.devnull}
    return subprocess.run(
        [kubectl_binary(), *args],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
        cwd=cwd,
        env=env,
    )


def kubectl(*args: str, cwd: Path | None = None) -> str:
    result = kubectl_run(*args, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout


def patched_by_kubectl(deployment: Path, patch: Path | None) -> str:
    """kubectl's JSON of ``deployment`` with ``patch`` applied (None: as it is)."""
    how = ["--patch-file", str(patch)] if patch is not None else ["-p", "{}"]
    return kubectl(
        "patch", "--local", "-f", str(deployment), "--type", "strategic", *how, "-o", "json"
    )


def rendered(tmp_path: Path, deployment: dict[str, Any]) -> tuple[Path, Path]:
    """The Deployment alone in a file, and its sidecar's folder, written by the command."""
    name = deployment["metadata"]["name"]
    src = tmp_path / f"{name}.yaml"
    src.write_text(yaml.safe_dump(deployment), encoding="utf-8")
    folder = tmp_path / "triage" / name
    argv = ["--deployment", name, "--namespace", deployment["metadata"]["namespace"]]
    result = vllm_triage("render", "sidecar", *argv, "--output", str(folder), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return src, folder


def kustomization(folder: Path, resources: list[str], components: list[Path]) -> None:
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {"resources": resources, "components": [os.path.relpath(c, folder) for c in components]}
        ),
        encoding="utf-8",
    )


@pytest.mark.kubectl
class TestKubectl:
    @pytest.mark.parametrize("index", [0, 1], ids=["llama3", "mistral"])
    def test_kubectl_patch_joins_the_release_and_remove_gives_it_back(
        self, tmp_path: Path, index: int
    ) -> None:
        """kubectl's own strategic merge on a production-stack Deployment: the vLLM
        container byte for byte as it was, the same as the model's merge, a second patch
        adds nothing, and the remove patch gives the Deployment back byte for byte (the
        one difference where it had no init containers: kubectl keeps the emptied list,
        which the API server does not store)."""
        deployment = stack()[index]
        src, folder = rendered(tmp_path, deployment)
        original = patched_by_kubectl(src, None)
        added = tmp_path / "added.json"
        added.write_text(patched_by_kubectl(src, folder / "sidecar-patch.yaml"))
        got = json.loads(added.read_text())
        before = by_name(pod(json.loads(original))["containers"])
        assert json.dumps(by_name(pod(got)["containers"])) == json.dumps(before)
        want = smp.apply(deployment, load(folder / "sidecar-patch.yaml"))
        for section in ("initContainers", "volumes"):
            assert by_name(pod(got)[section]) == by_name(pod(want)[section]), section
        assert got["metadata"] == json.loads(original)["metadata"]
        assert patched_by_kubectl(added, folder / "sidecar-patch.yaml") == added.read_text()
        back = patched_by_kubectl(added, folder / "sidecar-remove.yaml")
        if "initContainers" in pod(deployment):
            assert back == original
        else:
            assert back.replace('"initContainers": [],\n                ', "") == original

    def test_kubectl_patch_local_renames_nothing(self, tmp_path: Path) -> None:
        """The patch rendered for one name, applied to a file holding another Deployment:
        the name it had stays (the old patch renamed it to its own)."""
        _, folder = rendered(tmp_path, stack()[0])
        other = tmp_path / "other.yaml"
        other.write_text(EXISTING.read_text(encoding="utf-8"))
        got = json.loads(patched_by_kubectl(other, folder / "sidecar-patch.yaml"))
        assert got["metadata"]["name"] == load(EXISTING)["metadata"]["name"]

    def test_kustomize_joins_both_models_of_the_release(self, tmp_path: Path) -> None:
        """The user's kustomization: the release as rendered, and one Component per model."""
        shutil.copy(STACK, tmp_path / "release.yaml")
        names = [d["metadata"]["name"] for d in stack()]
        result = vllm_triage(
            "render", "sidecar", "--deployment", *names, "--namespace", "llm",
            "--output", str(tmp_path / "triage"), cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        kustomization(tmp_path, ["release.yaml"], [tmp_path / "triage" / n for n in names])
        built = [d for d in yaml.safe_load_all(kubectl("kustomize", str(tmp_path))) if d]
        assert sorted(d["kind"] for d in built) == [
            "ConfigMap",
            "ConfigMap",
            "Deployment",
            "Deployment",
        ]
        for original in stack():
            [got] = [
                d for d in built if d["kind"] == "Deployment"
                and d["metadata"]["name"] == original["metadata"]["name"]
            ]  # fmt: skip
            assert got["metadata"] == original["metadata"]
            # kustomize writes every object anew, keys sorted: equal, field for field.
            assert pod(got)["containers"] == pod(original)["containers"]
            assert got["spec"]["selector"] == original["spec"]["selector"]
            volume = by_name(pod(got)["volumes"])["triage-config"]["configMap"]
            [cm] = [
                d
                for d in built
                if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["name"]
            ]
            assert cm["metadata"]["namespace"] == "llm"
            assert SIDECAR in by_name(pod(got)["initContainers"])

    @pytest.mark.parametrize(
        ("flag", "value", "said"),
        [
            ("--deployment", "vllm-llama-deployment-vllm", "vllm-llama-deployment-vllm"),
            ("--namespace", "default", "vllm-llama3-deployment-vllm.default"),
            ("--container", "engine", "[name=engine]"),
        ],
    )
    def test_a_wrong_name_fails_the_build_naming_it(
        self, tmp_path: Path, flag: str, value: str, said: str
    ) -> None:
        shutil.copy(STACK, tmp_path / "release.yaml")
        given = {"--deployment": "vllm-llama3-deployment-vllm", "--namespace": "llm", flag: value}
        argv = [w for k, v in given.items() for w in (k, v)]
        result = vllm_triage(
            "render", "sidecar", *argv, "--output", str(tmp_path / "triage"), cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
        kustomization(tmp_path, ["release.yaml"], [tmp_path / "triage"])
        built = kubectl_run("kustomize", str(tmp_path))
        assert built.returncode != 0 and built.stdout == ""
        assert said in built.stderr, built.stderr

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
