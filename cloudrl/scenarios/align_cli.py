"""``cloudrl scenarios align``: the RLHF phases on a scenario with a scripted teacher that
ranks by cost and per-class safety bounds (cloudrl/scenarios/align.py): BC from the
heuristic, a reward model and an alignment head from at most 1,000 ranked pairs, evolution
strategies on the learned reward; the table under the teacher's utility on the test seeds."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cmd_align(args: argparse.Namespace) -> int:
    from cloudrl.scenarios.align import AlignConfig, align
    from envs.scenario.catalog import load_scenario

    try:
        kw = {k: getattr(args, k) for k in ("n_test_seeds", "bc_expert_seeds", "bc_epochs",
                                             "bc_dagger_rounds", "es_iterations",
                                             "val_seeds", "head_weight",
                                             "lc_bound", "batch_bound",
                                             "pool_heuristic", "pool_mpc", "pool_seeds",
                                             "workers", "out")
              if getattr(args, k) is not None}
        cfg = AlignConfig(scenario=args.scenario, n_comparisons=args.comparisons,
                          noise=args.noise,
                          run_seeds=tuple(args.run_seed) if args.run_seed else (0, 1, 2),
                          cache=None if args.no_cache else args.cache, **kw)
    except ValueError as e:
        print(f"cloudrl: align: {e}", file=sys.stderr)
        return 2
    scn = load_scenario(args.scenario)  # an unknown name: one line, exit 2 (cloudrl.cli)
    res = align(scn, cfg, log=lambda s: print(s, flush=True))
    print("\n" + res.table)
    from cloudrl.scenarios.steer_cli import write_json

    write_json(args.json, res.to_json())
    return 0


def _cmd_align_reserve(args: argparse.Namespace) -> int:
    from cloudrl.scenarios.reserve_head import ReserveHeadConfig, align_reserve, write_result
    from envs.scenario.catalog import load_scenario

    scn = load_scenario(args.scenario)  # an unknown name: one line, exit 2 (cloudrl.cli)
    try:
        kw = {k: getattr(args, k) for k in ("n_val_seeds", "n_test_seeds", "head_weight",
                                             "lc_bound", "batch_bound", "pool_heuristic",
                                             "pool_mpc", "pool_seeds", "workers")
              if getattr(args, k) is not None}
        if args.grid is not None:
            kw["grid"] = tuple(args.grid)
        if args.checkpoint is not None and not Path(args.checkpoint).is_dir():
            raise ValueError(f"--checkpoint {args.checkpoint}: not a directory")
        cfg = ReserveHeadConfig(scenario=args.scenario, checkpoint=args.checkpoint,
                                n_comparisons=args.comparisons, noise=args.noise,
                                run_seeds=tuple(args.run_seed) if args.run_seed else (0, 1, 2),
                                cache=None if args.no_cache else args.cache, **kw)
        from cloudrl.scenarios.reserve_head import policy_spec, with_reserve

        for r in cfg.grid:
            with_reserve(scn, r)
        policy_spec(scn, cfg)
    except (ValueError, TypeError) as e:
        print(f"cloudrl: align-reserve: {e}", file=sys.stderr)
        return 2
    res = align_reserve(scn, cfg, log=lambda s: print(s, flush=True))
    print("\n" + res.table)
    write_result(args.json, res)
    return 0


def _add_label_args(p: argparse.ArgumentParser, seeds_for: str) -> None:
    """The labelling arguments ``align`` and ``align-reserve`` share."""
    p.add_argument("--scenario", required=True)
    p.add_argument("--comparisons", type=int, default=1000, help="labelled pairs (<= 1000)")
    p.add_argument("--noise", type=float, default=0.1, help="share of labels flipped")
    p.add_argument("--run-seed", type=int, nargs="+",
                   help=f"run seeds (comparisons, label noise, reward model, {seeds_for}; "
                        f"default 0 1 2)")
    p.add_argument("--n-test-seeds", type=int, help="test seeds (1..50; default 50)")
    p.add_argument("--head-weight", type=float,
                   help="weight of the alignment head in the objective (default 1)")
    p.add_argument("--lc-bound", type=float,
                   help="the teacher's latency-critical bound, a violation rate (default "
                        "0.0003 = 0.03%%)")
    p.add_argument("--batch-bound", type=float,
                   help="the teacher's batch bound, a violation rate (default 0.003 = 0.3%%)")
    p.add_argument("--pool-heuristic", type=int, help="random heuristic points in the pool")
    p.add_argument("--pool-mpc", type=int, help="random MPC points in the pool")
    p.add_argument("--pool-seeds", type=int, help="train seeds per pool point")
    p.add_argument("--workers", type=int, help="worker processes (default: CPUs)")
    p.add_argument("--cache", default="results/steer/episodes.json",
                   help="episode cache (JSON), shared with steer")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
    p.add_argument("--json", help="write the table and every run to this path")


def add_align_parser(ss: argparse._SubParsersAction) -> None:
    al = ss.add_parser("align", help="RLHF phases with a safety-bound teacher: BC from the "
                                     "heuristic, reward model + alignment head from ranked "
                                     "pairs, evolution strategies on the learned reward")
    _add_label_args(al, "ES; the median is claimed")
    al.add_argument("--bc-expert-seeds", type=int,
                    help="train seeds the heuristic demonstrates for BC (default 20)")
    al.add_argument("--bc-epochs", type=int, help="BC epochs (default 60)")
    al.add_argument("--bc-dagger-rounds", type=int,
                    help="DAgger rounds of BC: the heuristic labels the states its clone "
                         "reaches, 4 train seeds a round (default 0)")
    al.add_argument("--es-iterations", type=int,
                    help="evolution-strategies iterations per search (default 15)")
    al.add_argument("--val-seeds", type=int,
                    help="validation seeds that pick each search's kept iteration (default 8)")
    al.add_argument("--out", help="where the checkpoints go (default: results/align)")
    al.set_defaults(func=_cmd_align)

    ar = ss.add_parser("align-reserve",
                       help="the alignment head on the executor's reserve for large "
                            "latency-critical jobs: labels, reward model and head as in "
                            "'align', the reserve they prefer for a policy picked on "
                            "validation seeds, tested against the policy without it")
    _add_label_args(ar, "head")
    ar.add_argument("--checkpoint", help="the policy: a scenario checkpoint (e.g. "
                                         "checkpoints/NAME); default: the tuned heuristic")
    ar.add_argument("--grid", type=float, nargs="+",
                    help="reserves to choose from, in cores (default 0 16 24 32 40 48; 0 is "
                         "always a candidate)")
    ar.add_argument("--n-val-seeds", type=int, help="validation seeds (1..50; default 30)")
    ar.set_defaults(func=_cmd_align_reserve)
