"""A small kustomize renderer: the subset ``deploy/kubernetes/`` uses, in Python.

``kubectl apply -k DIR`` renders a kustomization with kustomize; this renders the same
subset without kubectl, so the manifests can be checked where no cluster (or kubectl) is:

* ``resources``: YAML files (one or more documents) and directories holding a
  ``kustomization.yaml`` (rendered first, recursively);
* ``patches``: by ``path`` or inline ``patch``. A patch that is a YAML list is a JSON 6902
  patch (``add``, ``remove``, ``replace``, ``test``) and needs a ``target`` (``kind`` and
  ``name``); otherwise it is a strategic-merge patch found by its own kind and name:
  mappings merge key by key, ``null`` deletes a key, a list replaces the list it patches
  (kustomize does the same for custom resources, which carry no merge keys);
* ``namespace``: set on every namespaced resource;
* ``labels``: ``pairs`` added to ``metadata.labels`` (``includeSelectors`` and
  ``includeTemplates`` false only);
* ``images``: ``newName`` / ``newTag`` for every container and init container whose
  image is ``name`` (with or without a tag), at any depth (so inside KubeRay resources).

Anything else in a kustomization is refused with a :class:`KustomizeError` naming the
key, rather than silently ignored. ``tests/test_kubernetes_render.py`` compares the output
with ``kubectl kustomize`` where kubectl is installed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "patches", "namespace", "labels", "images"}
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole",
                  "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass"}
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")


class KustomizeError(ValueError):
    """A kustomization this renderer cannot render; the message names file and key."""


def kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    raise KustomizeError(f"{directory}: no kustomization.yaml")


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a file; each must be a mapping with a kind."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as e:
        raise KustomizeError(f"{path}: not YAML: {' '.join(str(e).split())}") from None
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict) or "kind" not in doc:
            raise KustomizeError(f"{path}: document {i + 1} is not a Kubernetes resource")
    return docs


def render(directory: str | Path) -> list[dict[str, Any]]:
    """The resources the kustomization in ``directory`` renders to, in order."""
    directory = Path(directory)
    path = kustomization_file(directory)
    spec = yaml.safe_load(path.read_text()) or {}
    if not isinstance(spec, dict):
        raise KustomizeError(f"{path}: not a mapping")
    unknown = sorted(set(spec) - SUPPORTED)
    if unknown:
        raise KustomizeError(f"{path}: {unknown[0]!r} is not supported by this renderer "
                             f"(supported: {', '.join(sorted(SUPPORTED))})")
    out: list[dict[str, Any]] = []
    for entry in spec.get("resources") or []:
        target = directory / entry
        if target.is_dir():
            out.extend(render(target))
        elif target.is_file():
            out.extend(load_documents(target))
        else:
            raise KustomizeError(f"{path}: resources: {entry!r} does not exist")
    for i, patch in enumerate(spec.get("patches") or []):
        _apply_patch(out, patch, directory, f"{path}: patches[{i}]")
    if spec.get("namespace"):
        for res in out:
            if res["kind"] not in CLUSTER_SCOPED:
                res.setdefault("metadata", {})["namespace"] = spec["namespace"]
    for i, label in enumerate(spec.get("labels") or []):
        if label.get("includeSelectors") or label.get("includeTemplates"):
            raise KustomizeError(f"{path}: labels[{i}]: only includeSelectors: false and "
                                 "includeTemplates: false are supported")
        for res in out:
            res.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    for image in spec.get("images") or []:
        for res in out:
            _set_image(res, image)
    return out


def _apply_patch(resources: list[dict[str, Any]], patch: dict[str, Any], directory: Path,
                 where: str) -> None:
    if "path" in patch:
        text = (directory / patch["path"]).read_text()
    elif "patch" in patch:
        text = patch["patch"]
    else:
        raise KustomizeError(f"{where}: needs 'path' or 'patch'")
    body = yaml.safe_load(text)
    target = patch.get("target")
    if isinstance(body, list):
        if not target:
            raise KustomizeError(f"{where}: a JSON 6902 patch needs a target")
        for res in _matching(resources, target, where):
            for j, op in enumerate(body):
                json_patch(res, op, f"{where} op {j}")
        return
    if not isinstance(body, dict):
        raise KustomizeError(f"{where}: a patch is a mapping or a list of operations")
    target = target or {"kind": body.get("kind"),
                        "name": (body.get("metadata") or {}).get("name")}
    for res in _matching(resources, target, where):
        merged = strategic_merge(res, {k: v for k, v in body.items()
                                       if k not in ("apiVersion", "kind", "metadata")}
                                 | {"metadata": {k: v for k, v in
                                                 (body.get("metadata") or {}).items()
                                                 if k != "name"}})
        res.clear()
        res.update(merged)


def _matching(resources: list[dict[str, Any]], target: dict[str, Any],
              where: str) -> list[dict[str, Any]]:
    found = [r for r in resources
             if all(r.get("kind") == target[k] if k == "kind"
                    else r.get("metadata", {}).get(k) == target[k]
                    for k in ("kind", "name", "namespace") if target.get(k))]
    if not found:
        raise KustomizeError(f"{where}: no resource matches target "
                             f"{ {k: v for k, v in target.items() if v} }")
    return found


def strategic_merge(base: Any, patch: Any) -> Any:
    """``patch`` merged into a copy of ``base``: mappings key by key, ``null`` deletes,
    anything else (lists included) replaces."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif key in out:
            out[key] = strategic_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _pointer(path: str, where: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"{where}: path {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: dict[str, Any], op: dict[str, Any], where: str) -> None:
    """One RFC 6902 operation (add, remove, replace, test) applied to ``doc`` in place."""
    kind, parts = op.get("op"), _pointer(op.get("path", ""), where)
    parent: Any = doc
    for part in parts[:-1]:
        try:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        except (KeyError, IndexError, ValueError):
            raise KustomizeError(f"{where}: {op['path']!r}: {part!r} does not exist") from None
    last = parts[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" and kind == "add" else int(last)
        if kind == "add":
            parent.insert(index, copy.deepcopy(op["value"]))
            return
        if not 0 <= index < len(parent):
            raise KustomizeError(f"{where}: {op['path']!r}: index {index} out of range")
    elif kind in ("remove", "replace", "test") and last not in parent:
        raise KustomizeError(f"{where}: {op['path']!r}: {last!r} does not exist")
    if kind == "add" or kind == "replace":
        parent[index if isinstance(parent, list) else last] = copy.deepcopy(op["value"])
    elif kind == "remove":
        del parent[index if isinstance(parent, list) else last]
    elif kind == "test":
        if parent[index if isinstance(parent, list) else last] != op["value"]:
            raise KustomizeError(f"{where}: test of {op['path']!r} failed")
    else:
        raise KustomizeError(f"{where}: op {kind!r} is not supported "
                             "(add, remove, replace, test)")


def _image_name(image: str) -> str:
    """``registry:5000/cloudrl`` of ``registry:5000/cloudrl:0.1.0`` (or ``@sha256:...``)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def _set_image(node: Any, image: dict[str, Any]) -> None:
    if isinstance(node, list):
        for item in node:
            _set_image(item, image)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in ("containers", "initContainers") and isinstance(value, list):
            for container in value:
                current = container.get("image") if isinstance(container, dict) else None
                if current and _image_name(current) == image["name"]:
                    rest = current[len(_image_name(current)):]  # ":tag", "@digest" or ""
                    name = image.get("newName", image["name"])
                    tag = image.get("newTag")
                    container["image"] = f"{name}:{tag}" if tag else name + rest
        _set_image(value, image)


def to_yaml(resources: list[dict[str, Any]]) -> str:
    """The resources as one multi-document YAML stream (as ``kubectl kustomize`` prints)."""
    return yaml.safe_dump_all(resources, sort_keys=False, width=1000)
