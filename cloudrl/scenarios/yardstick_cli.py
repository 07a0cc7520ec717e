"""``cloudrl scenarios yardstick``: the ladder of :mod:`cloudrl.scenarios.yardstick` (bound,
hindsight oracle, sim-MPC, fluid MPC and oracle, tuned rules, the learned policy) on one
scenario, as a table with cost terms and a JSON file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _fail(message: str) -> int:
    print(f"cloudrl: {message}", file=sys.stderr)
    return 2


def _json_arg(text: str, flag: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag}: not a JSON object ({e.msg}, column {e.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag}: expected a JSON object, got {text[:40]}")
    return value


def _bound_from(path: str, seeds: list[int]) -> list[float]:
    """The per-seed bounds a ``cloudrl scenarios bound --json`` run wrote, for ``seeds``."""
    try:
        data = json.loads(Path(path).read_text())
        by_seed = {int(r["seed"]): float(r["bound_usd"]) for r in data["per_seed"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--bound-from {path}: not a 'cloudrl scenarios bound --json' file "
                         f"({type(e).__name__}: {e})") from None
    missing = [s for s in seeds if s not in by_seed]
    if missing:
        raise ValueError(f"--bound-from {path}: no bound for test seed(s) {missing[:3]}")
    return [by_seed[s] for s in seeds]


def _cmd_yardstick(args: argparse.Namespace) -> int:
    from cloudrl.protocol import test_seeds
    from cloudrl.scenarios.runner import ControllerSpec, checkpoint_kind
    from cloudrl.scenarios.yardstick import YardstickConfig, format_markdown, measure
    from envs.scenario.catalog import load_scenario

    if not 2 <= args.n_seeds <= 50:
        return _fail(f"--n-seeds {args.n_seeds}: expected 2..50 test seeds")
    if not 1 <= args.tune_samples <= 200 or not 1 <= args.tune_seeds <= 50:
        return _fail("--tune-samples expects 1..200 points and --tune-seeds 1..50 seeds")
    try:
        sim_mpc = _json_arg(args.sim_mpc, "--sim-mpc")
        hindsight = _json_arg(args.hindsight, "--hindsight")
        if args.checkpoint:
            checkpoint_kind(args.checkpoint)
        bound = (_bound_from(args.bound_from, list(test_seeds(args.n_seeds)))
                 if args.bound_from else None)
    except ValueError as e:
        return _fail(str(e))
    cfg = load_scenario(args.scenario)  # an unknown name: one line, exit 2 (cloudrl.cli)
    yc = YardstickConfig(n_seeds=args.n_seeds, tune_samples=args.tune_samples,
                         tune_seeds=args.tune_seeds, sim_mpc=sim_mpc, hindsight=hindsight,
                         workers=args.workers, bound=bound is None and not args.no_bound,
                         sim=not args.no_sim)
    if args.from_json:
        try:
            out = json.loads(Path(args.from_json).read_text())
        except (OSError, ValueError) as e:
            return _fail(f"--from-json {args.from_json}: {e}")
        if out.get("scenario") != cfg.name:
            return _fail(f"--from-json {args.from_json}: a ladder of {out.get('scenario')!r},"
                         f" not {cfg.name!r}")
        if args.measure:
            from cloudrl.scenarios.yardstick import measure_rows, sim_specs

            specs = []
            if "sim" in args.measure:
                specs += sim_specs(cfg, yc, out["tuning"]["fluid MPC"]["params"])
            if "learned" in args.measure:
                if not args.checkpoint:
                    return _fail("--measure learned needs --checkpoint DIR")
                specs.append((cfg, ControllerSpec(checkpoint_kind(args.checkpoint),
                                                  {"checkpoint": args.checkpoint}, "learned")))
                out["checkpoint"] = args.checkpoint
            measure_rows(cfg, out, specs, args.workers)
            out.setdefault("commands", []).append(" ".join(["cloudrl", *sys.argv[1:]]))
    elif args.measure:
        return _fail("--measure adds rows to a ladder: it needs --from-json FILE")
    else:
        out = measure(cfg, args.checkpoint, yc, log=lambda s: print(s, flush=True))
        out["command"] = " ".join(["cloudrl", *sys.argv[1:]])
    if args.sim_from:
        from cloudrl.scenarios.yardstick import attach_sim

        try:
            attach_sim(out, json.loads(Path(args.sim_from).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            return _fail(f"--sim-from {args.sim_from}: {type(e).__name__}: {e}")
    if bound is not None:
        from cloudrl.scenarios.yardstick import attach_bound

        attach_bound(out, bound)
    print(f"\n{cfg.name}: {out['n_test_seeds']} test seeds, $ per episode, paired by seed")
    print(format_markdown(out))
    if out["bound_below_every_controller"] is not None:
        print(f"bound below every controller on every seed: "
              f"{'yes' if out['bound_below_every_controller'] else 'NO'}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    if args.headline_json:
        from cloudrl.scenarios.yardstick import merge_into_headline

        if not merge_into_headline(args.headline_json, out):
            return _fail(f"--headline-json {args.headline_json}: no row for {cfg.name}")
        print(f"added the ladder to {cfg.name}'s row of {args.headline_json}")
    return 0


def add_yardstick_parser(ss: argparse._SubParsersAction) -> None:
    p = ss.add_parser("yardstick", help="one scenario's ladder: lower bound, hindsight "
                                        "oracle, sim-MPC, fluid MPC and oracle, the tuned "
                                        "rules (equal menus and budgets) and the learned "
                                        "policy, with cost terms")
    p.add_argument("--scenario", required=True)
    p.add_argument("--checkpoint", help="the learned policy to place on the ladder")
    p.add_argument("--n-seeds", type=int, default=10, help="test seeds (2..50)")
    p.add_argument("--tune-samples", type=int, default=16,
                   help="points per tuned family, the same for every family")
    p.add_argument("--tune-seeds", type=int, default=8, help="validation seeds for tuning")
    p.add_argument("--sim-mpc", default="{}", help="the sim-MPC's knobs, a JSON object "
                                                   "(SimMPCConfig keys over the tuned ones)")
    p.add_argument("--hindsight", default="{}", help="the hindsight oracle's knobs, a JSON "
                                                     "object (over its search budget)")
    p.add_argument("--bound-from", help="reuse the per-seed bounds of a 'cloudrl scenarios "
                                        "bound --json' file")
    p.add_argument("--no-bound", action="store_true", help="skip the lower bound")
    p.add_argument("--no-sim", action="store_true", help="skip the sim-MPC rows")
    p.add_argument("--workers", type=int, default=None, help="Ray workers (default: CPUs)")
    p.add_argument("--json", help="write the ladder as JSON to this path")
    p.add_argument("--from-json", help="do not measure: read a ladder this command wrote")
    p.add_argument("--measure", nargs="+", choices=("sim", "learned"),
                   help="with --from-json: measure these rows on the ladder's seeds and put "
                        "them in (sim: the sim-MPC, with perfect forecasts, and the hindsight "
                        "oracle; learned: --checkpoint again)")
    p.add_argument("--sim-from", help="add the sim-MPC and hindsight rows of an "
                                      "experiments/benchmarks/bench_sim_mpc.py results.json "
                                      "(the same test seeds)")
    p.add_argument("--headline-json", help="add the ladder's fields to the scenario's row of "
                                           "this file (docs/results/headline.json)")
    p.set_defaults(func=_cmd_yardstick)
