"""Renders deploy/kubernetes/ as ``kubectl apply -k`` would, and checks objects of custom
resources against the fields their published API documents, for tests/test_kubernetes*.py.

The renderer implements the two kustomize fields the manifests use, ``resources`` (files and
directories) and ``patches`` (JSON 6902 patch files with a ``target``, applied with the
``jsonpatch`` library), and refuses any other, so what it renders is what kustomize renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

ROOT = Path(__file__).resolve().parents[1]
KUBERNETES = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.37.0"
"""The Kubernetes release the manifests are validated for: the newest whose schemas the pinned
kubernetes-validate ships."""
KUSTOMIZE_FIELDS = {"apiVersion", "kind", "resources", "patches"}
TARGET_FIELDS = {"group", "version", "kind", "name"}


class RenderError(AssertionError):
    """A kustomization uses a field this renderer does not implement, or a patch fails."""


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The YAML documents of ``path`` (empty ones left out)."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects of the kustomization in ``directory``, patched, in resource order.

    Raises:
        RenderError: a field other than resources and patches, a patch without a target or whose
            target matches no object, or a JSON 6902 operation that fails (a ``test`` included).
    """
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KUSTOMIZE_FIELDS
    if unknown:
        raise RenderError(f"{directory}: kustomize fields not rendered here: {sorted(unknown)}")
    objects: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        path = (directory / resource).resolve()
        objects += render(path) if path.is_dir() else load_documents(path)
    for patch in kustomization.get("patches", []):
        objects = [_patched(obj, patch, directory) for obj in objects]
        if not any(_matches(obj, patch["target"]) for obj in objects):
            raise RenderError(f"{directory}: patch target {patch['target']} matches nothing")
    return objects


def _matches(obj: Mapping[str, Any], target: Mapping[str, str]) -> bool:
    if set(target) != TARGET_FIELDS:
        raise RenderError(f"give every field of a patch target: {sorted(TARGET_FIELDS)}")
    group, _, version = obj["apiVersion"].rpartition("/")
    return (group, version, obj["kind"], obj["metadata"]["name"]) == (
        target["group"],
        target["version"],
        target["kind"],
        target["name"],
    )


def _patched(obj: dict[str, Any], patch: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    if set(patch) != {"path", "target"}:
        raise RenderError(f"{directory}: a patch is a path and a target, got {sorted(patch)}")
    if not _matches(obj, patch["target"]):
        return obj
    operations = yaml.safe_load((directory / patch["path"]).read_text())
    try:
        return jsonpatch.apply_patch(obj, operations)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise RenderError(f"{directory / patch['path']}: {exc}") from None


ANY = None
"""A field whose value is not checked further (a free-form map, or a core type checked apart)."""


def unknown_fields(value: Any, allowed: Any, where: str = "") -> list[str]:
    """The paths of the fields in ``value`` that ``allowed`` does not list.

    Args:
        allowed: ANY; a dict of field name -> allowed (a nested object); or a one-element list
            [allowed] for a list of such objects.
    """
    if allowed is ANY:
        return []
    if isinstance(allowed, list):
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        return [
            p
            for i, item in enumerate(value)
            for p in unknown_fields(item, allowed[0], f"{where}[{i}]")
        ]
    if not isinstance(value, dict):
        return [f"{where}: not an object"]
    found = []
    for name, item in value.items():
        if name not in allowed:
            found.append(f"{where}.{name}")
        else:
            found += unknown_fields(item, allowed[name], f"{where}.{name}")
    return found


def containers(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A Deployment's containers by name."""
    return {c["name"]: c for c in obj["spec"]["template"]["spec"]["containers"]}


def one(objects: list[dict[str, Any]], kind: str, name: str = "") -> dict[str, Any]:
    """The one object of ``kind`` (and ``name``) among ``objects``."""
    found = [
        obj
        for obj in objects
        if obj["kind"] == kind and (not name or obj["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]
