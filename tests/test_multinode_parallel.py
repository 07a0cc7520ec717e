"""The library's parallel loops (:mod:`cloudrl.parallel`) on a two-node Ray cluster.

A real cluster from the ``ray`` CLI on this machine: ``ray start --head`` (1 CPU, the
dashboard and job API on 127.0.0.1:8291, GCS on port 6391) and a second node that joins
it with ``ray start --address`` (1 CPU, its own raylet, object store and ports). Every Ray
process gets a private temp dir, so nobody else's ``ray.init()`` on this machine joins
it, and teardown SIGTERMs the two ``ray start --block`` processes and kills what is left
of their own descendants (never ``ray stop``, which would stop every cluster here).

* ``ray job submit -- cloudrl headline --scenario tiny --tiny --no-log --workers 2``: the
  job's driver joins the cluster (``RAY_ADDRESS``), its 2 workers (1 CPU each) cannot
  both fit on the head, and the state API (``ray.util.state.list_actors``) shows the
  library's workers on the second node.
* Fault tolerance: evolution strategies over the cluster (a driver joined with
  ``RAY_ADDRESS``); one of its workers is SIGKILLed (its pid from the state API) after
  the first iteration. The run completes with the same result as an undisturbed one
  (the serial path in this process: equal to Ray's by ``tests/test_ray_parallel.py``).

What is not real: one physical machine (2 cores), loopback networking, one filesystem.
``pytest tests/test_multinode_parallel.py -m slow``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import descendants, reap

REPO = Path(__file__).resolve().parents[1]
GCS_PORT, DASHBOARD_PORT = 6391, 8291


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TwoNodes:
    env: dict[str, str]  # joins this cluster (RAY_TMPDIR, no RAY_ADDRESS)
    gcs: str
    dashboard: str
    ray: str
    temp_dir: Path

    def state(self, what: str) -> list[dict[str, Any]]:
        """``ray.util.state.list_<what>(detail=True)`` of this cluster, in a subprocess."""
        script = ("import json, sys\nfrom ray.util import state\n"
                  f"rows = state.list_{what}(address={self.dashboard!r}, detail=True, "
                  "limit=10000, raise_on_missing_output=False)\n"
                  "print(json.dumps([r.__dict__ if hasattr(r, '__dict__') else dict(r) "
                  "for r in rows], default=str))\n")
        res = subprocess.run([sys.executable, "-c", script], env=self.env, cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        return json.loads(res.stdout.strip().splitlines()[-1])


def _start(ray_cli: str, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as f:
        return subprocess.Popen([ray_cli, "start", "--block", "--node-ip-address=127.0.0.1",
                                 "--num-cpus=1", f"--object-store-memory={200 * 2**20}",
                                 "--disable-usage-stats", *args],
                                env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop(procs: list[subprocess.Popen], seen: dict[int, Any]) -> None:
    """SIGTERM each ``ray start --block`` (worker node first), then kill their leftovers."""
    for p in procs:
        seen.update(descendants(p.pid))
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
    reap(seen, timeout_s=15)


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    ray_cli = str(Path(sys.executable).with_name("ray"))
    temp_dir = Path(tempfile.mkdtemp(prefix="crl-2n-"))  # short: unix socket paths
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update({"PATH": f"{Path(ray_cli).parent}{os.pathsep}{env.get('PATH', '')}",
                "RAY_TMPDIR": str(temp_dir), "RAY_AUTH_MODE": "disabled",
                "RAY_USAGE_STATS_ENABLED": "0", "CLOUDRL_PROGRESS": "0",
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    log = temp_dir / "ray_start.log"
    dashboard = f"http://127.0.0.1:{DASHBOARD_PORT}"
    ports = lambda: [f"--node-manager-port={_free_port()}",  # noqa: E731
                     f"--object-manager-port={_free_port()}",
                     f"--dashboard-agent-listen-port={_free_port()}",
                     f"--dashboard-agent-grpc-port={_free_port()}",
                     f"--metrics-export-port={_free_port()}",
                     f"--runtime-env-agent-port={_free_port()}"]
    procs = [_start(ray_cli, ["--head", f"--port={GCS_PORT}", "--include-dashboard=true",
                              "--dashboard-host=127.0.0.1", f"--dashboard-port={DASHBOARD_PORT}",
                              f"--ray-client-server-port={_free_port()}",
                              f"--temp-dir={temp_dir}", *ports()], env, log)]
    seen: dict[int, Any] = {}
    cluster = TwoNodes(env, f"127.0.0.1:{GCS_PORT}", dashboard, ray_cli, temp_dir)
    try:
        deadline = time.monotonic() + 180
        while True:  # the job API answers
            seen.update(descendants(procs[0].pid))
            if procs[0].poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the head did not start:\n{log.read_text(errors='replace')[-4000:]}")
            try:
                with urllib.request.urlopen(f"{dashboard}/api/jobs/", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(1)
        procs.append(_start(ray_cli, [f"--address={cluster.gcs}", *ports()], env, log))
        while len([n for n in cluster.state("nodes") if n["state"] == "ALIVE"]) < 2:
            seen.update(descendants(procs[1].pid))
            if procs[1].poll() is not None or time.monotonic() > deadline + 120:
                pytest.fail(f"the worker node did not join:\n"
                            f"{log.read_text(errors='replace')[-4000:]}")
            time.sleep(1)
        yield cluster
    finally:
        _stop(procs, seen)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _nodes(cluster: TwoNodes) -> tuple[str, str]:
    """(head node id, worker node id)."""
    alive = [n for n in cluster.state("nodes") if n["state"] == "ALIVE"]
    head = next(n["node_id"] for n in alive if n["is_head_node"])
    other = next(n["node_id"] for n in alive if not n["is_head_node"])
    return head, other


@pytest.mark.slow
def test_a_submitted_headline_runs_its_workers_on_both_nodes(two_nodes: TwoNodes,
                                                            tmp_path: Path) -> None:
    head, worker = _nodes(two_nodes)
    start = time.perf_counter()
    res = subprocess.run(
        [two_nodes.ray, "job", "submit", "--address", two_nodes.dashboard, "--",
         "cloudrl", "headline", "--scenario", "tiny", "--tiny", "--no-log", "--workers", "2",
         "--out-dir", str(tmp_path / "headline")],
        cwd=REPO, env=two_nodes.env, capture_output=True, text=True, timeout=1500)
    took = time.perf_counter() - start
    print(f"\nray job submit ... cloudrl headline --scenario tiny --tiny: {took:.0f} s\n"
          f"{res.stdout[-2500:]}")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "succeeded" in res.stdout
    assert (tmp_path / "headline" / "tiny").is_dir()
    workers = [a for a in two_nodes.state("actors") if a["class_name"] == "ParallelWorker"]
    print(json.dumps([{k: a[k] for k in ("node_id", "pid", "state")} for a in workers]))
    assert workers, "no ParallelWorker actor in the cluster's actor table"
    assert {a["node_id"] for a in workers} == {head, worker}  # 1 CPU each: both nodes


ES_DRIVER = """
import json, sys
import numpy as np
from cloudrl.algorithms.es.algorithm import es_finetune
from cloudrl.algorithms.es.config import ESConfig
from envs.scenario.catalog import load_scenario

