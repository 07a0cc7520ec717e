"""cluster.yaml and the ``ray job submit`` path.

Fast tests: ``cluster.yaml`` passes the checks ``ray up`` runs before it touches
a machine (Ray's JSON schema ``ray/autoscaler/ray-schema.json``, then
``_bootstrap_config``: defaults filled in by ``prepare_config``, validated again
by ``validate_config``, handed to the local provider), broken copies of it fail
them, and it installs and starts cloudrl the way the README does.

Slow tests (``-m slow``): a real single-node cluster from ``ray start --head``
with the dashboard and Ray 2.60 token authentication on, loopback only, runs
``cloudrl evaluate`` and ``cloudrl train`` as jobs submitted with
``ray job submit --working-dir .``, exactly as the README tells users to.

Ray 2.60 token auth, as read in the installed source:

- ``ray start --head`` turns token auth on when ``RAY_AUTH_MODE=token`` is set,
  or (mode unset) when a token already exists; the token comes from
  ``RAY_AUTH_TOKEN``, else the file named by ``RAY_AUTH_TOKEN_PATH``, else
  ``~/.ray/auth_token``.
- ``ray job submit``/``ray job list`` send ``Authorization: Bearer <token>``
  only when ``RAY_AUTH_MODE=token`` is set in *their* environment; without it
  the dashboard answers 401, with a wrong token 403.

The cluster here uses its own token file, so nothing under ``~/.ray`` is read or
written. Teardown stops exactly the processes this module started (the
``ray start --block`` process and its descendants), not ``ray stop``: that
kills every Ray process on the machine, other users' sessions included.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import descendants, reap

REPO = Path(__file__).resolve().parents[1]
CLUSTER_YAML = REPO / "cluster.yaml"
DOC_NET = ipaddress.ip_network("192.0.2.0/24")  # RFC 5737 TEST-NET-1

# Never uploaded with --working-dir (Ray already skips .git, .venv, __pycache__
# and whatever .gitignore lists; being explicit keeps the README command safe
# in a checkout without a .gitignore).
WORKING_DIR_EXCLUDES = [".venv", ".git", "results", "mlruns", "mlflow.db", "*.egg-info",
                        ".hypothesis", ".pytest_cache", ".ruff_cache", "**/__pycache__"]


def load_cluster_yaml() -> dict[str, Any]:
    with open(CLUSTER_YAML) as f:
        return yaml.safe_load(f)


def check_ray_schema(config: dict[str, Any]) -> None:
    """Validate ``config`` against Ray's cluster-config JSON schema (raises ValidationError)."""
    import jsonschema
    import ray.autoscaler

    schema_path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    jsonschema.validate(config, json.loads(schema_path.read_text()))


def validate_like_ray_up(config: dict[str, Any]) -> dict[str, Any]:
    """Run Ray's own checks on ``config`` and return the config ``ray up`` would use.

    First the raw file against Ray's JSON schema (``validate_config`` needs the
    defaults ``ray up`` adds, so the raw check calls the schema directly), then
    ``_bootstrap_config``, the function ``ray up`` calls before contacting any
    node: ``prepare_config`` (local-provider node type, defaults, merged setup
    commands), ``validate_config`` and the provider's ``bootstrap_config``.
    """
    from ray.autoscaler._private.commands import _bootstrap_config

    check_ray_schema(config)
    return _bootstrap_config(copy.deepcopy(config), no_config_cache=True)


# --------------------------------------------------------------------- fast tests


def test_cluster_yaml_passes_ray_validation() -> None:
    raw = load_cluster_yaml()
    resolved = validate_like_ray_up(raw)

    # The local provider turns the worker IPs into one node type, all kept up.
    n_workers = len(raw["provider"]["worker_ips"])
    assert resolved["head_node_type"] == "local.cluster.node"
    node_type = resolved["available_node_types"]["local.cluster.node"]
    assert node_type["min_workers"] == node_type["max_workers"] == n_workers == 2
    # Common setup commands run on the head and on the workers.
    assert resolved["head_setup_commands"][: len(raw["setup_commands"])] == raw["setup_commands"]
    assert resolved["worker_setup_commands"] == raw["setup_commands"]

    # Also what `validate_config` alone says after `prepare_config`.
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(raw)))


