"""The last step of ``cloudrl steer loop``: register the steered policy and roll it out as a
canary on the scenario decision service, over real HTTP on Ray Serve.

1. The steered checkpoint becomes a new version of ``cloudrl-policy`` in the model
   registry (MLflow, ``<out>/mlflow.db``) with its eval table (the learned reward on
   validation: the start's and the kept iteration's) and lineage (the start, the operator,
   its label count), aliased ``challenger``.
2. The decision service (``serve_apps.app`` on Ray Serve, a local Ray of 2 CPUs, HTTP on
   ``serve_port`` or a free port in 8631-8639) serves the scenario with the start as its
   stable policy; ``POST /v1/scenario/canary`` (bearer token) puts the registered version
   (resolved to its registered files) on canary with an automatic plan
   (:mod:`serve_apps.scenario_canary`).
3. Traffic: validation-seed episodes of the scenario whose every decision is asked of the
   service (``POST /v1/scenario/decide`` with the simulator's state) and applied, until the
   service promotes or rolls the canary back (at most ``max_episodes``).
4. Promoted: the ``champion`` alias moves to the version. The outcome, the reason the
   service gave and the decisions each version answered go into the report.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

SERVE_PORTS = range(8631, 8640)
PROMOTE_AFTER = 20


def _free_port(ports: range) -> int:
    for p in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
            return p
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


def _call(url: str, token: str, method: str = "GET", body: Any = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={
        "authorization": f"Bearer {token}", "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _register(steered: dict[str, Any], start: str, tracking_uri: str) -> tuple[int, str]:
    from cloudrl.loop.registry import CHALLENGER, POLICY_MODEL, register_policy, resolve

    version = register_policy(
        steered["checkpoint"], tracking_uri=tracking_uri, aliases=(CHALLENGER,),
        eval_table={"val_learned_reward_start": steered["val_learned_start"],
                    "val_learned_reward_kept": steered["val_learned_kept"],
                    "kept_iteration": steered["kept_iteration"]},
        lineage={"start": str(start), "operator": steered["operator"],
                 "labels": steered["labels"], "objective": "learned reward (steer loop)"})
    path = resolve(f"models:/{POLICY_MODEL}/{version}", tracking_uri=tracking_uri)
    return version, str(path)


def canary_rollout(scenario: str, steered: dict[str, Any], start: str, out: Path,
                   serve_port: int = 0, log: Callable[[str], None] = print,
                   promote_after: int = PROMOTE_AFTER, max_episodes: int = 4
                   ) -> dict[str, Any]:
    """Steps 1-4 of the module docstring; the canary's outcome."""
    import ray
    from ray import serve

    from cloudrl.loop.registry import CHAMPION, POLICY_MODEL, set_alias
    from cloudrl.protocol import validation_seeds
    from envs.scenario.catalog import load_scenario
    from envs.scenario.sim import ScenarioSim
    from serve_apps.app import build_app
    from serve_apps.scenario_state import state_of

    t0 = time.perf_counter()
    out = Path(out).resolve()
    tracking_uri = f"sqlite:///{out / 'mlflow.db'}"
    version, path = _register(steered, start, tracking_uri)
    log(f"registered {steered['checkpoint']} as {POLICY_MODEL} version {version} "
        f"(alias challenger)")
    port = serve_port or _free_port(SERVE_PORTS)
    token = secrets.token_hex(16)
    cfg = {"policy": "heuristic:power_aware", "env": {"n_servers": 8, "workload": "poisson"},
           "state_db": str(out / "serve_state.db"), "auth_token": token, "num_cpus": 0.0,
           "scenario": {"name": scenario, "policy": f"learned:{Path(start).resolve()}"}}
    # a loaded machine can take longer than Serve's default 5 s to start its proxy
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "30")
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 log_to_driver=False)
    url = f"http://127.0.0.1:{port}"
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(cfg), name="cloudrl-steer", route_prefix="/")
        log(f"decision service on {url} (Ray Serve), stable: the start")
        started = _call(url + "/v1/scenario/canary", token, "POST", {
            "policy": f"learned:{path}", "weight": 0.5, "promote_after": promote_after,
            "max_fallbacks": 0, "max_clamped": 0, "max_decide_ms_p95": 1000.0})
        log(f"canary: {started['canary']} at weight {started['weight']:g}")
        scn = load_scenario(scenario)
        sim = ScenarioSim(scn)
        canary_policy = started["canary"]
        rep = started
        for seed in list(validation_seeds(max_episodes)):
            sim.reset(int(seed))
            while not sim.done:
                if sim.t % scn.decision_ticks == 0:
                    d = _call(url + "/v1/scenario/decide", token, "POST", state_of(sim))
                    sim.set_controls(float(d["release_util"]), float(d["ready_cores"]))
                sim.tick()
            rep = _call(url + "/v1/scenario/canary", token)
            if rep["canary"] is None:
                break
        outcome = next((e for e in reversed(rep["events"])
                        if e["event"] in ("promoted", "rolled_back")), None)
        info = _call(url + "/v1/scenario", token)
    finally:
        try:
            serve.shutdown()
        finally:
            if started_ray:
                ray.shutdown()
    result = {"registered_version": version, "policy": canary_policy,
              "outcome": outcome["event"] if outcome else "undecided",
              "reason": outcome["reason"] if outcome else "no decision within "
                                                          f"{max_episodes} episodes",
              "canary_decisions": rep["counts"]["decisions"], "events": rep["events"],
              "stable_after": rep["stable"], "service_counters": info.get("counters"),
              "wall_s": time.perf_counter() - t0}
    if result["outcome"] == "promoted":
        set_alias(POLICY_MODEL, CHAMPION, version, tracking_uri=tracking_uri)
        result["champion"] = version
    log(f"canary {result['outcome']}: {result['reason']}")
    return result
