"""Server-side decision time of ``POST /v1/scenario/decide`` per scenario controller.

What it does: starts Ray Serve on localhost once and deploys one replica of
``serve_apps.app`` serving the scenario per controller in turn: ``echo`` (the reference:
a controller that decides nothing, ``python:serve_apps.scenario_faults:echo``, so its row
is the service's own cost: request parsing, the state checks, the worker-thread hop),
``signal_aware``, ``mpc`` and the learned (distilled) checkpoint ``learned:DIR``
(default ``checkpoints/SCENARIO`` when it exists). For each it posts N scenario states
taken from one episode of the scenario (the simulator's state at every decision tick
under the signal-aware rule, seed ``--seed``) one at a time over a keep-alive
connection, and reports the service's own ``decide_ms`` (validated request to answer, in
the replica) and ``controller_ms`` (the controller's ``decide_view`` alone, in its worker
thread: the MPC's LP build and HiGHS solve, the learned policy's observation and forward)
as p50 and p99, beside the client's round trip p50. Same-run references: the ``echo``
row (ratios ``x echo`` of server p50 and round trip p50) and ``GET /healthz`` (a route
that does nothing), timed the same way on each deployment just before its requests.
``in-process`` times the controller's ``decide_view`` on the same states without HTTP
(the simulator's own ``ObservedView``). ``--n-servers N`` serves and plays the scenario
on a fleet of N servers (its load scales with it). Ratios only: nothing here asserts a
time.

How to run (two to three minutes on 2 cores):
    python experiments/benchmarks/bench_serve_scenario.py               # scarcity_spikes, N=200
    python experiments/benchmarks/bench_serve_scenario.py --scenario carbon_shift \
        --policies echo,signal_aware,mpc
    python experiments/benchmarks/bench_serve_scenario.py --scenario demand_response \
        --n-servers 1000 --n 100

Results: docs/tasks/serving.md, "Serving a scenario".
"""

from __future__ import annotations

import http.client
import json
import socket
import time

import numpy as np

from cloudrl.argparsing import CliParser


def _port(lo: int = 18400, hi: int = 18500) -> int:
    for port in range(lo, hi):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {lo}-{hi - 1}")


def episode_states(scenario: str, n: int, seed: int, n_servers: int | None = None
                   ) -> tuple[list[dict], list]:
    """Up to ``n`` request bodies (and their ObservedViews): the scenario at each decision
    tick."""
    from cloudrl.algorithms.distill.policy import observed_view
    from cloudrl.heuristics.signal_aware import SignalAwareDeferral
    from envs.scenario.catalog import load_scenario
    from envs.scenario.sim import ScenarioSim
    from serve_apps.scenario_state import state_of

    sim = ScenarioSim(load_scenario(scenario, n_servers=n_servers))
    sim.reset(seed)
    rule = SignalAwareDeferral()
    rule.reset(sim)
    bodies, views = [], []
    while not sim.done and len(bodies) < n:
        if sim.t % sim.cfg.decision_ticks == 0:
            bodies.append(state_of(sim))
            views.append(observed_view(sim))
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


def _label(policy: str) -> str:
    if policy.startswith("learned:"):
        return "learned"
    return policy.rsplit(":", 1)[-1] if policy.startswith("python:") else policy


