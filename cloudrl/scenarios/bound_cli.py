"""``cloudrl scenarios bound``: the provable per-episode lower bound on a scenario's cost
(:mod:`cloudrl.mpc.bound`) beside the controllers' realised costs, seed by seed."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _fail(message: str) -> int:
    print(f"cloudrl: {message}", file=sys.stderr)
    return 2


def _cmd_bound(args: argparse.Namespace) -> int:
    import numpy as np

    from cloudrl.mpc.bound import episode_bound
    from cloudrl.protocol import seeds_for
    from cloudrl.scenarios.params import policy_params
    from cloudrl.scenarios.runner import ControllerSpec, run_controllers
    from envs.scenario.catalog import load_scenario

    if args.period_ticks is not None and not 1 <= args.period_ticks <= 1000:
        return _fail(f"--period-ticks {args.period_ticks}: expected 1..1000 ticks")
    try:
        seeds = list(seeds_for(args.split, args.n_seeds))
        params = policy_params(args.params) if args.params else {}
    except ValueError as e:
        return _fail(str(e))
    cfg = load_scenario(args.scenario)  # an unknown name: one line, exit 2 (cloudrl.cli)
    specs = [ControllerSpec("signal_aware", params.get("signal_aware", {}), "heuristic"),
             ControllerSpec("mpc", params.get("mpc", {}), "mpc"),
             ControllerSpec("oracle", params.get("oracle", {}), "oracle")]
    for spec in specs:
        try:
            spec.build()
        except (ValueError, TypeError) as e:
            return _fail(f"--params {spec.kind}: {e}")
    res = [] if args.bound_only else run_controllers(cfg, specs, seeds, args.workers)
    names = [] if args.bound_only else [s.name for s in specs]
    print(f"{cfg.name}: {args.n_seeds} {args.split} seeds, $ per episode; bound = max(per-job "
          f"relaxation, LP); tight = bound / best controller")
    head = f"{'seed':>8s} {'bound':>9s} {'relax':>9s} {'LP':>9s} {'floor':>8s} {'LP s':>6s}"
    head += "".join(f"{n:>10s}" for n in names) + ("   tight" if names else "")
    print(head)
    rows = []
    for k, seed in enumerate(seeds):
        b = episode_bound(cfg, seed, period_ticks=args.period_ticks)
        costs = {n: float(r[k]["cost_usd"]) for n, r in zip(names, res, strict=True)}
        tight = b.bound_usd / min(costs.values()) if costs else float("nan")
        rows.append({**b.to_json(), "costs": costs, "tight": tight})
        line = (f"{seed:8d} {b.bound_usd:9.3f} {b.relaxation_usd:9.3f} {b.lp_usd:9.3f} "
                f"{b.floor_usd:8.3f} {b.solve_s:6.1f}")
        line += "".join(f"{costs[n]:10.3f}" for n in names) + (f"  {tight:6.3f}" if names
                                                                 else "")
        print(line, flush=True)
    mean = {key: float(np.mean([r[key] for r in rows])) for key in
            ("bound_usd", "relaxation_usd", "lp_usd", "floor_usd", "solve_s")}
    line = (f"{'mean':>8s} {mean['bound_usd']:9.3f} {mean['relaxation_usd']:9.3f} "
            f"{mean['lp_usd']:9.3f} {mean['floor_usd']:8.3f} {mean['solve_s']:6.1f}")
    if names:
        means = {n: float(np.mean([r["costs"][n] for r in rows])) for n in names}
        line += "".join(f"{means[n]:10.3f}" for n in names)
        line += f"  {float(np.mean([r['tight'] for r in rows])):6.3f}"
        below = all(r["bound_usd"] <= min(r["costs"].values()) for r in rows)
        print(line)
        print(f"bound <= every controller on every seed: {'yes' if below else 'NO'}")
    else:
        print(line)
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"command": " ".join(["cloudrl", *sys.argv[1:]]),
                                   "scenario": cfg.name, "seeds": seeds, "per_seed": rows,
                                   "cpu_s": time.process_time()}, indent=2))
        print(f"wrote {out}")
    return 0


def add_bound_parser(ss: argparse._SubParsersAction) -> None:
    bd = ss.add_parser("bound", help="a provable lower bound on every policy's cost, per "
                                     "seed, beside the heuristic, the MPC and the oracle")
    bd.add_argument("--scenario", required=True)
    bd.add_argument("--n-seeds", type=int, default=10, help="seeds of the split (1..50)")
    bd.add_argument("--split", default="test", choices=("train", "validation", "test"))
    bd.add_argument("--params", help="the controllers' parameters: a JSON object or a file "
                                     "holding one (e.g. checkpoints/<scenario>/references.json)")
    bd.add_argument("--period-ticks", type=int, default=None,
                    help="the LP's period for long-window jobs (default: the decision period)")
    bd.add_argument("--bound-only", action="store_true", help="skip the controllers")
    bd.add_argument("--workers", type=int, default=None, help="worker processes for the "
                                                               "controllers")
    bd.add_argument("--json", help="write the per-seed rows to this path")
    bd.set_defaults(func=_cmd_bound)