def test_commented_aws_variant_passes_ray_validation() -> None:
    """The cloud example in cluster.yaml's comments is a valid config too.

    It replaces provider, auth and max_workers and adds the node types; Ray's
    schema, ``prepare_config`` (AWS defaults) and ``validate_config`` check it
    without contacting AWS.
    """
    from ray.autoscaler._private.util import prepare_config, validate_config

    lines = CLUSTER_YAML.read_text().splitlines()
    start = lines.index("# provider:")
    block = []
    for line in lines[start:]:
        if line == "#":  # a bare "#" ends the commented YAML block
            break
        block.append(line.removeprefix("# "))
    cloud = yaml.safe_load("\n".join(block))
    assert cloud["provider"]["type"] == "aws"
    config = {k: v for k, v in load_cluster_yaml().items()
              if k not in ("provider", "auth", "max_workers")}
    config.update(cloud)

    check_ray_schema(config)
    prepared = prepare_config(config)
    validate_config(prepared)
    types = prepared["available_node_types"]
    assert types["learner_gpu"]["resources"]["GPU"] == 1
    assert types["runner_cpu"]["max_workers"] >= 1
    assert types[prepared["head_node_type"]]["resources"]["CPU"] == 0


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(cfg: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        for key in parents:
            cfg = cfg[key]
        cfg[leaf] = value

    return mutate


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(cfg: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        for key in parents:
            cfg = cfg[key]
        del cfg[leaf]

    return mutate


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (_set("head_ips", ["192.0.2.99"]), "ValidationError", "'head_ips' was unexpected"),
        (_delete("provider.type"), "ValidationError", "'type' is a required property"),
        (_delete("provider"), "ValidationError", "'provider' is a required property"),
        (_set("auth.ssh_usr", "ubuntu"), "ValidationError", "'ssh_usr' was unexpected"),
        (_set("setup_commands", "pip install -e ."), "ValidationError", "is not of type"),
        (_set("provider.type", "locall"), "NotImplementedError", "Unsupported node provider"),
    ],
    ids=["unknown-top-level-key", "no-provider-type", "no-provider", "auth-typo",
         "setup-commands-not-a-list", "unknown-provider"],
)
def test_broken_cluster_yaml_fails_ray_validation(
    mutate: Callable[[dict[str, Any]], None], error: str, message: str
) -> None:
    """Negative controls: the validator used above does reject bad configs."""
    broken = load_cluster_yaml()
    mutate(broken)
    with pytest.raises(Exception) as info:  # noqa: B017 - the type is checked below
        validate_like_ray_up(broken)
    assert type(info.value).__name__ == error
    assert message in str(info.value)


def test_cluster_yaml_placeholders_are_documentation_addresses() -> None:
    provider = load_cluster_yaml()["provider"]
    assert provider["type"] == "local"
    ips = [provider["head_ip"], *provider["worker_ips"]]
    assert len(set(ips)) == len(ips)
    for ip in ips:
        assert ipaddress.ip_address(ip) in DOC_NET, f"{ip} is not an RFC 5737 placeholder"


