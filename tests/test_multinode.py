"""Ape-X BDQ on a multi-node Ray cluster (``ray.cluster_utils.Cluster``), unchanged.

``Cluster`` starts one Ray node per ``add_node`` call on this machine: the head
(GCS + raylet + object store) and two worker nodes, each with its OWN raylet
process, node id, plasma object store and CPU resources. Nothing in cloudrl knows
about this: the driver joins by address, exactly as on ``ray up`` hardware.

What is real here:

- separate raylets schedule the actors. The head advertises 0 CPUs (as the README's
  AWS head does) and each worker 2, so the 2 env runners + 2 replay shards (1 CPU
  each) cannot fit on one node: Ray's scheduler has to place them on both workers.
  The tests check where they ran: from inside each actor (``get_node_id``), and for
  the CLI from the GCS actor table;
- separate object stores: every object that goes between the driver (on the head
  node; the learner lives there) and an actor, or between a runner and a shard on
  another worker (weights broadcasts, replay batches, priority updates, runner ->
  shard transitions), is pulled by the receiving node's object manager over its
  own gRPC/TCP connection, as between machines. Left to itself, Ray put runner
  ``i`` next to the shard it writes to (shard ``(i - 1) % 2``); so that the runner ->
  shard writes cross nodes too, the first test pins its runners to the first worker
  with a custom resource only that worker advertises (RLlib's
  ``custom_resources_per_env_runner``, a user-level knob), which leaves the second
  worker's CPUs to the shards. ``cloudrl train`` (second test) runs unpinned;
- the driver connects the way a user's does: ``ray.init(address=...)`` in a
  script, and ``cloudrl train`` with ``RAY_ADDRESS`` (``cloudrl.ray_utils.init_ray``,
  the ``ray job submit`` path).

What is not: it is one physical machine (2 cores shared by everything, CPUs
oversubscribed), the nodes talk over the local network stack (no real latency,
bandwidth limits or partitions), they share one filesystem and one venv (no
``--working-dir`` upload), and no node fails.

Isolation: the cluster runs in a helper subprocess and the drivers in their own
subprocesses, so this module never touches the pytest process's Ray (the
``ray_session`` fixture of ``conftest.py`` may hold a local Ray there). Every Ray
process of the cluster gets ``RAY_TMPDIR`` set to a private directory: ``Cluster``
writes the head's address to ``<ray temp dir>/ray_current_cluster``, the file a
plain ``ray.init()`` reads, and removes it at shutdown; with the default ``/tmp/ray``
other people's ``ray.init()`` on this machine would join this cluster meanwhile.
Teardown shuts the cluster down from the helper, then kills only the helper's own
descendants that are still alive (never ``ray stop``).

``pytest tests/test_multinode.py -m slow``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import descendants, reap

REPO = Path(__file__).resolve().parents[1]
WORKER_CPUS = 2
N_WORKERS = 2
RUNNER_NODE = "apex_runner_node"  # custom resource of the first worker node

# The helper: head (0 CPUs, no dashboard) + N_WORKERS worker nodes; writes the address
# and node ids to argv[1] when every node is registered, then waits for stdin to close.
CLUSTER_SCRIPT = """
import json, os, sys
from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True,
                  head_node_args={"num_cpus": 0, "include_dashboard": False})
cpus, n_workers, runner_node = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
workers = [cluster.add_node(num_cpus=cpus, resources={runner_node: cpus} if i == 0 else {})
           for i in range(n_workers)]
cluster.wait_for_nodes(timeout=120)
info = {"address": cluster.address, "head": cluster.head_node.node_id,
        "workers": [w.node_id for w in workers]}
tmp = sys.argv[1] + ".part"
with open(tmp, "w") as f:
    json.dump(info, f)
os.replace(tmp, sys.argv[1])
sys.stdin.read()
cluster.shutdown()
"""

# The driver: Ape-X BDQ from cloudrl's own TrainConfig -> build_algo_config, tiny sizes.
DRIVER_SCRIPT = """
import json, sys, time
import ray
from cloudrl.algorithms.apex_bdq import APEX_RESULTS
from cloudrl.training import TrainConfig, build_algo_config, check_cluster_fits, env_steps_of

address, out, runner_node = sys.argv[1:4]
t0 = time.perf_counter()
ray.init(address=address)
cfg = TrainConfig(
    algo="apex_bdq", env={"n_servers": 5, "sim": {"episode_length": 50}},
    num_env_runners=2, envs_per_runner=1, hidden=16, env_steps=10**9,
    hparams={"num_replay_shards": 2, "num_cpus_per_replay_shard": 1,
             "replay_shard_capacity": 2000, "broadcast_interval": 2,
             "train_batch_size_per_learner": 16,
             "num_steps_sampled_before_learning_starts": 64,
             "target_network_update_freq": 32})
