"""The sim-MPC and the hindsight oracle against the tuned references on one scenario.

What it does: reads the scenario's tuned heuristic and fluid-MPC parameters (a
checkpoint's ``references.json``), tunes the sim-MPC on validation seeds over a small grid
(futures K, horizon, CEM iterations and population), then plays on the held-out test
seeds: the tuned signal-aware heuristic, the fluid forecast MPC, the fluid oracle, the
learned policy (``--checkpoint``), the tuned sim-MPC, the same with one future (K=1), and the
hindsight oracle (the sim-MPC's search on the realised future). It prints a table of mean
costs with paired (by seed) 95% t-intervals against the heuristic, the sim-MPC's seconds
per re-plan, and times re-plans with 1 and 2 rollout workers (Ray actors) on the first
test seed's first ``--timing-replans`` re-plans.

Run (about 40 min on the shared, loaded 2-core machine at these settings)::

    python -m experiments.benchmarks.bench_sim_mpc --scenario scarcity_spikes \\
        --checkpoint checkpoints/scarcity_spikes --n-val-seeds 3 --n-seeds 10 \\
        --out results/bench_sim_mpc
    # -> results/bench_sim_mpc/results.json and table.md

Results: docs/results/yardstick.md ("Sim-MPC", "Hindsight oracle").
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from cloudrl.argparsing import CliParser

GRID = {  # the tuning grid (all re-plan hourly: every 4 decision periods)
    "K2_H8_it2_pop8": dict(samples=2, horizon=8, block_periods=2, iterations=2, population=8,
                           elites=2),
    "K4_H8_it2_pop8": dict(samples=4, horizon=8, block_periods=2, iterations=2, population=8,
                           elites=2),
    "K2_H16_it2_pop8": dict(samples=2, horizon=16, block_periods=4, iterations=2,
                            population=8, elites=2),
    "K2_H8_it3_pop12": dict(samples=2, horizon=8, block_periods=2, iterations=3,
                            population=12, elites=3),
}
REPLAN = 4
HINDSIGHT = dict(samples=1, horizon=12, block_periods=2, iterations=3, population=16, elites=4)


def _controller(kind: str, params: dict, refs: dict):
    if kind == "sim_mpc":
        from cloudrl.mpc.sim_mpc import SimMPC, SimMPCConfig

        return SimMPC(SimMPCConfig(**params, replan_periods=REPLAN, mpc=refs["mpc"]))
    if kind == "sim_hindsight":
        from cloudrl.mpc.sim_mpc import SimHindsightOracle, SimMPCConfig

        return SimHindsightOracle(SimMPCConfig(**params, replan_periods=REPLAN,
                                               mpc=refs["mpc"]))
    from cloudrl.scenarios.runner import ControllerSpec

    return ControllerSpec(kind, params).build()


def _play(job: tuple) -> dict:
    """One episode: (scenario, label, kind, params, refs, seed) -> metrics."""
    from envs.scenario.catalog import load_scenario
    from envs.scenario.control import run_episode
    from envs.scenario.sim import ScenarioSim

    scenario, label, kind, params, refs, seed = job
    sim = ScenarioSim(load_scenario(scenario))
    ctrl = _controller(kind, params, refs)
    t0 = time.perf_counter()
    res = run_episode(sim, ctrl, seed)
    out = {"label": label, "seed": seed, "cost_usd": res.metrics["cost_usd"],
           "episode_s": time.perf_counter() - t0, "decide_ms": res.decide_s * 1000.0,
           "sla_lc": res.metrics["sla_lc"], "sla_batch": res.metrics["sla_batch"]}
    times = getattr(ctrl, "solve_times", None)
    if times:
        out["replan_s"] = float(np.mean(times))
    return out


def _run(jobs: list[tuple], workers: int) -> list[dict]:
    if workers == 1:
        return [_play(j) for j in jobs]
    from cloudrl.parallel import ordered_map  # Ray tasks on `workers` CPUs

    return ordered_map(_play, jobs, workers)


def _timing(scenario: str, params: dict, refs: dict, seed: int, replans: int) -> dict:
    """Seconds per re-plan with 1 and 2 rollout workers on the first ``replans`` re-plans."""
    import ray

    from cloudrl.mpc.sim_mpc import SimMPC, SimMPCConfig
    from envs.scenario.catalog import load_scenario
    from envs.scenario.sim import ScenarioSim

    out = {}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        decisions = []
        for workers in (1, 2):
            sim = ScenarioSim(load_scenario(scenario))
            sim.reset(seed)
            ctrl = SimMPC(SimMPCConfig(**params, replan_periods=1, workers=workers,
                                       mpc=refs["mpc"]))
            ctrl.reset(sim)
            d = sim.cfg.decision_ticks
            got = []
            for _ in range(replans):
                got.append(ctrl.decide(sim))
                sim.set_controls(*got[-1])
                for _ in range(d * REPLAN):  # the next re-plan an hour later
                    sim.tick()
            ctrl.close()
            decisions.append(got)
            out[f"workers_{workers}_replan_s"] = float(np.mean(ctrl.solve_times))
        out["same_decisions"] = decisions[0] == decisions[1]
    finally:
        ray.shutdown()
    return out


# paired comparisons printed under the table: (a, b) -> a - b by seed
PAIRS = (("sim_hindsight", "fluid_oracle"), ("sim_mpc_K2", "mpc"), ("sim_mpc_K2", "learned"),
         ("sim_mpc_K1", "sim_mpc_K2"), ("sim_hindsight", "sim_mpc_K2"))


def _report(scenario: str, seeds: list[int], table: dict) -> list[str]:
    """The test table and the paired comparisons, as printed."""
    from cloudrl.scenarios.runner import paired_ci

    base = np.array(table["signal_aware"]["per_seed"])
    lines = [f"{scenario}, {len(seeds)} test seeds ({seeds[0]}..{seeds[-1]}); "
             f"paired 95% CI of (policy - heuristic)",
             "", "| policy | mean cost $ | vs heuristic $ [95% CI] | vs heuristic % | "
             "s per re-plan |", "|---|---:|---:|---:|---:|"]
    for label, row in table.items():
        c = np.array(row["per_seed"])
        d, lo, hi = paired_ci(c, base)
        rps = f"{row['replan_s']:.2f}" if row["replan_s"] is not None else "-"
        lines.append(f"| {label} | {c.mean():.2f} | {d:+.2f} [{lo:+.2f}, {hi:+.2f}] | "
                     f"{100 * d / base.mean():+.1f}% | {rps} |")
    lines.append("")
    for a, b in PAIRS:
        if a in table and b in table:
            x, y = np.array(table[a]["per_seed"]), np.array(table[b]["per_seed"])
            d, lo, hi = paired_ci(x, y)
            lines.append(f"{a} - {b}: {d:+.2f} $ [{lo:+.2f}, {hi:+.2f}], "
                         f"lower on {int((x < y).sum())} of {len(x)} seeds")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = CliParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="scarcity_spikes")
    p.add_argument("--checkpoint", default="checkpoints/scarcity_spikes")
    p.add_argument("--n-val-seeds", type=int, default=3)
    p.add_argument("--n-seeds", type=int, default=10)
    p.add_argument("--workers", type=int, default=2, help="episodes in parallel")
    p.add_argument("--timing-replans", type=int, default=6)
    p.add_argument("--stage", default="all", choices=("all", "tune", "test", "timing", "report"),
                   help="report: print the saved tables again")
    p.add_argument("--config", help="with --stage test: the grid point to test")
    p.add_argument("--out", default="results/bench_sim_mpc")
    args = p.parse_args(argv)

    from cloudrl.protocol import test_seeds, validation_seeds

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    refs = json.loads((Path(args.checkpoint) / "references.json").read_text())
    path = out / "results.json"
    state = json.loads(path.read_text()) if path.is_file() else {}
    state["machine"] = f"{platform.node()}: {os.cpu_count()} CPUs ({platform.processor()})"
    if args.stage in ("all", "tune"):
        seeds = validation_seeds(args.n_val_seeds)
        jobs = [(args.scenario, name, "sim_mpc", params, refs, s)
                for name, params in GRID.items() for s in seeds]
        jobs += [(args.scenario, "mpc", "mpc", refs["mpc"], refs, s) for s in seeds]
        res = _run(jobs, args.workers)
        tune = {}
        for name in [*GRID, "mpc"]:
            rows = [r for r in res if r["label"] == name]
            tune[name] = {"cost_usd": float(np.mean([r["cost_usd"] for r in rows])),
                          "replan_s": float(np.mean([r.get("replan_s", 0.0) for r in rows]))}
            print(f"validation {name:18s} {tune[name]['cost_usd']:9.3f} $  "
                  f"{tune[name]['replan_s']:.2f} s/re-plan")
        best = min(GRID, key=lambda n: tune[n]["cost_usd"])
        state["tune"] = {"seeds": list(seeds), "grid": GRID, "results": tune, "best": best}
        path.write_text(json.dumps(state, indent=2))
    if args.stage in ("all", "test"):
        best = args.config or state["tune"]["best"]
        params = GRID[best]
        other_k = {**params, "samples": 1 if params["samples"] == 2 else 2}
        seeds = list(test_seeds(args.n_seeds))
        plan = [("signal_aware", "signal_aware", refs["signal_aware"]),
                ("mpc", "mpc", refs["mpc"]), ("fluid_oracle", "oracle", {}),
                ("learned", "learned", {"checkpoint": args.checkpoint}),
                (f"sim_mpc_K{params['samples']}", "sim_mpc", params),
                (f"sim_mpc_K{other_k['samples']}", "sim_mpc", other_k),
                ("sim_hindsight", "sim_hindsight", HINDSIGHT)]
        jobs = [(args.scenario, label, kind, prm, refs, s) for label, kind, prm in plan
                for s in seeds]
        res = _run(jobs, args.workers)
        by = {label: [next(r for r in res if r["label"] == label and r["seed"] == s)
                      for s in seeds] for label, _, _ in plan}
        table = {}
        for label, _, _ in plan:
            rp = [r["replan_s"] for r in by[label] if "replan_s" in r]
            table[label] = {"cost_usd": float(np.mean([r["cost_usd"] for r in by[label]])),
                            "replan_s": float(np.mean(rp)) if rp else None,
                            "per_seed": [r["cost_usd"] for r in by[label]]}
        lines = _report(args.scenario, seeds, table)
        print("\n".join(lines))
        state["test"] = {"seeds": seeds, "config": best, "hindsight": HINDSIGHT,
                         "table": table}
        (out / "table.md").write_text("\n".join(lines) + "\n")
        path.write_text(json.dumps(state, indent=2))
    if args.stage == "report":
        for name, row in state["tune"]["results"].items():
            print(f"validation {name:18s} {row['cost_usd']:9.3f} $  "
                  f"{row['replan_s']:.2f} s/re-plan")
        print("\n".join(_report(args.scenario, state["test"]["seeds"],
                                state["test"]["table"])))
        for k, row in state.get("timing", {}).items():
            print(f"{k}: {row}")
    if args.stage in ("all", "timing"):
        best = args.config or state["tune"]["best"]
        timing = {}
        for k in (2, 4):
            params = {**GRID[best], "samples": k}
            timing[f"K{k}"] = _timing(args.scenario, params, refs, test_seeds(1)[0],
                                      args.timing_replans)
            print(f"K={k}: {timing[f'K{k}']}")
        state["timing"] = timing
        path.write_text(json.dumps(state, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
