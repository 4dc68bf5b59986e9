"""Who can reach the daemon's port (deploy/kubernetes/fleet/networkpolicy/): a
NetworkPolicy, opt-in, for the fleet's own pods only, that provably leaves vLLM's ingress
as it was; and none for the sidecar, whose pod is vLLM's.

A NetworkPolicy selects pods, not containers: one that selected the sidecar's pod would
isolate vLLM's port too (every port it did not list closed: an outage caused by the
monitor), and listing vLLM's port "from anywhere" would widen what another policy of
the user's allowed. So the check here is on the selector: it must match the fleet's pods
and no pod vLLM runs in."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import smp
from support.clirun import HANG_S
from support.paths import ROOT

KDIR = ROOT / "deploy" / "kubernetes"
FLEET = KDIR / "fleet"
OPT_IN = FLEET / "networkpolicy"
EXAMPLE = ROOT / "deploy" / "examples" / "kubernetes-full"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def policy() -> dict[str, Any]:
    (doc,) = docs(OPT_IN / "networkpolicy.yaml")
    assert doc["kind"] == "NetworkPolicy"
    return doc


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector as Kubernetes reads it (matchLabels, matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and labels.get(key) in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True


def fleet_pod_labels() -> dict[str, str]:
    """The StatefulSet's pods' labels, with kustomization.yaml's labels applied."""
    kust = yaml.safe_load((FLEET / "kustomization.yaml").read_text(encoding="utf-8"))
    (sts,) = [d for d in docs(FLEET / "statefulset.yaml") if d["kind"] == "StatefulSet"]
    labels = dict(sts["spec"]["template"]["metadata"].get("labels", {}))
    for entry in kust.get("labels", []):
        labels.update(entry["pairs"])
    return labels


def vllm_pods() -> list[tuple[str, dict[str, str], list[dict[str, Any]]]]:
    """Every pod a vLLM container runs in that these manifests describe: the example's,
    with the sidecar merged in."""
    (deployment,) = [d for d in docs(EXAMPLE / "deployment.yaml") if d["kind"] == "Deployment"]
    (patch,) = docs(KDIR / "sidecar-patch.yaml")
    merged = smp.apply(deployment, patch)
    template = merged["spec"]["template"]
    containers = template["spec"]["containers"] + template["spec"].get("initContainers", [])
    return [("example", dict(template["metadata"]["labels"]), containers)]


def test_it_selects_the_fleets_pods_and_no_pod_vllm_runs_in() -> None:
    selector = policy()["spec"]["podSelector"]
    assert selector, "an empty podSelector selects every pod of the namespace"
    assert matches(selector, fleet_pod_labels())
    for name, labels, containers in vllm_pods():
        assert any("vllm" in c["image"] and c["name"] != "vllm-triage" for c in containers)
        assert not matches(selector, labels), name
    # The fleet's pods run the daemon alone.
    (sts,) = [d for d in docs(FLEET / "statefulset.yaml") if d["kind"] == "StatefulSet"]
    assert [c["name"] for c in sts["spec"]["template"]["spec"]["containers"]] == ["vllm-triage"]


def test_ingress_only_on_the_daemons_port() -> None:
    spec = policy()["spec"]
    assert spec["policyTypes"] == ["Ingress"]  # egress untouched: Prometheus, receivers
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": "triage-metrics", "protocol": "TCP"}]
    assert rule["from"], "a rule without `from` admits everyone"


def test_it_is_opt_in() -> None:
    """Not in the fleet's kustomization, nor anywhere the sidecar is."""
    kust = yaml.safe_load((FLEET / "kustomization.yaml").read_text(encoding="utf-8"))
    assert not any("networkpolicy" in r for r in kust["resources"])
    component = yaml.safe_load((OPT_IN / "kustomization.yaml").read_text(encoding="utf-8"))
    assert component["kind"] == "Component" and component["resources"] == ["networkpolicy.yaml"]
    for path in [*KDIR.glob("*.yaml"), *EXAMPLE.glob("*.yaml")]:
        assert all(d.get("kind") != "NetworkPolicy" for d in docs(path)), path


def test_it_passes_kubernetes_validate() -> None:
    sibling = Path(sys.executable).parent / "kubernetes-validate"
    found = str(sibling) if sibling.exists() else shutil.which("kubernetes-validate")
    if found is None:
        pytest.fail("kubernetes-validate not found: pip install kubernetes-validate (test extras)")
    result = subprocess.run(
        [found, "--strict", "-k", "1.31.0", str(OPT_IN / "networkpolicy.yaml")],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "passed for resource" in out, out