def test_cluster_yaml_installs_like_the_readme() -> None:
    cfg = load_cluster_yaml()
    setup = cfg["setup_commands"]
    makefile_torch = re.search(r"torch==[\w.+]+", (REPO / "Makefile").read_text())
    assert makefile_torch, "the Makefile no longer pins torch"
    torch_at = [i for i, c in enumerate(setup) if f"install -q {makefile_torch[0]}" in c]
    project_at = [i for i, c in enumerate(setup) if "install -q -e ." in c]
    assert torch_at and project_at and torch_at[0] < project_at[0], "torch before the project"
    assert "python3.11 -m venv" in setup[0]

    head = " ".join(cfg["head_start_ray_commands"])
    for flag in ("ray start --head", "--port=6379", "--dashboard-host=0.0.0.0",
                 "--include-dashboard=true", "--autoscaling-config=~/ray_bootstrap_config.yaml",
                 "RAY_AUTH_MODE=token", "cloudrl/.venv/bin/activate"):
        assert flag in head, flag
    workers = " ".join(cfg["worker_start_ray_commands"])
    for flag in ("--address=$RAY_HEAD_IP:6379", "RAY_AUTH_MODE=token",
                 "cloudrl/.venv/bin/activate"):
        assert flag in workers, flag


def test_cluster_yaml_file_mounts_exist_and_carry_the_token() -> None:
    mounts = load_cluster_yaml()["file_mounts"]
    assert mounts["~/.ray/auth_token"] == "~/.ray/auth_token"
    repo_sources = {remote: local for remote, local in mounts.items() if local.startswith("./")}
    # `pip install -e .` on the nodes needs the packaging files and every package.
    needed = {"pyproject.toml", "cloudrl", "envs", "models", "experiments",
              "serve_apps"}
    assert needed <= {Path(local).name for local in repo_sources.values()}
    for remote, local in repo_sources.items():
        assert (REPO / local).exists(), f"file_mounts source {local} is missing"
        assert remote == f"~/cloudrl/{Path(local).name}"
    assert not any(".venv" in local or "results" in local for local in mounts.values())


