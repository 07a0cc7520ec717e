"""The RayService's serveConfigV2 is what ``cloudrl serve`` runs: the applications, import
paths, args and deployment options of serve_apps/config.yaml, plus only what Kubernetes
needs (cloudrl.deploy.serve_config.KUBERNETES). A change to the Serve config that is not
re-rendered into deploy/kubernetes/base/rayservice-serve-config.yaml fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cloudrl.cli import build_parser, main
from cloudrl.deploy.kustomize import render
from cloudrl.deploy.serve_config import KUBERNETES, render_patch, render_serve_config
from cloudrl.serve_cli import service_config
from serve_apps.app import build_app
from serve_apps.service_config import ServiceConfig

ROOT = Path(__file__).resolve().parents[1]
SERVE_CONFIG = ROOT / "serve_apps" / "config.yaml"
PATCH = ROOT / "deploy" / "kubernetes" / "base" / "rayservice-serve-config.yaml"


@pytest.fixture(autouse=True)
def _no_cloudrl_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("CLOUDRL__") or key == "CLOUDRL_SERVE_TOKEN":
            monkeypatch.delenv(key)


def deployed_serve_config(overlay: str = "cpu") -> dict:
    resources = render(ROOT / "deploy" / "kubernetes" / "overlays" / overlay)
    service = next(r for r in resources if r["kind"] == "RayService")
    return yaml.safe_load(service["spec"]["serveConfigV2"])


def test_the_committed_patch_is_the_rendered_one():
    assert PATCH.read_text() == render_patch(SERVE_CONFIG)
    assert main(["deploy", "render-serve-config", "--check", str(PATCH)]) == 0


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_the_rayservice_runs_the_generated_serve_config(overlay):
    assert deployed_serve_config(overlay) == render_serve_config(SERVE_CONFIG)


def test_serve_config_v2_equals_what_cloudrl_serve_runs(tmp_path):
    """Same applications, import paths, args (a ServiceConfig equal to the one ``cloudrl
    serve --config`` builds from the same fields, state_db aside) and deployment options
    (those of the Application ``build_app`` returns)."""
    source = yaml.safe_load(SERVE_CONFIG.read_text())
    deployed = deployed_serve_config()
    assert [(a["name"], a["route_prefix"], a["import_path"]) for a in deployed["applications"]] \
        == [(a["name"], a["route_prefix"], a["import_path"]) for a in source["applications"]]
    assert deployed["proxy_location"] == source["proxy_location"]
    for app, src in zip(deployed["applications"], source["applications"], strict=True):
        fields = tmp_path / f"{app['name']}.yaml"
        fields.write_text(yaml.safe_dump(src["args"]))
        served = service_config(build_parser().parse_args(["serve", "--config", str(fields)]))
        assert ServiceConfig.model_validate(app["args"]) == \
            served.model_copy(update={"state_db": KUBERNETES["state_db"]})
        assert {k: v for k, v in app["args"].items() if k != "state_db"} == \
            {k: v for k, v in src["args"].items() if k != "state_db"}
        bound = build_app(served)._bound_deployment
        options = {"name": bound.name,
                   "max_ongoing_requests": bound._deployment_config.max_ongoing_requests,
                   "ray_actor_options": bound.ray_actor_options,
                   "health_check_period_s": bound._deployment_config.health_check_period_s,
                   "health_check_timeout_s": bound._deployment_config.health_check_timeout_s}
        (deployment,) = app["deployments"]
        k8s = {"autoscaling_config": KUBERNETES["autoscaling_config"],
               "ray_actor_options": {**bound.ray_actor_options,
                                     "resources": KUBERNETES["replica_resources"]}}
        assert deployment == options | k8s
        assert "num_replicas" not in deployment  # the autoscaler sets the count
    assert deployed["http_options"] == {"host": "0.0.0.0",
                                        "port": source["http_options"]["port"]}


def test_serve_config_v2_is_a_valid_ray_serve_deploy_config():
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(deployed_serve_config())
    (deployment,) = schema.applications[0].deployments
    scaling = deployment.autoscaling_config
    assert scaling["min_replicas"] <= scaling["initial_replicas"] <= scaling["max_replicas"]
    # the autoscaler never scales if a replica cannot hold its target of ongoing requests
    assert scaling["target_ongoing_requests"] < deployment.max_ongoing_requests


def test_the_head_holds_one_state_resource_per_replica_and_mounts_state_db():
    resources = render(ROOT / "deploy" / "kubernetes" / "overlays" / "cpu")
    spec = next(r for r in resources if r["kind"] == "RayService")["spec"]
    head = spec["rayClusterConfig"]["headGroupSpec"]
    (deployment,) = deployed_serve_config()["applications"][0]["deployments"]
    need = deployment["ray_actor_options"]["resources"]["cloudrl_state"]
    replicas = deployment["autoscaling_config"]["max_replicas"]
    assert float(head["resources"]["cloudrl_state"]) == need * replicas
    assert float(head["resources"]["CPU"]) >= \
        deployment["ray_actor_options"]["num_cpus"] * replicas
    mounts = [m["mountPath"] for m in head["template"]["spec"]["containers"][0]["volumeMounts"]]
    state_db = deployed_serve_config()["applications"][0]["args"]["state_db"]
    assert any(state_db.startswith(m + "/") for m in mounts)
    assert "workerGroupSpecs" not in spec["rayClusterConfig"]  # replicas stay on the head
    assert spec["upgradeStrategy"] == {"type": "NewCluster"}


def test_a_changed_serve_config_not_re_rendered_is_caught(tmp_path, capsys):
    changed = yaml.safe_load(SERVE_CONFIG.read_text())
    changed["applications"][0]["args"]["max_batch_size"] = 48
    changed["applications"][0]["args"]["policy"] = "heuristic:ffd"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(changed))
    new = render_serve_config(path)
    assert new != deployed_serve_config()
    assert new["applications"][0]["args"]["max_batch_size"] == 48
    assert main(["deploy", "render-serve-config", "--config", str(path),
                 "--check", str(PATCH)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"cloudrl: {PATCH} is stale: run 'cloudrl deploy render-serve-config "
                   f"--out {PATCH}'"]


def test_a_bad_serve_config_is_one_line_naming_the_field(tmp_path, capsys):
    changed = yaml.safe_load(SERVE_CONFIG.read_text())
    changed["applications"][0]["args"]["failure_threshold"] = 0
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(changed))
    out = tmp_path / "patch.yaml"
    assert main(["deploy", "render-serve-config", "--config", str(path),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "failure_threshold" in err[0] and "Traceback" not in err[0]
    assert not out.exists()


@pytest.mark.slow
def test_the_generated_serve_config_deploys_on_ray_serve(tmp_path):
    """serveConfigV2 through Serve's own config path (what the dashboard does for KubeRay)
    on a local Ray that has the head's cloudrl_state resources: the application runs, the
    autoscaling config replaces the code's replica count, the replica holds one
    cloudrl_state and answers over HTTP."""
    import json
    import socket
    import urllib.request

    import ray
    from ray import serve
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    config = render_serve_config(SERVE_CONFIG)
    config["applications"][0]["args"]["state_db"] = str(tmp_path / "state.db")  # not /data
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    ray.init(num_cpus=2, resources={"cloudrl_state": 4}, include_dashboard=False)
    try:
        client = serve_start(http_options=config["http_options"])
        client.deploy_apps(ServeDeploySchema.model_validate(config), _blocking=True)
        details = client.get_serve_details()
        deployment = details["applications"]["cloudrl"]["deployments"]["DecisionService"]
        assert deployment["status"] == "HEALTHY"
        scaling = deployment["deployment_config"]["autoscaling_config"]
        expected = KUBERNETES["autoscaling_config"]
        assert {k: scaling[k] for k in expected} == expected
        assert len(deployment["replicas"]) == expected["initial_replicas"]
        assert ray.available_resources().get("cloudrl_state") == 4 - 1
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30) as r:
            assert json.load(r) == {"status": "ok"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/policy", timeout=30) as r:
            body = json.load(r)
        assert json.dumps(body).count("heuristic:power_aware") >= 1
    finally:
        serve.shutdown()
        ray.shutdown()