config = (build_algo_config(cfg)
          .env_runners(num_cpus_per_env_runner=1, rollout_fragment_length=16,
                       custom_resources_per_env_runner={runner_node: 1})
          .reporting(min_sample_timesteps_per_iteration=64))
check_cluster_fits(config)
algo = config.build_algo()
try:
    built_s = time.perf_counter() - t0
    here = lambda *_: ray.get_runtime_context().get_node_id()
    runners = algo.env_runner_group.foreach_env_runner(
        lambda r: [r.worker_index, ray.get_runtime_context().get_node_id()],
        local_env_runner=False)
    shards = ray.get([h.apply.remote(here) for h in algo.replay_shards()])
    iterations = []
    for _ in range(40):
        result = algo.train()
        apex = result[APEX_RESULTS]
        iterations.append({"env_steps": env_steps_of(result), **{k: apex.get(k) for k in (
            "learner_updates", "trained_samples", "priority_updates_sent", "broadcasts",
            "shard_0_size", "shard_1_size", "runner_weights_version_min")}})
        if apex["learner_updates"] >= 8 and apex.get("runner_weights_version_min", 0) > 0:
            break
finally:
    algo.stop()
info = {"driver": ray.get_runtime_context().get_node_id(),
        "nodes": [n["NodeID"] for n in ray.nodes() if n["Alive"]],
        "runners": {str(i): node for i, node in runners}, "shards": shards,
        "iterations": iterations, "build_s": built_s,
        "total_s": time.perf_counter() - t0}
with open(out, "w") as f:
    json.dump(info, f, indent=1)
ray.shutdown()
"""

# Where the actors of every job ran, from the GCS actor table (dead actors included):
# ``ray._private.state.actors`` (Ray's debugging view; ``ray.util.state`` would need the
# dashboard, which this cluster does not start).
ACTORS_SCRIPT = """
import json, sys
import ray
from ray._private.state import actors

ray.init(address=sys.argv[1])
print(json.dumps([{"cls": a["ActorClassName"], "node": a["Address"]["NodeID"],
                   "owner_node": a["OwnerAddress"]["NodeID"], "job": a["JobID"],
                   "start_ms": a["StartTime"]} for a in actors().values()]))