def bench_policy(policy: str, scenario: str, bodies: list[dict], views: list, port: int,
                 db: str, n_servers: int | None = None) -> dict:
    from ray import serve

    from envs.scenario.catalog import load_scenario
    from envs.scenario.sim import ScenarioSim
    from serve_apps.app import build_app
    from serve_apps.scenario_service import load_controller

    serve.run(build_app({"state_db": db, "num_cpus": 0.0, "env": {"n_servers": 8},
                         "max_body_bytes": 4_000_000,
                         "scenario": {"name": scenario, "policy": policy,
                                      "n_servers": n_servers}}),
              name="cloudrl", route_prefix="/")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for body in bodies[:5]:  # warm-up: imports, first solve, first forward
        _timed(conn, "POST", "/v1/scenario/decide", json.dumps(body).encode())
    health = [_timed(conn, "GET", "/healthz", None)[0] for _ in bodies]
    server, ctrl_ms, client, fallbacks = [], [], [], 0
    for body in bodies:
        ms, out = _timed(conn, "POST", "/v1/scenario/decide", json.dumps(body).encode())
        client.append(ms)
        server.append(out["decide_ms"])
        if out.get("controller_ms") is not None:
            ctrl_ms.append(out["controller_ms"])
        fallbacks += int(out["fallback"])
    conn.close()
    ctrl = load_controller(policy, {}, scenario)
    ctrl.reset(ScenarioSim(load_scenario(scenario, n_servers=n_servers)))
    local = []
    for v in views:
        t0 = time.perf_counter()
        ctrl.decide_view(v)
        local.append((time.perf_counter() - t0) * 1e3)
    return {"policy": _label(policy), "n": len(bodies),
            "server_p50": float(np.median(server)), "server_p99": float(np.percentile(server, 99)),
            "ctrl_p50": float(np.median(ctrl_ms)), "ctrl_p99": float(np.percentile(ctrl_ms, 99)),
            "client_p50": float(np.median(client)), "healthz_p50": float(np.median(health)),
            "in_process_p50": float(np.median(local)), "fallbacks": fallbacks}


def _machine() -> str:
    import os
    import platform
    from pathlib import Path

    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in
                 Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores ({cpu}), load average {load}, no GPU used"


def main(argv: list[str] | None = None) -> None:
    from pathlib import Path

    ap = CliParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="scarcity_spikes")
    ap.add_argument("--n", type=int, default=200, help="requests per controller")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-servers", type=int, default=None,
                    help="another fleet size (default: the scenario's own)")
    ap.add_argument("--policies", default=None, help="comma-separated (default: echo, "
                    "signal_aware, mpc, learned:checkpoints/SCENARIO when it exists)")
    ap.add_argument("--db", default="/tmp/bench_serve_scenario.db")
    args = ap.parse_args(argv)

    import os

    import ray
    from ray import serve

    echo = "python:serve_apps.scenario_faults:echo"
    if args.policies:
        policies = [echo if p == "echo" else p for p in args.policies.split(",")]
    else:
        policies = [echo, "signal_aware", "mpc"]
        ckpt = Path(__file__).resolve().parents[2] / "checkpoints" / args.scenario
        if ckpt.is_dir():
            policies.append(f"learned:{ckpt}")
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    bodies, views = episode_states(args.scenario, args.n, args.seed, args.n_servers)
    machine = _machine()
    ray.init(address="local", num_cpus=1, include_dashboard=False)  # our own instance
    port = _port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        rows = [bench_policy(p, args.scenario, bodies, views, port, args.db, args.n_servers)
                for p in policies]
    finally:
        serve.shutdown()
        ray.shutdown()
    ref = next((r for r in rows if r["policy"] == "echo"), rows[0])
    size = len(json.dumps(bodies[0]))
    fleet = f", N={args.n_servers}" if args.n_servers else ""
    print(f"\nscenario {args.scenario}{fleet}: {len(bodies)} states of one episode "
          f"(seed {args.seed}), "
          f"request body ~{size / 1024:.0f} KiB, one at a time, keep-alive; {machine}")
    head = (f"{'controller':<13}{'n':>4}{'server p50':>11}{'p99':>8}{'ctrl p50':>10}"
            f"{'p99':>8}{'trip p50':>10}{'/healthz':>10}{'in-proc':>9}"
            f"{'server x echo':>14}{'trip x echo':>12}{'fallbacks':>10}")
    print(head + "\n" + "-" * len(head))
    for r in rows:
        print(f"{r['policy']:<13}{r['n']:>4}{r['server_p50']:>11.2f}{r['server_p99']:>8.2f}"
              f"{r['ctrl_p50']:>10.3f}{r['ctrl_p99']:>8.3f}{r['client_p50']:>10.2f}"
              f"{r['healthz_p50']:>10.2f}{r['in_process_p50']:>9.3f}"
              f"{r['server_p50'] / ref['server_p50']:>14.2f}"
              f"{r['client_p50'] / ref['client_p50']:>12.2f}{r['fallbacks']:>10}")
    print("(ms; server = decide_ms in the replica, ctrl = controller_ms, trip = the client's "
          "round trip, /healthz = its round trip on the same deployment)")


if __name__ == "__main__":
    main()
