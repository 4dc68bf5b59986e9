"""Kubernetes' strategic merge patch, for the fields of a Deployment that the sidecar patch
reaches, as ``kubectl patch`` and kustomize apply it (k8s.io/apimachinery's strategicpatch
with the API's ``patchMergeKey`` tags), so that the default tier can check the patch
without a cluster or a kubectl:

- maps merge key by key, recursively; ``null`` in the patch deletes the key;
- a list with a merge key (containers, init containers and volumes by ``name``; a
  container's ports by ``containerPort``, env by ``name``, volume mounts by ``mountPath``)
  merges item by item: an item whose key is in the original is merged into it, a new one
  is added, ``$patch: delete`` removes it; the original's other items stay as they were;
- any other list is replaced whole.

``tests/deploy/test_sidecar_patch.py`` checks this against the real kubectl where one is
installed (``-m kubectl``).
"""

from __future__ import annotations

import copy
from typing import Any

#: (path of the list, with ``*`` for any list item) -> its merge key; from the Kubernetes
#: API's ``patchMergeKey`` tags (PodSpec, Container).
_POD = ("spec", "template", "spec")
MERGE_KEYS: dict[tuple[str, ...], str] = {
    (*_POD, "containers"): "name",
    (*_POD, "initContainers"): "name",
    (*_POD, "ephemeralContainers"): "name",
    (*_POD, "volumes"): "name",
    (*_POD, "imagePullSecrets"): "name",
}
for _section in ("containers", "initContainers"):
    MERGE_KEYS[(*_POD, _section, "*", "ports")] = "containerPort"
    MERGE_KEYS[(*_POD, _section, "*", "env")] = "name"
    MERGE_KEYS[(*_POD, _section, "*", "volumeMounts")] = "mountPath"
    MERGE_KEYS[(*_POD, _section, "*", "volumeDevices")] = "devicePath"

DELETE = {"$patch": "delete"}


class PatchError(ValueError):
    """The patch cannot apply (kubectl would refuse it too)."""


def apply(original: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``original`` with ``patch`` applied, as ``kubectl patch deployment NAME`` does it:
    a patch naming another object (kind or metadata.name) is refused."""
    for key in ("apiVersion", "kind"):
        if key in patch and patch[key] != original.get(key):
            raise PatchError(f"the patch's {key} {patch[key]!r} is not {original.get(key)!r}")
    name = patch.get("metadata", {}).get("name")
    if name is not None and name != original["metadata"]["name"]:
        raise PatchError(
            f"the name of the object ({name}) does not match the name on the URL "
            f"({original['metadata']['name']})"
        )
    merged: dict[str, Any] = _merge_map(copy.deepcopy(original), patch, ())
    return merged


def _merge_map(
    original: dict[str, Any], patch: dict[str, Any], path: tuple[str, ...]
) -> dict[str, Any]:
    for key, value in patch.items():
        if key.startswith("$"):
            raise PatchError(f"unsupported directive {key} at {'/'.join(path)}")
        if value is None:
            original.pop(key, None)
        elif isinstance(value, dict) and isinstance(original.get(key), dict):
            original[key] = _merge_map(original[key], value, (*path, key))
        elif isinstance(value, list) and _merge_key((*path, key)) is not None:
            original[key] = _merge_list(original.get(key, []), value, (*path, key))
        else:
            original[key] = copy.deepcopy(_without_directives(value))
    return original


def _merge_key(path: tuple[str, ...]) -> str | None:
    return MERGE_KEYS.get(path)


def _merge_list(original: list[Any], patch: list[Any], path: tuple[str, ...]) -> list[Any]:
    key = _merge_key(path)
    assert key is not None
    out = copy.deepcopy(original)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"an item of {'/'.join(path)} has no {key}: {item!r}")
        where = [i for i, old in enumerate(out) if old.get(key) == item[key]]
        if item.get("$patch") == "delete":
            out = [old for old in out if old.get(key) != item[key]]
        elif where:
            (i,) = where
            out[i] = _merge_map(out[i], {k: v for k, v in item.items()}, (*path, "*"))
        else:
            out.append(copy.deepcopy(_without_directives(item)))
    return out


def _without_directives(value: Any) -> Any:
    if isinstance(value, dict):
        if "$patch" in value:
            raise PatchError(f"a directive where nothing is merged: {value!r}")
        return {k: _without_directives(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_directives(v) for v in value]
    return value
