"""The Kubernetes sidecar for one vLLM Deployment, from its name said once.

Pure: a ``Sidecar`` (the Deployment's name, namespace, vLLM's container and port, the
image and the settings text) in, the files out: ``sidecar-patch.yaml`` (a strategic
merge patch that names no Deployment: kubectl names it on its command line),
``sidecar-remove.yaml``, ``configmap.yaml`` (in the Deployment's namespace) and
``kustomization.yaml`` (a Component whose patch names the Deployment, and whose one
replacement fails the build when the Deployment or its container is missing). The same
``Sidecar`` always gives the same bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from vllm_triage.render.templates import fill, template

#: Where the release workflow pushes the image (.github/workflows/release.yml, IMAGE);
#: the manifests name it at the package's version (``image_of``).
IMAGE_REPOSITORY = "ghcr.io/vllm-triage/vllm-triage"
#: The sidecar's own port (its listen address, its liveness probe).
SIDECAR_PORT = 9468
#: What a target name may be (the settings' ``Name``).
MAX_NAME = 128

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

#: The files one Deployment's sidecar is, in the order they are written and listed.
FILES = ("configmap.yaml", "sidecar-patch.yaml", "sidecar-remove.yaml", "kustomization.yaml")


@dataclass(frozen=True, slots=True)
class Sidecar:
    """One Deployment's sidecar: what ``render sidecar`` is told."""

    deployment: str
    image: str
    namespace: str | None = None
    container: str = "vllm"
    port: int = 8000
    #: The ConfigMap's ``triage.yaml``; None: the commented defaults.
    settings: str | None = None
    #: The command line that rendered it, for the files' first line.
    command: str = ""

    @property
    def configmap(self) -> str:
        return f"vllm-triage-{self.deployment}"


def image_of(version: str) -> str:
    """The release image of ``version`` (the tag is the package version)."""
    return f"{IMAGE_REPOSITORY}:{version}"


def problems(s: Sidecar) -> list[str]:
    """What makes ``s`` impossible to apply, one line each (empty: none)."""
    out = []
    if len(s.deployment) > MAX_NAME or not _SUBDOMAIN.match(s.deployment):
        out.append(
            f"--deployment {s.deployment!r}: not a Deployment name (lowercase letters, "
            f"digits, '-' and '.', at most {MAX_NAME} characters)"
        )
    if s.namespace is not None and (len(s.namespace) > 63 or not _LABEL.match(s.namespace)):
        out.append(f"--namespace {s.namespace!r}: not a namespace name (RFC 1123 label)")
    if len(s.container) > 63 or not _LABEL.match(s.container):
        out.append(f"--container {s.container!r}: not a container name (RFC 1123 label)")
    if not 1 <= s.port <= 65535 or s.port == SIDECAR_PORT:
        out.append(
            f"--port {s.port}: vLLM's port must be 1-65535 and not {SIDECAR_PORT}, the "
            "sidecar's own"
        )
    if not s.image or any(c.isspace() for c in s.image):
        out.append(f"--image {s.image!r}: not an image reference")
    return out


def _indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line if line.strip() else "" for line in text.rstrip("\n").split("\n"))


def _yaml_lines(data: dict[str, str], spaces: int) -> str:
    return _indent(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), spaces)


def settings_text(s: Sidecar) -> str:
    if s.settings is not None:
        return s.settings.rstrip("\n") + "\n"
    return fill(
        template("sidecar-settings.yaml.tmpl"), {"deployment": s.deployment, "port": str(s.port)}
    )


def _common(s: Sidecar) -> dict[str, str]:
    return {
        "command": s.command or f"vllm-triage render sidecar --deployment {s.deployment}",
        "deployment": s.deployment,
        "kubectl_namespace": f" -n {s.namespace}" if s.namespace else "",
    }


def patch(s: Sidecar) -> str:
    given = {
        **_common(s),
        "container": s.container,
        "port": str(s.port),
        "image": s.image,
        "target": s.deployment,
        "configmap": s.configmap,
    }
    return fill(template("sidecar-patch.yaml.tmpl"), given)


def remove(s: Sidecar) -> str:
    return fill(template("sidecar-remove.yaml.tmpl"), {**_common(s), "configmap": s.configmap})


def configmap(s: Sidecar) -> str:
    where = (
        f", in the namespace {s.namespace}"
        if s.namespace
        else (" (it names no namespace: apply it where the Deployment is)")
    )
    given = {
        "command": _common(s)["command"],
        "deployment": s.deployment,
        "configmap": s.configmap,
        "namespace_line": f"\n  namespace: {s.namespace}" if s.namespace else "",
        "where": where,
        "container": s.container,
        "settings": _indent(settings_text(s), 4),
    }
    return fill(template("configmap.yaml.tmpl"), given)


def _named_patch(s: Sidecar) -> str:
    """sidecar-patch.yaml's patch with the Deployment's name (and namespace), without
    its comments: what kustomize needs to find its target."""
    body = [
        line for line in patch(s).splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    kind = body.index("kind: Deployment")
    meta = ["metadata:", f"  name: {s.deployment}"]
    if s.namespace:
        meta.append(f"  namespace: {s.namespace}")
    return "\n".join(body[: kind + 1] + meta + body[kind + 1 :])


def kustomization(s: Sidecar) -> str:
    selector = {"group": "apps", "version": "v1", "kind": "Deployment", "name": s.deployment}
    if s.namespace:
        selector["namespace"] = s.namespace
    where = f" in the namespace {s.namespace}" if s.namespace else ""
    given = {
        "command": _common(s)["command"],
        "deployment": s.deployment,
        "where": where,
        "container": s.container,
        "configmap": s.configmap,
        "target": _yaml_lines(selector, 6),
        "patch": _indent(_named_patch(s), 6),
        "source": _yaml_lines(selector, 6),
    }
    return fill(template("kustomization.yaml.tmpl"), given)


def render(s: Sidecar) -> dict[str, str]:
    """The four files of ``s``, by name (``FILES``), each checked to read back as YAML
    holding what it was given."""
    wrong = problems(s)
    if wrong:
        raise ValueError("; ".join(wrong))
    out = {
        "configmap.yaml": configmap(s),
        "sidecar-patch.yaml": patch(s),
        "sidecar-remove.yaml": remove(s),
        "kustomization.yaml": kustomization(s),
    }
    cm = yaml.safe_load(out["configmap.yaml"])
    if cm["data"]["triage.yaml"] != settings_text(s):
        raise ValueError("the settings do not read back from the ConfigMap unchanged")
    kust = yaml.safe_load(out["kustomization.yaml"])
    if (
        yaml.safe_load(kust["patches"][0]["patch"])["spec"]
        != yaml.safe_load(out["sidecar-patch.yaml"])["spec"]
    ):
        raise ValueError("the Component's patch is not sidecar-patch.yaml's")
    return out
