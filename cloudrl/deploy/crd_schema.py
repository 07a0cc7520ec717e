"""A CustomResourceDefinition's ``openAPIV3Schema`` as a JSON Schema a validator can use.

The API server checks a custom resource against its CRD's structural schema; this turns
that schema into JSON Schema (draft 2020-12) so ``jsonschema`` can do the same offline:

* ``x-kubernetes-int-or-string`` -> an integer or a string;
* ``nullable: true`` -> ``null`` is allowed as well;
* an object with ``properties`` and neither ``additionalProperties`` nor
  ``x-kubernetes-preserve-unknown-fields`` refuses unknown fields (``kubectl apply``
  refuses them too: its field validation is strict by default);
* ``apiVersion`` and ``kind`` are pinned to the CRD's group, version and kind;
* descriptions are dropped (they are most of the size).

Not checked offline: ``x-kubernetes-validations`` (CEL rules), formats, defaults.

Run it on a KubeRay checkout to refresh ``deploy/kubernetes/schemas/``::

    python -m cloudrl.deploy.crd_schema \
        KUBERAY/ray-operator/config/crd/bases deploy/kubernetes/schemas
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

DROP = {"description", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type", "x-kubernetes-validations", "x-kubernetes-embedded-resource",
        "default", "format", "example"}


def convert(node: Any) -> Any:
    """One openAPIV3Schema node (and everything under it) as JSON Schema."""
    if isinstance(node, list):
        return [convert(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in DROP or key in ("nullable", "x-kubernetes-int-or-string",
                                  "x-kubernetes-preserve-unknown-fields"):
            continue
        if key == "properties":
            out[key] = {name: convert(sub) for name, sub in value.items()}
        else:
            out[key] = convert(value)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
    open_ended = node.get("x-kubernetes-preserve-unknown-fields") or \
        "additionalProperties" in node
    if node.get("type") == "object" and "properties" in node and not open_ended:
        out["additionalProperties"] = False
    return out


def crd_schemas(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{version: JSON Schema}`` for each served version of a CRD."""
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    out = {}
    for version in crd["spec"]["versions"]:
        if not version.get("served", True):
            continue
        schema = convert(version["schema"]["openAPIV3Schema"])
        props = schema.setdefault("properties", {})
        props["apiVersion"] = {"const": f"{group}/{version['name']}"}
        props["kind"] = {"const": kind}
        props["metadata"] = {"type": "object"}  # ObjectMeta: the API server checks it
        schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind",
                                     "metadata"})
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["title"] = f"{kind} {group}/{version['name']}"
        out[version["name"]] = schema
    return out


def schema_file_name(kind: str, api_version: str) -> str:
    """``raycluster-ray.io-v1.json`` for RayCluster ray.io/v1."""
    group, _, version = api_version.rpartition("/")
    return f"{kind.lower()}-{group}-{version}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("crd_dir", type=Path, help="directory of CRD YAML files")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--version", default="v1", help="the CRD version to write (v1)")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted(args.crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version, schema in crd_schemas(crd).items():
            if version != args.version:
                continue
            out = args.out_dir / schema_file_name(kind, f"{group}/{version}")
            out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
            print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
