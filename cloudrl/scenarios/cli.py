"""``cloudrl scenarios``: list the named scenarios, evaluate controllers on one, measure
the headroom a forecast MPC and a clairvoyant oracle find over the tuned heuristic."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from envs.scenario.catalog import UnknownScenarioError, describe, load_scenario, scenario_names


def _cmd_list(args: argparse.Namespace) -> int:
    width = max(len(n) for n in scenario_names())
    for name, text in describe():
        print(f"{name:{width}s}  {text}")
    return 0


def _cmd_headroom(args: argparse.Namespace) -> int:
    from cloudrl.scenarios.headroom import format_rows, measure

    names = args.scenario or [n for n in scenario_names() if n != "tiny"]
    cfgs = [load_scenario(n) for n in names]  # unknown names fail before any work
    rows = []
    for cfg in cfgs:
        row = measure(cfg, n_seeds=args.n_seeds, tune_samples=args.tune_samples,
                      tune_seeds=args.tune_seeds, mpc_samples=args.mpc_samples,
                      workers=args.workers)
        rows.append(row)
        print(format_rows([row]).splitlines()[-1] if len(rows) > 1 else format_rows([row]),
              flush=True)
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"command": " ".join(["cloudrl", *sys.argv[1:]]),
                                   "scenarios": [r.to_json() for r in rows]}, indent=2))
        print(f"wrote {out}")
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import numpy as np

    from cloudrl.protocol import seeds_for
    from cloudrl.scenarios.runner import KINDS, ControllerSpec, run_controllers

    cfg = load_scenario(args.scenario)
    params = json.loads(args.params) if args.params else {}
    kinds = args.policy or ["signal_aware", "mpc", "oracle", "run_at_once"]
    for k in kinds:
        if k not in KINDS:
            raise UnknownScenarioError(f"--policy {k!r}: valid: {', '.join(KINDS)}")
    specs = [ControllerSpec(k, params.get(k, {})) for k in kinds]
    seeds = list(seeds_for(args.split, args.n_seeds))
    res = run_controllers(cfg, specs, seeds, args.workers)
    cols = ("cost_usd", "energy_usd", "carbon_usd", "sla_usd", "energy_kwh", "carbon_kg",
            "sla_lc", "sla_batch", "decide_ms")
    print(f"{cfg.name}: {args.n_seeds} {args.split} seeds, mean per episode")
    print(f"{'policy':14s}" + "".join(f"{c:>12s}" for c in cols))
    for spec, r in zip(specs, res, strict=True):
        print(f"{spec.name:14s}" + "".join(f"{np.mean([m[c] for m in r]):12.4f}" for c in cols))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    sc = sub.add_parser("scenarios", help="named scenarios with prices, carbon, solar, job "
                                          "classes and power states; their headroom")
    ss = sc.add_subparsers(dest="scenarios_cmd", required=True)
    ls = ss.add_parser("list", help="the named scenarios, one line each")
    ls.set_defaults(func=_cmd_list)
    hr = ss.add_parser("headroom", help="tuned heuristic vs forecast MPC vs clairvoyant oracle "
                                        "on the held-out test seeds")
    hr.add_argument("--scenario", action="append", help="a scenario name (repeatable; "
                                                        "default: all but 'tiny')")
    hr.add_argument("--n-seeds", type=int, default=50, help="test seeds (1..50)")
    hr.add_argument("--tune-samples", type=int, default=16,
                    help="random-search points for the heuristic (validation seeds)")
    hr.add_argument("--mpc-samples", type=int, default=4,
                    help="random-search points for the MPC (1: its defaults)")
    hr.add_argument("--tune-seeds", type=int, default=10, help="validation seeds for tuning")
    hr.add_argument("--workers", type=int, default=None, help="worker processes (default: CPUs)")
    hr.add_argument("--json", help="write the table as JSON to this path")
    hr.set_defaults(func=_cmd_headroom)
    ev = ss.add_parser("evaluate", help="controllers on one scenario, mean cost terms")
    ev.add_argument("--scenario", required=True)
    ev.add_argument("--policy", action="append",
                    help="signal_aware | mpc | oracle | run_at_once (repeatable; default all)")
    ev.add_argument("--params", help="JSON object: policy name -> its parameters")
    ev.add_argument("--split", default="test", choices=("train", "validation", "test"))
    ev.add_argument("--n-seeds", type=int, default=10)
    ev.add_argument("--workers", type=int, default=None)
    ev.set_defaults(func=_cmd_evaluate)