ray.shutdown()
"""


@dataclass
class MultiNode:
    """A running ``Cluster``: its address, node ids, and the environment to join it with."""

    address: str
    head: str
    workers: list[str]
    env: dict[str, str]
    startup_s: float


def _stop(helper: subprocess.Popen[bytes], seen: dict[int, Any]) -> None:
    """Close the helper's stdin (it shuts the cluster down), then SIGKILL whatever of the
    processes seen under it is still alive."""
    seen = {**seen, **descendants(helper.pid)}
    with contextlib.suppress(OSError):
        helper.stdin.close()
    try:
        helper.wait(timeout=60)
    except subprocess.TimeoutExpired:
        helper.send_signal(signal.SIGKILL)
        helper.wait(timeout=10)
    reap(seen, timeout_s=15)


@pytest.fixture(scope="module")
def multinode() -> Iterator[MultiNode]:
    # A short private Ray temp dir: unix socket paths must stay under 108 characters.
    temp_dir = Path(tempfile.mkdtemp(prefix="crl-mn-"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update({"RAY_TMPDIR": str(temp_dir), "RAY_USAGE_STATS_ENABLED": "0",
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    info_path = temp_dir / "cluster.json"
    log_path = temp_dir / "cluster.log"
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        helper = subprocess.Popen(
            [sys.executable, "-c", CLUSTER_SCRIPT, str(info_path), str(WORKER_CPUS),
             str(N_WORKERS), RUNNER_NODE],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
    seen: dict[int, Any] = {}
    try:
        deadline = time.monotonic() + 180
        while not info_path.exists():
            seen.update(descendants(helper.pid))
            if helper.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the Ray cluster did not start:\n"
                            f"{log_path.read_text(errors='replace')[-4000:]}")
            time.sleep(0.5)
        seen.update(descendants(helper.pid))
        info = json.loads(info_path.read_text())
        yield MultiNode(info["address"], info["head"], info["workers"], env,
                        time.perf_counter() - start)
    finally:
        _stop(helper, seen)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _run(cmd: list[str], env: dict[str, str], timeout: float,
         cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{cmd[:4]} did not finish in {timeout:.0f} s:\n"
                    f"{(e.stdout or b'')[-3000:]!r}\n{(e.stderr or b'')[-3000:]!r}")


@pytest.mark.slow
def test_apex_bdq_spreads_actors_over_nodes_and_learns(multinode: MultiNode,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "placement.json"
    script = tmp_path / "apex_driver.py"
    script.write_text(DRIVER_SCRIPT)
    start = time.perf_counter()
    res = _run([sys.executable, str(script), multinode.address, str(out), RUNNER_NODE],
               multinode.env, timeout=240)
    logs = res.stdout[-3000:] + res.stderr[-5000:]
    assert res.returncode == 0, logs
    info = json.loads(out.read_text())
    print(f"\ncluster up in {multinode.startup_s:.1f} s; driver {time.perf_counter() - start:.1f} s"
          f" (algo built in {info['build_s']:.1f} s)\n{json.dumps(info, indent=1)}")

    # Three live nodes, the ones the helper started; the driver joined the head.
    assert sorted(info["nodes"]) == sorted([multinode.head, *multinode.workers])
    assert info["driver"] == multinode.head
    # Runners on the first worker (pinned), shards on the second (the CPUs left: RLlib
    # creates the env runners before ApexBDQ.setup creates the shards); none on the head.
    assert sorted(info["runners"]) == ["1", "2"] and len(info["shards"]) == 2
    assert set(info["runners"].values()) == {multinode.workers[0]}
    assert set(info["shards"]) == {multinode.workers[1]}
    # Training made progress through every path, each one between two nodes: runners ->
    # shards (rows), shards -> learner (batches), learner -> shards (priorities),
    # learner -> runners (weights), runners -> driver (reports).
    last = info["iterations"][-1]
    assert last["env_steps"] > 0 and last["learner_updates"] >= 8, info["iterations"]
    assert last["trained_samples"] == 16 * last["learner_updates"]
    assert last["priority_updates_sent"] == last["learner_updates"]
    assert last["shard_0_size"] > 0 and last["shard_1_size"] > 0
    assert last["runner_weights_version_min"] > 0  # broadcast weights reached both runners


@pytest.mark.slow
def test_cli_train_apex_bdq_joins_the_cluster_via_ray_address(multinode: MultiNode,
                                                               tmp_path: Path) -> None:
    """``cloudrl train`` with ``RAY_ADDRESS`` set joins the cluster (``init_ray``); the
    default 1 CPU per replay shard (4 CPUs of actors) only fits on both workers."""
    ckpt = tmp_path / "apex"
    hparams = {"train_batch_size_per_learner": 16, "replay_shard_capacity": 5000,
               "num_steps_sampled_before_learning_starts": 100}
    cmd = [sys.executable, "-m", "cloudrl", "train", "--algo", "apex_bdq",
           "--num-env-runners", "2", "--n-servers", "5", "--episode-length", "50",
           "--env-steps", "300", "--hparams", json.dumps(hparams), "--out", str(ckpt)]
    start, start_ms = time.perf_counter(), time.time() * 1000
    res = _run(cmd, {**multinode.env, "RAY_ADDRESS": multinode.address}, timeout=240,
               cwd=tmp_path)
    logs = res.stdout[-3000:] + res.stderr[-5000:]
    print(f"\ncloudrl train: {time.perf_counter() - start:.1f} s\n{res.stdout[-2000:]}")
    assert res.returncode == 0, logs
    query = _run([sys.executable, "-c", ACTORS_SCRIPT, multinode.address], multinode.env,
                 timeout=60)
    assert query.returncode == 0, query.stderr[-3000:]
    # This run's actors: created after it started (same clock: one machine).
    mine = [a for a in json.loads(query.stdout.strip().splitlines()[-1])
            if a["start_ms"] >= start_ms]
    print(json.dumps(mine, indent=1))
    shards = [a for a in mine if a["cls"].endswith("ReplayShard")]
    runners = [a for a in mine if a["cls"].endswith("EnvRunner")]
    assert len(shards) == 2 and len(runners) == 2, mine
    assert {a["node"] for a in mine} == set(multinode.workers)  # both workers, no head
    # The CLI's driver joined the existing cluster, no local Ray of its own: its actors are
    # in that cluster's actor table, owned by a driver on its head node. (Ray's own
    # "Connecting to existing Ray cluster" line is filtered out of the CLI's output.)
    assert {a["owner_node"] for a in mine} == {multinode.head}
    iters = re.findall(r"^iter\s+\d+\s+env_steps\s+(\d+)", res.stdout, re.M)
    assert iters and int(iters[-1]) >= 300, logs
    assert f"checkpoint: {ckpt}" in res.stdout
    from cloudrl.checkpoint_policy import is_checkpoint

    assert is_checkpoint(ckpt)
    assert json.loads((ckpt / "cloudrl.json").read_text())["algo"] == "apex_bdq"
