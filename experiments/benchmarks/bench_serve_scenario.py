"""Server-side decision time of ``POST /v1/scenario/decide`` per scenario controller.

What it does: starts Ray Serve on localhost (one replica of ``serve_apps.app`` serving the
scenario) once per controller (``signal_aware``, ``mpc``), posts N scenario states taken
from one episode of the scenario (the simulator's state at every decision tick under the
signal-aware rule, seed ``--seed``) one at a time over a keep-alive connection, and
reports the service's own ``decide_ms`` (p50, p95) beside the client's round trip. The
same-run reference is ``GET /healthz`` (a route that does nothing), timed the same way
on the same deployment just before the controller's requests. ``in-process`` times the
controller's ``decide_view`` on the same states without HTTP.

How to run (about a minute on 2 cores):
    python experiments/benchmarks/bench_serve_scenario.py                # carbon_shift, N=200
    python experiments/benchmarks/bench_serve_scenario.py --scenario price_peak --n 100

Results: docs/tasks/serving.md, "Serving a scenario".
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import time

import numpy as np


def _port(lo: int = 18400, hi: int = 18500) -> int:
    for port in range(lo, hi):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {lo}-{hi - 1}")


def episode_states(scenario: str, n: int, seed: int) -> tuple[list[dict], list]:
    """Up to ``n`` request bodies (and their PlanViews): the scenario at each decision tick."""
    from cloudrl.heuristics.signal_aware import SignalAwareDeferral
    from envs.scenario.catalog import load_scenario
    from envs.scenario.control import plan_view
    from envs.scenario.sim import ScenarioSim
    from serve_apps.scenario_state import state_of

    sim = ScenarioSim(load_scenario(scenario))
    sim.reset(seed)
    rule = SignalAwareDeferral()
    rule.reset(sim)
    bodies, views = [], []
    while not sim.done and len(bodies) < n:
        if sim.t % sim.cfg.decision_ticks == 0:
            bodies.append(state_of(sim))
            views.append(plan_view(sim))
            sim.set_controls(*rule.decide(sim))
        sim.tick()
    return bodies, views


def _timed(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None
           ) -> tuple[float, dict]:
    t0 = time.perf_counter()
    conn.request(method, path, body, {"content-type": "application/json"})
    resp = conn.getresponse()
    out = json.loads(resp.read())
    if resp.status != 200:
        raise RuntimeError(f"{method} {path}: {resp.status} {out}")
    return (time.perf_counter() - t0) * 1e3, out


def bench_policy(policy: str, scenario: str, bodies: list[dict], views: list, port: int,
                 db: str) -> dict:
    from ray import serve

    from serve_apps.app import build_app
    from serve_apps.scenario_config import ScenarioServing
    from serve_apps.scenario_service import ScenarioService, load_controller

    serve.run(build_app({"state_db": db, "num_cpus": 0.0, "env": {"n_servers": 8},
                         "max_body_bytes": 4_000_000,
                         "scenario": {"name": scenario, "policy": policy}}),
              name="cloudrl", route_prefix="/")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for body in bodies[:5]:  # warm-up: imports, first solve
        _timed(conn, "POST", "/v1/scenario/decide", json.dumps(body).encode())
    health = [_timed(conn, "GET", "/healthz", None)[0] for _ in bodies]
    server, client, fallbacks = [], [], 0
    for body in bodies:
        ms, out = _timed(conn, "POST", "/v1/scenario/decide", json.dumps(body).encode())
        client.append(ms)
        server.append(out["decide_ms"])
        fallbacks += int(out["fallback"])
    conn.close()
    ctrl = load_controller(policy, {})
    ctrl.reset(ScenarioService(ScenarioServing(name=scenario, policy=policy)).sim)
    local = []
    for v in views:
        t0 = time.perf_counter()
        ctrl.decide_view(v)
        local.append((time.perf_counter() - t0) * 1e3)
    return {"policy": policy, "n": len(bodies), "server_p50": float(np.median(server)),
            "server_p95": float(np.percentile(server, 95)),
            "client_p50": float(np.median(client)), "healthz_p50": float(np.median(health)),
            "in_process_p50": float(np.median(local)), "fallbacks": fallbacks}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="carbon_shift")
    ap.add_argument("--n", type=int, default=200, help="requests per controller")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default="signal_aware,mpc")
    ap.add_argument("--db", default="/tmp/bench_serve_scenario.db")
    args = ap.parse_args(argv)

    import os

    import ray
    from ray import serve

    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    bodies, views = episode_states(args.scenario, args.n, args.seed)
    ray.init(num_cpus=1, include_dashboard=False)
    port = _port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        rows = [bench_policy(p, args.scenario, bodies, views, port, args.db)
                for p in args.policies.split(",")]
    finally:
        serve.shutdown()
        ray.shutdown()
    size = len(json.dumps(bodies[0]))
    print(f"\nscenario {args.scenario}: {len(bodies)} states of one episode (seed {args.seed}), "
          f"request body ~{size / 1024:.0f} KiB, one at a time, keep-alive")
    head = (f"{'controller':<14}{'n':>5}{'server p50 ms':>15}{'server p95 ms':>15}"
            f"{'round trip p50':>16}{'/healthz p50':>14}{'in-process p50':>16}{'fallbacks':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['policy']:<14}{r['n']:>5}{r['server_p50']:>15.2f}{r['server_p95']:>15.2f}"
              f"{r['client_p50']:>16.2f}{r['healthz_p50']:>14.2f}{r['in_process_p50']:>16.2f}"
              f"{r['fallbacks']:>11}")


if __name__ == "__main__":
    main()
