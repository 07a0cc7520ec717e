"""``cloudrl steer loop``: scripted operators label through the labelling app, a sequence
reward model per operator learns their trade-off, the heuristic and the MPC are steered on
it and measured under the hidden utilities (:mod:`cloudrl.steer.loop`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _cmd_loop(args: argparse.Namespace) -> int:
    from cloudrl.steer.loop import LoopConfig, steer_loop
    from cloudrl.steer.operators import OperatorSpec
    from envs.scenario.catalog import load_scenario

    try:
        ops = tuple(OperatorSpec.parse(s) for s in args.operators)
        kw = {k: getattr(args, k) for k in ("rounds", "pool_heuristic", "pool_mpc",
                                             "pool_seeds", "search_heuristic", "search_mpc",
                                             "val_seeds", "n_test_seeds", "members", "steps",
                                             "seed", "workers", "port", "out", "start",
                                             "pool_learned", "es_iterations", "es_pairs",
                                             "es_seeds", "es_lr", "es_sigma",
                                             "drift_threshold", "canary", "serve_port",
                                             "reference_dir", "site", "carbon_model")
              if getattr(args, k) is not None}
        if args.snapshots:
            kw["snapshots"] = tuple(args.snapshots)
        cfg = LoopConfig(scenario=args.scenario, operators=ops, comparisons=args.comparisons,
                         split=args.split, **kw)
        if cfg.site is None:
            load_scenario(cfg.scenario)
    except ValueError as e:
        print(f"cloudrl: steer loop: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    rep = steer_loop(cfg, log=lambda s: print(s, flush=True))
    print("\n" + rep["table"])
    print(json.dumps({"report": f"{cfg.out}/report.json",
                      "learner_saw_utilities": rep["learner_saw_utilities"]}))
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from cloudrl.steer.summary import load_reports, markdown, summarise

    try:
        reports = load_reports(args.reports)
    except ValueError as e:
        print(f"cloudrl: steer summary: {e}", file=sys.stderr)
        return 2
    summary = summarise(reports)
    print(markdown(summary))
    if args.json:
        from pathlib import Path

        Path(args.json).write_text(json.dumps(summary, indent=2, default=float))
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``steer loop`` to a CLI's subparsers."""
    st = subparsers.add_parser("steer", help="operators' own trade-offs: label over HTTP -> "
                                             "reward model -> steered heuristic and MPC")
    sub = st.add_subparsers(dest="steer_command", required=True)
    lp = sub.add_parser("loop", help="the whole loop in one command (a fresh store, the app "
                                     "on a free port, scripted operators)")
    lp.add_argument("--scenario", help="a scenario of the catalog (tiny, ...); every phase "
                                       "plays it, on its own seeds")
    lp.add_argument("--site", help="instead of --scenario: a real site (cloudrl sites list); "
                                   "pool, reward data and ES candidates play its train part, "
                                   "selection its validation part, the test its test part")
    lp.add_argument("--split", default="temporal", help="the site's split (default temporal)")
    lp.add_argument("--carbon-model", help="the site's carbon forecasts: gbt (default; fit "
                                           "on the train part) or seasonal_naive")
    lp.add_argument("--operators", nargs="+", required=True, metavar="SPEC",
                    help="NAME:UTILITY[:flip=0.1,temperature=0.05,equal=0.05,skip=0.05]; "
                         "UTILITY: lc_window | hour_carbon | toggle_cap | class_fairness | "
                         "smooth_controls, or A>B@0.5 (switches halfway: drift)")
    lp.add_argument("--comparisons", type=int, default=300,
                    help="labels per operator (<= 1000; skips count)")
    lp.add_argument("--rounds", type=int, help="labelling rounds; the reward models re-rank "
                                               "the open pairs between rounds (default 3)")
    lp.add_argument("--pool-heuristic", type=int, help="random heuristic points in the pool")
    lp.add_argument("--pool-mpc", type=int, help="MPC points in the pool (0: none)")
    lp.add_argument("--pool-seeds", type=int, help="train seeds per pool point")
    lp.add_argument("--search-heuristic", type=int, help="heuristic search points")
    lp.add_argument("--search-mpc", type=int, help="MPC search points (0: none)")
    lp.add_argument("--val-seeds", type=int, help="validation seeds of the search")
    lp.add_argument("--n-test-seeds", type=int, help="test seeds (<= 50)")
    lp.add_argument("--members", type=int, help="reward-model ensemble members (default 3)")
    lp.add_argument("--steps", type=int, help="Adam steps per reward-model fit (default 200)")
    lp.add_argument("--seed", type=int, help="run seed (pool, pairs, labels, init)")
    lp.add_argument("--workers", type=int, help="Ray workers recording episodes (default 1)")
    lp.add_argument("--port", type=int, help="the labelling app's port (default: a free one)")
    lp.add_argument("--out", help="report, labels and store (default results/steer/loop)")
    lp.add_argument("--start", help="a learned checkpoint of the scenario (e.g. "
                                    "checkpoints/steering/tiny_start): steered by ES on each "
                                    "operator's learned reward")
    lp.add_argument("--pool-learned", type=int, help="perturbed copies of --start in the pool "
                                                     "(default 4)")
    lp.add_argument("--es-iterations", type=int, help="ES iterations of a steering (default 8)")
    lp.add_argument("--es-pairs", type=int, help="antithetic pairs per ES iteration (default 3)")
    lp.add_argument("--es-seeds", type=int, help="train seeds per ES candidate (default 2)")
    lp.add_argument("--es-lr", type=float, help="ES Adam step size (default 0.01)")
    lp.add_argument("--es-sigma", type=float, help="ES perturbation scale (default 0.02)")
    lp.add_argument("--snapshots", type=int, nargs="+", metavar="N",
                    help="label counts whose reward models also steer the learned policy "
                         "(nested: e.g. 100 300 of --comparisons 1000)")
    lp.add_argument("--drift-threshold", type=float,
                    help="accuracy drop on the newest labels that retrains, at least 1.64 "
                         "standard errors (default 0.1; negative: retrain every operator)")
    lp.add_argument("--canary", metavar="OPERATOR",
                    help="register this operator's steered policy and roll it out as a canary "
                         "on the decision service (Ray Serve, real HTTP)")
    lp.add_argument("--serve-port", type=int, help="the decision service's port (default: a "
                                                   "free one in 8631-8639)")
    lp.add_argument("--reference-dir", help="cache of the hidden-tuned references (default "
                                            "OUT/reference)")
    lp.set_defaults(func=_cmd_loop)
    sm = sub.add_parser("summary", help="the steered rows of several loop reports (run seeds) "
                                        "per hidden utility, as markdown")
    sm.add_argument("reports", nargs="+", help="report.json files or the loops' --out dirs")
    sm.add_argument("--json", help="also write the rows here")
    sm.set_defaults(func=_cmd_summary)
    return st
