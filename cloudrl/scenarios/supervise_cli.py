"""``cloudrl scenarios supervise``: a hierarchical supervisor over cost-, SLA- and
signal-specialised sub-agents and the forecast MPC (cloudrl/scenarios/supervisor.py): the
greedy hindsight ceiling, then the learned supervisor, against the tuned heuristic and the
MPC on the test seeds, paired by seed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _cmd_supervise(args: argparse.Namespace) -> int:
    from cloudrl.scenarios.supervisor import SuperviseConfig, supervise
    from envs.scenario.catalog import load_scenario

    try:
        sc = SuperviseConfig(scenario=args.scenario, seg_hours=args.segment_hours,
                             lookahead=args.lookahead, n_test_seeds=args.n_seeds,
                             n_train_seeds=args.train_seeds,
                             run_seeds=tuple(args.run_seed) if args.run_seed else (0, 1, 2),
                             dagger=args.dagger, workers=args.workers)
    except ValueError as e:
        print(f"cloudrl: supervise: {e}", file=sys.stderr)
        return 2
    cfg = load_scenario(args.scenario)  # an unknown name: one line, exit 2 (cloudrl.cli)
    res = supervise(cfg, sc, log=lambda s: print(s, flush=True))
    print("\n" + res.table)
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"command": " ".join(["cloudrl", *sys.argv[1:]]), "scenario": cfg.name,
               **res.to_json()}
        out.write_text(json.dumps(doc, indent=2, default=float))
        print(f"wrote {out}")
    return 0


def add_supervise_parser(ss: argparse._SubParsersAction) -> None:
    sp = ss.add_parser("supervise", help="hierarchical supervisor over specialised sub-agents: "
                                         "the hindsight ceiling and a learned supervisor vs the "
                                         "tuned heuristic and the MPC")
    sp.add_argument("--scenario", required=True)
    sp.add_argument("--segment-hours", type=float, default=4.0,
                    help="hours between supervisor choices (rounded to decision periods)")
    sp.add_argument("--lookahead", default="rollout", choices=("rollout", "segment"),
                    help="ceiling score: the segment's cost plus the tuned heuristic to the "
                         "episode's end (rollout), or the segment's cost alone (segment)")
    sp.add_argument("--n-seeds", type=int, default=10, help="test seeds (1..50)")
    sp.add_argument("--train-seeds", type=int, default=20,
                    help="train seeds whose hindsight choices label the classifier (1..50)")
    sp.add_argument("--run-seed", type=int, nargs="+",
                    help="training run seeds of the learned supervisor (default 0 1 2); the "
                         "median by test cost is claimed")
    sp.add_argument("--dagger", action="store_true",
                    help="one DAgger round: relabel the learned supervisor's own train episodes")
    sp.add_argument("--workers", type=int, help="worker processes (default: CPUs)")
    sp.add_argument("--json", help="write the table and per-seed metrics to this path")
    sp.set_defaults(func=_cmd_supervise)
