"""``cloudrl scenarios steer``: a scripted operator's preferences tune the heuristic and the
MPC through a learned reward (cloudrl/scenarios/steering.py); the table under its hidden
utility on the test seeds."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _cmd_steer(args: argparse.Namespace) -> int:
    from envs.scenario.catalog import load_scenario

    try:
        run_seeds = tuple(args.run_seed) if args.run_seed else (0, 1, 2)
        kw = {k: getattr(args, k) for k in ("pool_heuristic", "pool_mpc", "pool_seeds",
                                             "tune_heuristic", "tune_mpc", "tune_seeds",
                                             "workers", "init_checkpoint", "learned_out",
                                             "learned_expert_seeds", "learned_rounds",
                                             "learned_round_seeds", "learned_val_seeds",
                                             "learned_method", "learned_es_iterations",
                                             "learned_es_params")
              if getattr(args, k) is not None}
        from cloudrl.scenarios.steering import SteerConfig

        cfg = SteerConfig(scenario=args.scenario, utility=args.utility,
                          n_comparisons=args.comparisons, noise=args.noise,
                          run_seeds=run_seeds, n_test_seeds=args.n_test_seeds,
                          cache=None if args.no_cache else args.cache, learned=args.learned,
                          **kw)
    except ValueError as e:
        print(f"cloudrl: steer: {e}", file=sys.stderr)
        return 2
    scn = load_scenario(args.scenario)  # an unknown name: one line, exit 2 (cloudrl.cli)
    from cloudrl.scenarios.steering import steer

    try:
        res = steer(scn, cfg)
    except ValueError as e:  # e.g. --learned without a checkpoint to start from
        print(f"cloudrl: steer: {e}", file=sys.stderr)
        return 2
    print("\n" + res.table)
    write_json(args.json, res.to_json())
    return 0


def write_json(path: str | None, doc: dict) -> None:
    """Write ``doc`` with the command line that made it to ``path`` (nothing if None)."""
    if path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"command": " ".join(["cloudrl", *sys.argv[1:]]), **doc},
                                  indent=2, default=float))
        print(f"wrote {out}")


def add_steer_parser(ss: argparse._SubParsersAction) -> None:
    st = ss.add_parser("steer", help="a scripted operator's pairwise preferences -> a learned "
                                     "reward -> the heuristic and the MPC tuned on it")
    st.add_argument("--scenario", required=True)
    st.add_argument("--utility", required=True,
                    help="the operator's hidden utility: lc_guard | green_wear | sla_first | "
                         "safe_cost")
    st.add_argument("--comparisons", type=int, default=1000, help="labelled pairs (<= 1000)")
    st.add_argument("--noise", type=float, default=0.1, help="share of labels flipped")
    st.add_argument("--run-seed", type=int, nargs="+",
                    help="run seeds (comparisons, label noise, reward-model init; default "
                         "0 1 2); the median is claimed")
    st.add_argument("--n-test-seeds", type=int, default=50, help="test seeds (1..50)")
    st.add_argument("--pool-heuristic", type=int, help="random heuristic points in the pool")
    st.add_argument("--pool-mpc", type=int, help="random MPC points in the pool")
    st.add_argument("--pool-seeds", type=int, help="train seeds per pool point")
    st.add_argument("--tune-heuristic", type=int, help="heuristic search points")
    st.add_argument("--tune-mpc", type=int, help="MPC search points")
    st.add_argument("--tune-seeds", type=int, help="validation seeds for the search")
    st.add_argument("--workers", type=int, help="worker processes (default: CPUs)")
    st.add_argument("--learned", action="store_true",
                    help="also steer the learned family: DAgger fine-tunes of "
                         "--init-checkpoint towards the steered heuristic or MPC, kept by the "
                         "learned reward")
    st.add_argument("--init-checkpoint",
                    help="the learned checkpoint to fine-tune (default: checkpoints/SCENARIO)")
    st.add_argument("--learned-out", help="where the fine-tuned checkpoints go "
                                          "(default: results/steer/learned)")
    st.add_argument("--learned-expert-seeds", type=int,
                    help="train seeds the steered teacher demonstrates (default 10)")
    st.add_argument("--learned-rounds", type=int, help="DAgger rounds (default 2)")
    st.add_argument("--learned-round-seeds", type=int, help="train seeds per round (default 4)")
    st.add_argument("--learned-val-seeds", type=int,
                    help="validation seeds that pick the round kept (default 8)")
    st.add_argument("--learned-method", choices=("dagger", "es"),
                    help="dagger (towards the steered teacher; default) or es (evolution "
                         "strategies on the learned reward itself)")
    st.add_argument("--learned-es-iterations", type=int,
                    help="evolution-strategies iterations per fine-tune (default 15)")
    st.add_argument("--learned-es-params", choices=("head", "all"),
                    help="es: search the output layer (head; default) or every weight (all)")
    st.add_argument("--cache", default="results/steer/episodes.json",
                    help="episode cache (JSON), shared across utilities and run seeds")
    st.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
    st.add_argument("--json", help="write the table and every choice to this path")
    st.set_defaults(func=_cmd_steer)
