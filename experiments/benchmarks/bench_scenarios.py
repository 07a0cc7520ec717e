"""Speed of the scenario layer, against the base simulator measured in the same run.

What it does: times (1) one tick of the base cluster simulator at N servers driven by the
``power_aware`` heuristic through the branching env (the reference), (2) one tick of the
scenario simulator (signals, job classes, power states, cost) under the signal-aware
heuristic, (3) one decision of the signal-aware heuristic and one re-plan of the forecast
MPC (HiGHS), and (4) the oracle's solve of a whole 50-server two-day episode. Prints a
table with each cost and its ratio to the reference.

How to run it::

    python -m experiments.benchmarks.bench_scenarios --scenario price_peak --episodes 1

Results to expect: see docs/benchmarks.md (numbers depend on the machine and its load;
the ratios are what to compare).
"""

from __future__ import annotations

import time

import numpy as np

from cloudrl.argparsing import CliParser


def base_tick_s(n_servers: int, ticks: int) -> float:
    """Seconds per tick of the base simulator + power_aware (branching env, no learning)."""
    from cloudrl.evaluate import make_env, resolve_policy
    from envs.env_config import EnvConfig

    cfg = EnvConfig.model_validate({"n_servers": n_servers, "sim": {"episode_length": ticks}})
    env = make_env(cfg, "branching")
    policy = resolve_policy("power_aware", "branching", cfg)
    obs, _ = env.reset(seed=0)
    policy.reset()
    t0 = time.perf_counter()
    steps = 0
    done = False
    while not done:
        obs, _, term, trunc, _ = env.step(policy.act(obs))
        done = term or trunc
        steps += 1
    return (time.perf_counter() - t0) / steps


def main(argv: list[str] | None = None) -> int:
    from cloudrl.heuristics.signal_aware import SignalAwareDeferral
    from cloudrl.mpc.forecast_mpc import ForecastMPC
    from cloudrl.mpc.oracle import ClairvoyantOracle
    from envs.scenario.catalog import load_scenario
    from envs.scenario.control import run_episode
    from envs.scenario.sim import ScenarioSim

    ap = CliParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="price_peak")
    ap.add_argument("--episodes", type=int, default=1)
    args = ap.parse_args(argv)
    cfg = load_scenario(args.scenario)
    n = cfg.fleet.n_servers
    ref = base_tick_s(n, 1000)
    sim = ScenarioSim(cfg)
    heur, mpc = SignalAwareDeferral(), ForecastMPC()
    tick_s, decide_s, mpc_s, oracle_s = [], [], [], []
    for ep in range(args.episodes):
        t0 = time.perf_counter()
        res = run_episode(sim, heur, 1_000_000 + ep)
        tick_s.append((time.perf_counter() - t0) / sim.n_ticks)
        decide_s.append(res.decide_s)
        res = run_episode(sim, mpc, 1_000_000 + ep)
        mpc_s.append(res.decide_s)
        sim.reset(1_000_000 + ep)
        t0 = time.perf_counter()
        ClairvoyantOracle().reset(sim)
        oracle_s.append(time.perf_counter() - t0)
    rows = [
        (f"base sim tick + power_aware, N={n} (reference)", ref),
        (f"scenario sim tick + signal_aware, N={n}", float(np.mean(tick_s))),
        ("signal_aware decision (per 15 min)", float(np.mean(decide_s))),
        ("forecast MPC decision: one HiGHS re-plan", float(np.mean(mpc_s))),
        (f"oracle: plan a whole episode ({sim.n_ticks} ticks)", float(np.mean(oracle_s))),
    ]
    print(f"{'what':52s} {'seconds':>10s} {'x reference':>12s}")
    for name, sec in rows:
        print(f"{name:52s} {sec:10.6f} {sec / ref:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