# --------------------------------------------------------------------- slow tests


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalCluster:
    """A running ``ray start --head`` cluster on loopback, and how to talk to it."""

    ray: str  # the ray CLI of this venv
    address: str  # dashboard URL for `ray job ...`
    env: dict[str, str]  # environment with the token settings
    token: str
    temp_dir: Path
    out_dir: Path

    def job(self, *args: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``ray job <args> --address <dashboard>`` from the repository root."""
        return subprocess.run(
            [self.ray, "job", *args[:1], "--address", self.address, *args[1:]],
            cwd=REPO, env=env or self.env, capture_output=True, text=True, timeout=timeout)

    def submit(self, submission_id: str, entrypoint: list[str],
               timeout: float) -> subprocess.CompletedProcess[str]:
        """The README's command: upload the repo as the working dir, run, tail the logs.

        ``entrypoint`` is the argv after ``--`` (the CLI shell-quotes and joins it).
        """
        try:
            return self.job(
                "submit", "--submission-id", submission_id, "--working-dir", ".",
                "--runtime-env-json", json.dumps({"excludes": WORKING_DIR_EXCLUDES}),
                "--", *entrypoint, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.job("stop", submission_id, timeout=60)
            pytest.fail(f"job {submission_id} did not finish within {timeout:.0f} s")


def _stop_tree(root: subprocess.Popen[bytes], procs: dict[int, Any], grace_s: float = 30) -> None:
    """SIGTERM the ``ray start --block`` process (it shuts its node down), then
    SIGKILL whatever of the processes seen under it is still alive."""
    procs = {**procs, **descendants(root.pid)}
    if root.poll() is None:
        root.send_signal(signal.SIGTERM)
        try:
            root.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            root.kill()
            root.wait(timeout=10)
    reap(procs)


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[LocalCluster]:
    """A one-node Ray cluster with the dashboard and token auth, on 127.0.0.1 only."""
    ray_cli = Path(sys.executable).with_name("ray")
    if not os.access(ray_cli, os.X_OK):
        pytest.skip(f"no ray CLI next to {sys.executable}")

    # A short temp dir: Ray's unix socket paths must stay under 108 characters.
    temp_dir = Path(tempfile.mkdtemp(prefix="crl-"))
    out_dir = temp_dir / "out"
    out_dir.mkdir()
    token = secrets.token_hex(32)  # what `ray get-auth-token --generate` writes
    token_file = temp_dir / "auth_token"
    token_file.write_text(token)
    token_file.chmod(0o600)

    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update({
        # The job driver's `python` is the first one on the PATH `ray start` saw,
        # as on a cluster node where the venv is activated before `ray start`.
        "PATH": f"{ray_cli.parent}{os.pathsep}{env.get('PATH', '')}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
        "RAY_USAGE_STATS_ENABLED": "0",
    })
    gcs_port, dashboard_port, agent_port, client_port = (_free_port() for _ in range(4))
    address = f"http://127.0.0.1:{dashboard_port}"
    log_path = temp_dir / "ray_start.log"
    with open(log_path, "wb") as log:
        head = subprocess.Popen(
            [str(ray_cli), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
             f"--port={gcs_port}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
             f"--dashboard-port={dashboard_port}", f"--dashboard-agent-listen-port={agent_port}",
             f"--ray-client-server-port={client_port}", "--num-cpus=2",
             f"--object-store-memory={256 * 2**20}", f"--temp-dir={temp_dir}",
             "--disable-usage-stats"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started: dict[int, Any] = {}
    cluster = LocalCluster(str(ray_cli), address, env, token, temp_dir, out_dir)
    try:
        # Ready when the job API answers an authenticated request.
        deadline = time.monotonic() + 180
        while True:
            started.update(descendants(head.pid))
            if head.poll() is not None:
                pytest.fail(f"ray start exited with {head.returncode}:\n"
                            f"{log_path.read_text(errors='replace')[-4000:]}")
            try:
                req = urllib.request.Request(f"{address}/api/jobs/",
                                             headers={"Authorization": f"Bearer {token}"})
                with urllib.request.urlopen(req, timeout=5) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail("the dashboard did not answer within 180 s:\n"
                            f"{log_path.read_text(errors='replace')[-4000:]}")
            time.sleep(1)
        yield cluster
    finally:
        _stop_tree(head, started)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _job_status(cluster: LocalCluster, submission_id: str) -> str:
    """The job's status from the job REST API (what ``ray job status`` reads)."""
    req = urllib.request.Request(f"{cluster.address}/api/jobs/{submission_id}",
                                 headers={"Authorization": f"Bearer {cluster.token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)["status"]


@pytest.mark.slow
def test_job_api_requires_the_token(local_cluster: LocalCluster) -> None:
    """Auth is really on: the CLI without RAY_AUTH_MODE=token, or with a wrong token, fails."""
    ok = local_cluster.job("list")
    assert ok.returncode == 0, ok.stderr[-2000:]

    no_mode = {k: v for k, v in local_cluster.env.items() if k != "RAY_AUTH_MODE"}
    res = local_cluster.job("list", env=no_mode)
    assert res.returncode != 0
    assert "Authentication required" in res.stdout + res.stderr

    wrong = {k: v for k, v in local_cluster.env.items() if k != "RAY_AUTH_TOKEN_PATH"}
    wrong["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    res = local_cluster.job("list", env=wrong)
    assert res.returncode != 0
    assert "Authentication failed" in res.stdout + res.stderr


@pytest.mark.slow
def test_evaluate_job_succeeds(local_cluster: LocalCluster) -> None:
    """``cloudrl evaluate`` as a Ray job: SUCCEEDED, the table in the logs, the files written,
    and the code imported from the uploaded working dir."""
    out = local_cluster.out_dir / "eval"
    sid = f"cloudrl-eval-{uuid.uuid4().hex[:8]}"
    script = (
        "python -c 'import cloudrl; print(\"cloudrl from\", cloudrl.__file__)' && "
        "python -m cloudrl evaluate --policy ffd --n-servers 5 --n-seeds 2 "
        f"--episode-length 50 --workers 1 --quiet --out {out}")
    entry = ["bash", "-c", script]
    res = local_cluster.submit(sid, entry, timeout=300)
    logs = res.stdout + res.stderr
    assert res.returncode == 0, logs[-4000:]
    assert f"Job '{sid}' succeeded" in logs
    assert _job_status(local_cluster, sid) == "SUCCEEDED"

    # The comparison table, with its ffd row, came back through the job logs.
    assert re.search(r"^policy\s+energy kWh", logs, re.M), logs[-4000:]
    assert re.search(r"^ffd\s+\d", logs, re.M), logs[-4000:]
    # The uploaded copy of the repo (under the cluster's temp dir) was imported,
    # not the editable install in this checkout.
    imported = re.search(r"cloudrl from (\S+)", logs)
    assert imported, logs[-4000:]
    assert Path(imported[1]).resolve().is_relative_to(local_cluster.temp_dir.resolve())

    report = json.loads(out.with_suffix(".json").read_text())
    episodes = report["episodes"]
    assert len(episodes) == 2 and {e["policy"] for e in episodes} == {"ffd"}
    assert report["config"]["env"]["sim"]["episode_length"] == 50
    assert out.with_suffix(".csv").read_text().count("\nffd,") == 2


@pytest.mark.slow
def test_train_job_succeeds(local_cluster: LocalCluster) -> None:
    """``cloudrl train`` as a Ray job joins the cluster (RAY_ADDRESS from the job) and
    writes a checkpoint that ``cloudrl evaluate --checkpoint`` can read."""
    ckpt = local_cluster.out_dir / "ppo"
    sid = f"cloudrl-train-{uuid.uuid4().hex[:8]}"
    hparams = json.dumps({"train_batch_size_per_learner": 64, "minibatch_size": 32,
                          "num_epochs": 1})
    entry = ["python", "-m", "cloudrl", "train", "--algo", "ppo", "--n-servers", "5",
             "--episode-length", "50", "--env-steps", "200", "--hparams", hparams,
             "--out", str(ckpt)]
    res = local_cluster.submit(sid, entry, timeout=600)
    logs = res.stdout + res.stderr
    assert res.returncode == 0, logs[-4000:]
    assert f"Job '{sid}' succeeded" in logs
    assert _job_status(local_cluster, sid) == "SUCCEEDED"

    iters = re.findall(r"^iter\s+\d+\s+env_steps\s+(\d+)", logs, re.M)
    assert iters and int(iters[-1]) >= 200, logs[-4000:]
    assert f"checkpoint: {ckpt}" in logs
    meta = json.loads((ckpt / "cloudrl.json").read_text())
    assert meta["env"]["sim"]["episode_length"] == 50


@pytest.mark.slow
def test_apex_bdq_train_job_succeeds(local_cluster: LocalCluster) -> None:
    """The distributed Ape-X BDQ (2 async actors, 2 replay shard actors) as a Ray job."""
    ckpt = local_cluster.out_dir / "apex"
    sid = f"cloudrl-apex-{uuid.uuid4().hex[:8]}"
    hparams = json.dumps({"train_batch_size_per_learner": 16,
                          "num_steps_sampled_before_learning_starts": 100,
                          "num_cpus_per_replay_shard": 0})
    entry = ["python", "-m", "cloudrl", "train", "--algo", "apex_bdq", "--num-env-runners",
             "2", "--n-servers", "5", "--episode-length", "50", "--env-steps", "300",
             "--hparams", hparams, "--out", str(ckpt)]
    res = local_cluster.submit(sid, entry, timeout=600)
    logs = res.stdout + res.stderr
    assert res.returncode == 0, logs[-4000:]
    assert _job_status(local_cluster, sid) == "SUCCEEDED"
    iters = re.findall(r"^iter\s+\d+\s+env_steps\s+(\d+)", logs, re.M)
    assert iters and int(iters[-1]) >= 300, logs[-4000:]
    assert json.loads((ckpt / "cloudrl.json").read_text())["algo"] == "apex_bdq"
