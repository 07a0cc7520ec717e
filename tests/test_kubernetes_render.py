"""The kustomize renderer (cloudrl.deploy.kustomize) and the CRD converter
(cloudrl.deploy.crd_schema): kustomize's output where kubectl is installed, RFC 6902 and
strategic-merge semantics, unsupported input refused by name."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cloudrl.cli import main
from cloudrl.deploy.crd_schema import convert, crd_schemas
from cloudrl.deploy.kustomize import KustomizeError, json_patch, render, strategic_merge

ROOT = Path(__file__).resolve().parents[1]
KUBE = ROOT / "deploy" / "kubernetes"


def key(resource: dict) -> tuple[str, str]:
    return resource["kind"], resource["metadata"]["name"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_the_renderer_matches_kubectl_kustomize(overlay):
    out = subprocess.run(["kubectl", "kustomize", str(KUBE / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    theirs = {key(r): r for r in yaml.safe_load_all(out) if r}
    mine = {key(r): r for r in render(KUBE / "overlays" / overlay)}
    assert sorted(mine) == sorted(theirs)
    for k in mine:
        assert mine[k] == theirs[k], k


def test_the_render_command_prints_the_resources(capsys):
    assert main(["deploy", "render", str(KUBE / "overlays" / "gpu")]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [key(d) for d in docs] == [key(r) for r in render(KUBE / "overlays" / "gpu")]


def write(tmp_path: Path, kustomization: str, **files: str) -> Path:
    (tmp_path / "kustomization.yaml").write_text(kustomization)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: '1', b: '2'}\n"


def test_an_unsupported_kustomization_key_is_refused_by_name(tmp_path, capsys):
    d = write(tmp_path, "resources: [c.yaml]\nnamePrefix: dev-\n", **{"c.yaml": CONFIGMAP})
    with pytest.raises(KustomizeError, match="'namePrefix' is not supported"):
        render(d)
    assert main(["deploy", "render", str(d)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "namePrefix" in err[0]


def test_patches_namespace_labels_and_images(tmp_path):
    pod = ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
           "    - {name: a, image: 'reg:5000/app:1.0'}\n    - {name: b, image: other}\n")
    d = write(tmp_path, """
resources: [c.yaml, p.yaml]
namespace: ns
labels: [{pairs: {team: rl}}]
images: [{name: 'reg:5000/app', newName: mirror/app, newTag: '2.0'}]
patches:
  - patch: |
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: c}
      data: {b: null, c: '3'}
  - target: {kind: Pod, name: p}
    patch: |
      - {op: add, path: /spec/containers/-, value: {name: z, image: 'reg:5000/app'}}
      - {op: replace, path: /spec/containers/1/name, value: bee}
      - {op: test, path: /spec/containers/0/name, value: a}
""", **{"c.yaml": CONFIGMAP, "p.yaml": pod})
    cm, p = render(d)
    assert cm["data"] == {"a": "1", "c": "3"}
    assert cm["metadata"] == {"name": "c", "namespace": "ns", "labels": {"team": "rl"}}
    assert [(c["name"], c["image"]) for c in p["spec"]["containers"]] == [
        ("a", "mirror/app:2.0"), ("bee", "other"), ("z", "mirror/app:2.0")]


@pytest.mark.parametrize(("op", "message"), [
    ({"op": "remove", "path": "/data/zz"}, "'zz' does not exist"),
    ({"op": "replace", "path": "/spec/x", "value": 1}, "'spec' does not exist"),
    ({"op": "test", "path": "/data/a", "value": "9"}, "test of '/data/a' failed"),
    ({"op": "move", "path": "/data/a", "from": "/data/b"}, "op 'move' is not supported"),
])
def test_a_json_patch_that_cannot_apply_names_the_path(op, message):
    with pytest.raises(KustomizeError, match=message):
        json_patch(yaml.safe_load(CONFIGMAP), op, "p")


def test_a_patch_without_a_matching_target_is_an_error(tmp_path):
    d = write(tmp_path, "resources: [c.yaml]\npatches:\n  - target: {kind: ConfigMap, "
              "name: nope}\n    patch: '[{op: remove, path: /data/a}]'\n",
              **{"c.yaml": CONFIGMAP})
    with pytest.raises(KustomizeError, match="no resource matches target"):
        render(d)


scalars = st.one_of(st.integers(), st.text(max_size=5), st.booleans())
trees = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=3), kids, max_size=3)),
    max_leaves=12)
maps = st.dictionaries(st.text(max_size=3), trees, max_size=4)


@given(maps, maps)
def test_strategic_merge_invariants(base, patch):
    merged = strategic_merge(base, patch)
    assert strategic_merge(merged, patch) == merged  # applying a patch twice changes nothing
    assert strategic_merge(base, {}) == base
    for k, v in patch.items():  # every key the patch sets has the patch's scalar or list
        if not isinstance(v, dict):
            assert merged[k] == v
    for k in set(base) - set(patch):
        assert merged[k] == base[k]


@given(st.lists(scalars, max_size=5), scalars)
def test_json_patch_add_dash_appends(items, value):
    doc = {"spec": {"items": list(items)}}
    json_patch(doc, {"op": "add", "path": "/spec/items/-", "value": value}, "p")
    assert doc["spec"]["items"] == [*items, value]


def test_a_crd_schema_converts_to_a_strict_json_schema():
    crd = {"spec": {"group": "ex.io", "names": {"kind": "Thing"}, "versions": [{
        "name": "v1", "served": True, "schema": {"openAPIV3Schema": {
            "type": "object", "properties": {"spec": {
                "type": "object", "required": ["size"], "properties": {
                    "size": {"x-kubernetes-int-or-string": True,
                             "anyOf": [{"type": "integer"}, {"type": "string"}]},
                    "note": {"type": "string", "nullable": True, "description": "d"},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                             "properties": {"a": {"type": "string"}}},
                    "labels": {"type": "object",
                               "additionalProperties": {"type": "string"}}}}}}}}]}}
    schema = crd_schemas(crd)["v1"]
    validator = jsonschema.Draft202012Validator(schema)
    ok = {"apiVersion": "ex.io/v1", "kind": "Thing", "metadata": {"name": "t"},
          "spec": {"size": "10Gi", "note": None, "free": {"b": 1}, "labels": {"x": "y"}}}
    assert list(validator.iter_errors(ok)) == []
    assert list(validator.iter_errors(ok | {"spec": {"size": 3}})) == []
    errors = {e.json_path: e.message for e in validator.iter_errors(
        ok | {"kind": "Other", "spec": {"size": 1.5, "typo": 1, "labels": {"x": 2}}})}
    assert set(errors) == {"$.kind", "$.spec", "$.spec.size", "$.spec.labels.x"}
    assert "'typo' was unexpected" in errors["$.spec"]
    assert "description" not in convert({"description": "d", "type": "string"})


def test_the_dockerfile_builds_cpu_and_cuda_variants_with_the_cli_entrypoint():
    text = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert "ARG VARIANT=cpu" in lines and "FROM ${VARIANT}" in lines
    stages = {line.split(" AS ")[1]: line for line in lines if " AS " in line}
    assert set(stages) == {"cpu", "cuda"} and stages["cuda"].endswith("-gpu AS cuda")
    assert 'ENTRYPOINT ["cloudrl"]' in lines
    ignore = (ROOT / "deploy" / "docker" / "Dockerfile.dockerignore").read_text().split()
    for line in lines:  # everything the image copies gets through the ignore file
        if line.startswith("COPY"):
            for src in line.split()[2:-1]:
                assert f"!{src}" in ignore, src
                assert (ROOT / src).exists(), src
