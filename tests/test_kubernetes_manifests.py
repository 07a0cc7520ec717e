"""deploy/kubernetes: every rendered manifest validates (Kubernetes schemas for built-in
kinds, KubeRay's CRD schemas for RayCluster/RayJob/RayService), the commands the pods run
parse with the real CLI, and a broken manifest fails naming the JSON path."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from cloudrl.cli import build_parser, main
from cloudrl.deploy.kustomize import render
from cloudrl.deploy.validate import check

ROOT = Path(__file__).resolve().parents[1]
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(KUBE / "overlays" / name) for name in OVERLAYS}


def one(resources: list[dict], kind: str, name: str | None = None) -> dict:
    found = [r for r in resources
             if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [r["metadata"]["name"] for r in found])
    return found[0]


def ray_pin() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(re.search(r"==([\d.]+)", d).group(1) for d in deps if d.startswith("ray["))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_manifest_validates(rendered, overlay):
    resources = rendered[overlay]
    kinds = sorted({r["kind"] for r in resources})
    assert kinds == ["Deployment", "Namespace", "PersistentVolumeClaim", "RayCluster",
                     "RayJob", "RayService", "Service"]
    assert check(resources) == []
    assert all(r["metadata"].get("namespace") == "cloudrl" for r in resources
               if r["kind"] != "Namespace")


def test_the_check_command_exits_0_on_the_overlays_and_2_on_a_broken_one(tmp_path, capsys):
    assert main(["deploy", "check", str(KUBE / "overlays" / "cpu")]) == 0
    assert "10 resources valid" in capsys.readouterr().out
    (tmp_path / "kustomization.yaml").write_text("resources: [bad.yaml]\n")
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n"
        "spec: {ports: [{port: http}]}\n")
    assert main(["deploy", "check", str(tmp_path)]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "Service/s: $.spec.ports[0].port: 'http'" in out[0]


def test_the_ray_version_of_every_cluster_is_the_pinned_one(rendered):
    pin = ray_pin()
    resources = rendered["gpu"]
    specs = [one(resources, "RayCluster")["spec"],
             one(resources, "RayJob")["spec"]["rayClusterSpec"],
             one(resources, "RayService")["spec"]["rayClusterConfig"]]
    assert [s["rayVersion"] for s in specs] == [pin] * 3
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    assert f"ARG RAY_VERSION={pin}\n" in dockerfile


def test_the_rayjob_entrypoint_parses_with_the_cli(rendered):
    from envs.scenario.catalog import load_scenario

    job = one(rendered["cpu"], "RayJob", "cloudrl-headline")
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[0] == "cloudrl"
    args = build_parser().parse_args(argv[1:])  # SystemExit(2) on an unknown flag
    assert args.command == "headline" and args.scenario == "scarcity_spikes"
    load_scenario(args.scenario)  # a scenario the catalog knows
    data = {m["mountPath"]: m["name"] for m in
            job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
            [0]["volumeMounts"]}
    assert data == {"/data": "data"}
    assert args.tracking_uri == "sqlite:////data/mlflow.db"
    for path in (args.out_dir, args.publish):
        assert path.startswith("/data/"), path  # on the volume, not in the pod
    claim = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"][0]
    assert claim["persistentVolumeClaim"]["claimName"] in {
        r["metadata"]["name"] for r in rendered["cpu"] if r["kind"] == "PersistentVolumeClaim"}
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    assert job["spec"]["suspend"] is True  # applying the overlay starts no training run


def test_the_raycluster_autoscales_cpu_workers_and_the_gpu_overlay_adds_gpus(rendered):
    cpu = one(rendered["cpu"], "RayCluster")["spec"]
    assert cpu["enableInTreeAutoscaling"] is True
    groups = {g["groupName"]: g for g in cpu["workerGroupSpecs"]}
    assert list(groups) == ["cpu"] and groups["cpu"]["minReplicas"] < groups["cpu"]["maxReplicas"]
    for kind, path in (("RayCluster", ("spec",)), ("RayJob", ("spec", "rayClusterSpec"))):
        spec = one(rendered["gpu"], kind)
        for key in path:
            spec = spec[key]
        groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
        assert list(groups) == ["cpu", "gpu"], kind  # appended, the CPU group kept
        pod = groups["gpu"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert pod["containers"][0]["image"].startswith("cloudrl-cuda:")
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} \
            in pod["tolerations"]


def test_the_labelling_app_is_one_recreated_replica_on_its_volume(rendered):
    resources = rendered["cpu"]
    dep = one(resources, "Deployment", "cloudrl-label")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert (args.command, args.label_command) == ("label", "serve")
    assert args.host == "0.0.0.0" and args.db.startswith("/data/")
    mount = container["volumeMounts"][0]
    assert mount["mountPath"] == "/data"
    claim = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    pvc = one(resources, "PersistentVolumeClaim", claim["persistentVolumeClaim"]["claimName"])
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    port = container["ports"][0]
    assert port["containerPort"] == args.port
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    svc = one(resources, "Service", "cloudrl-label")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == port["name"]


def test_the_service_token_comes_from_a_secret_and_no_secret_is_committed(rendered):
    service = one(rendered["cpu"], "RayService")
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    env = {e["name"]: e for e in head["containers"][0]["env"]}
    assert env["CLOUDRL_SERVE_TOKEN"]["valueFrom"]["secretKeyRef"] == \
        {"name": "cloudrl-serve-token", "key": "token"}
    assert "value" not in env["CLOUDRL_SERVE_TOKEN"]
    assert not [r for r in rendered["gpu"] if r["kind"] == "Secret"]
    for kind in ("RayCluster", "RayJob", "RayService"):
        spec = one(rendered["cpu"], kind)["spec"]
        spec = spec.get("rayClusterSpec") or spec.get("rayClusterConfig") or spec
        assert spec["authOptions"] == {"mode": "token", "secretName": "cloudrl-ray-token"}


def write_kustomization(tmp_path: Path, resource: dict) -> Path:
    (tmp_path / "kustomization.yaml").write_text("resources: [r.yaml]\n")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(resource))
    return tmp_path


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda r: r["spec"]["workerGroupSpecs"][0].update(maxReplicas="eight"),
     "RayCluster/cloudrl: $.spec.workerGroupSpecs[0].maxReplicas: 'eight' is not of type "
     "'integer'"),
    (lambda r: r["spec"]["workerGroupSpecs"][0].pop("groupName"),
     "RayCluster/cloudrl: $.spec.workerGroupSpecs[0]: 'groupName' is a required property"),
    (lambda r: r["spec"]["headGroupSpec"].update(rayStartParam={}),
     "RayCluster/cloudrl: $.spec.headGroupSpec: Additional properties are not allowed "
     "('rayStartParam' was unexpected)"),
])
def test_a_broken_kuberay_resource_fails_naming_the_json_path(tmp_path, mutate, expected):
    resource = yaml.safe_load((KUBE / "base" / "raycluster.yaml").read_text())
    mutate(resource)
    assert check(render(write_kustomization(tmp_path, resource))) == [expected]


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda r: r["spec"].update(replicas="two"),
     "Deployment/cloudrl-label: $.spec.replicas: 'two' is not of type"),
    (lambda r: r["spec"]["template"]["spec"]["containers"][0].pop("name"),
     "Deployment/cloudrl-label: $.spec.template.spec.containers[0]: 'name' is a required "
     "property"),
])
def test_a_broken_builtin_resource_fails_naming_the_json_path(tmp_path, mutate, expected):
    resource = next(yaml.safe_load_all((KUBE / "base" / "labelling.yaml").read_text()))
    mutate(resource)
    found = check(render(write_kustomization(tmp_path, resource)))
    assert len(found) == 1 and found[0].startswith(expected), found


def test_a_kind_without_a_schema_is_a_problem_not_a_pass(tmp_path):
    resource = {"apiVersion": "ray.io/v1", "kind": "RayCronJob",
                "metadata": {"name": "nightly"}, "spec": {}}
    assert check(render(write_kustomization(tmp_path, resource))) == [
        f"RayCronJob/nightly: no schema for ray.io/v1 RayCronJob in {KUBE / 'schemas'}"]