start, out, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
res = es_finetune(load_scenario("tiny"), start, ESConfig(**kw),
                  log=lambda m: print(m, flush=True))
json.dump({"history": res.history, "kept": res.kept_iteration, "episodes": res.episodes,
           "weights": {k: v.numpy().tolist() for k, v in res.module.state_dict().items()}},
          open(out, "w"))
"""


@pytest.mark.slow
def test_es_survives_a_killed_worker_with_the_same_result(two_nodes: TwoNodes,
                                                          tmp_path: Path) -> None:
    import torch

    from cloudrl.algorithms.distill.policy import build_module, save_checkpoint
    from cloudrl.algorithms.es.algorithm import es_finetune
    from cloudrl.algorithms.es.config import ESConfig
    from envs.scenario.catalog import load_scenario

    torch.manual_seed(11)
    start = save_checkpoint(build_module((8,)), tmp_path / "start", (8,), {"scenario": "tiny"})
    kw = dict(iterations=5, pairs=3, seeds_per_candidate=2, eval_every=1, n_val_seeds=3,
              sigma=0.4, run_seed=9)
    out = tmp_path / "es.json"
    t0 = time.perf_counter()
    driver = subprocess.Popen(
        [sys.executable, "-c", ES_DRIVER, str(start), str(out), json.dumps({**kw, "workers": 2})],
        cwd=REPO, env={**two_nodes.env, "RAY_ADDRESS": two_nodes.gcs}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    lines, killed = [], None
    try:
        for line in driver.stdout:  # kill a worker once the first iteration is done
            lines.append(line)
            if killed is None and line.startswith("iteration 1:"):
                alive = [a for a in two_nodes.state("actors")
                         if a["class_name"] == "ParallelWorker" and a["state"] == "ALIVE"]
                killed = alive[-1]
                os.kill(int(killed["pid"]), signal.SIGKILL)
        driver.wait(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
    took = time.perf_counter() - t0
    print(f"\nES on the cluster with a worker killed: {took:.0f} s\n{''.join(lines)}")
    assert driver.returncode == 0, driver.stderr.read()[-3000:]
    assert killed is not None, "".join(lines)
    after = {a["actor_id"]: a for a in two_nodes.state("actors")}[killed["actor_id"]]
    print(json.dumps({k: after.get(k) for k in ("state", "pid", "num_restarts", "node_id")}))
    assert int(after["pid"]) != int(killed["pid"]) or after["state"] == "DEAD"
    assert int(after.get("num_restarts") or 0) >= 1

    got = json.loads(out.read_text())
    ref = es_finetune(load_scenario("tiny"), str(start), ESConfig(**kw, workers=1),
                      log=lambda _: None)
    assert got["kept"] == ref.kept_iteration and got["episodes"] == ref.episodes
    key = lambda h: h.get("val", h.get("population_mean"))  # noqa: E731
    np.testing.assert_allclose([key(h) for h in got["history"]],
                               [key(h) for h in ref.history], rtol=1e-9)
    assert [h.get("seeds") for h in got["history"]] == [h.get("seeds") for h in ref.history]
    for k, v in ref.module.state_dict().items():
        np.testing.assert_allclose(np.array(got["weights"][k]), v.numpy(), rtol=1e-6,
                                   atol=1e-7)
