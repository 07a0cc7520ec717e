"""Rendered Kubernetes manifests checked against their schemas, without a cluster.

Built-in kinds (Namespace, PersistentVolumeClaim, Deployment, Service, ...) are checked
with ``kubernetes-validate`` against the Kubernetes JSON schemas it bundles (strict: an
unknown field is an error, as under ``kubectl apply``'s default field validation); KubeRay
kinds (RayCluster, RayJob, RayService) against the JSON schemas converted from KubeRay's
CRDs in ``deploy/kubernetes/schemas/`` (:mod:`cloudrl.deploy.crd_schema`). Every problem
is one line: ``Kind/name: $.json.path: message``. A kind with no schema is a problem too.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

KUBERNETES_VERSION = "1.33"  # the oldest Kubernetes the manifests are checked against
SCHEMA_DIR = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "schemas"


def resource_name(resource: dict[str, Any]) -> str:
    meta = resource.get("metadata") if isinstance(resource.get("metadata"), dict) else {}
    return f"{resource.get('kind', '?')}/{meta.get('name', '?')}"


@cache
def _crd_validator(path: Path) -> Any:
    import jsonschema

    schema = json.loads(path.read_text())
    return jsonschema.Draft202012Validator(schema)


def crd_schema_path(resource: dict[str, Any], schema_dir: Path = SCHEMA_DIR) -> Path | None:
    """The vendored schema of a custom resource (None for a built-in kind)."""
    from cloudrl.deploy.crd_schema import schema_file_name

    api_version = str(resource.get("apiVersion", ""))
    if "/" not in api_version or "." not in api_version.split("/")[0] \
            or api_version.split("/")[0].endswith(".k8s.io"):
        return None  # core (v1) and built-in groups (apps/v1, rbac.authorization.k8s.io/v1)
    return schema_dir / schema_file_name(str(resource.get("kind", "")), api_version)


def problems(resource: dict[str, Any], schema_dir: Path = SCHEMA_DIR,
             kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    """Every schema violation of one resource, one line each (empty: it validates)."""
    name = resource_name(resource)
    crd = crd_schema_path(resource, schema_dir)
    if crd is not None:
        if not crd.is_file():
            return [f"{name}: no schema for {resource.get('apiVersion')} "
                    f"{resource.get('kind')} in {schema_dir}"]
        errors = sorted(_crd_validator(crd).iter_errors(resource),
                        key=lambda e: (list(map(str, e.absolute_path)), e.message))
        return [f"{name}: {e.json_path}: {e.message}" for e in errors]
    import kubernetes_validate

    try:
        kubernetes_validate.validate(resource, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{name}: {e.json_path}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{name}: {e.message}"]
    return []


def check(resources: list[dict[str, Any]], schema_dir: Path = SCHEMA_DIR) -> list[str]:
    """The problems of every resource, in order."""
    out: list[str] = []
    for resource in resources:
        out.extend(problems(resource, schema_dir))
    return out
