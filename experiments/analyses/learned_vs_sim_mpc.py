"""The learned policy against the plant-true sim-MPC on more test seeds than the ladder's.

The yardstick ladder (``cloudrl scenarios yardstick``) plays 10 test seeds; on those the
interval of "learned minus sim-MPC" is too wide to show the goal (its upper end at most
+0.5% of the tuned heuristic's cost). This script plays the committed learned policy, the
tuned heuristic and the sim-MPC (the ladder's own tuned parameters, read from its JSON) on
the further test seeds ``--from .. --to`` (1,000,000 + i), joins them with the ladder's
seeds and prints the paired 95% t-interval over all of them, in dollars and in % of the
heuristic's mean cost, and whether the goal holds.

Run (about 40 s per sim-MPC episode on one core of the loaded 2-core machine)::

    python experiments/analyses/learned_vs_sim_mpc.py --scenario cold_standby \\
        --ladder docs/results/data/yardstick_cold_standby.json --from 10 --to 30 \\
        --workers 2 --json docs/results/data/learned_vs_sim_mpc_cold_standby.json

Bad input (a missing ladder, a ladder of another scenario, an empty seed range) is one line
on stderr and exit code 2.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from cloudrl.argparsing import CliParser

GOAL_PCT = 0.5  # the upper end of (learned - sim-MPC) at most this % of the heuristic's cost


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    p = CliParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", required=True)
    p.add_argument("--ladder", required=True, help="the scenario's yardstick JSON (with sim rows)")
    p.add_argument("--checkpoint", help="the learned policy (default: the ladder's)")
    p.add_argument("--from", dest="start", type=int, default=10, help="first extra test seed index")
    p.add_argument("--to", dest="stop", type=int, default=30, help="last extra index + 1 (<= 50)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--reuse", help="an earlier --json of this script on the same seeds: take its "
                                   "heuristic and sim-MPC costs, play only the learned policy "
                                   "(a re-published checkpoint)")
    p.add_argument("--json", help="write the per-seed costs and the interval here")
    p.add_argument("--headline-json", help="put the interval into the scenario's row of this "
                   "file (docs/results/headline.json) as diff_vs_sim_mpc_more_seeds")
    args = p.parse_args(argv)

    from cloudrl.protocol import test_seeds
    from cloudrl.scenarios.runner import ControllerSpec, paired_ci, run_controllers
    from cloudrl.scenarios.yardstick import SIM_MPC_TUNED
    from envs.scenario.catalog import load_scenario

    try:
        ladder = json.loads(Path(args.ladder).read_text())
    except (OSError, ValueError) as e:
        return _fail(f"--ladder {args.ladder}: {e}")
    if ladder.get("scenario") != args.scenario:
        return _fail(f"--ladder {args.ladder}: a ladder of {ladder.get('scenario')!r}, "
                     f"not {args.scenario!r}")
    if not 0 <= args.start < args.stop <= 50:
        return _fail(f"--from {args.start} --to {args.stop}: expected 0 <= from < to <= 50")
    by = {r["name"]: r for r in ladder["rows"]}
    if "sim-MPC" not in by or "learned" not in by:
        return _fail(f"--ladder {args.ladder}: no sim-MPC or learned row (run --measure sim)")
    checkpoint = args.checkpoint or ladder["checkpoint"]
    cfg = load_scenario(args.scenario)
    tuning = ladder["tuning"]
    sim_params = {**SIM_MPC_TUNED, **ladder["config"].get("sim_mpc", {}),
                  "mpc": tuning["fluid MPC"]["params"]}
    specs = [ControllerSpec("learned", {"checkpoint": checkpoint}, "learned"),
             ControllerSpec(tuning["heuristic"]["kind"], tuning["heuristic"]["params"],
                            "heuristic"),
             ControllerSpec("sim_mpc", sim_params, "sim-MPC")]
    seeds = list(test_seeds(50))[args.start:args.stop]
    old = [int(s) for s in ladder["seeds"]]
    if set(seeds) & set(old):
        return _fail(f"--from {args.start}: seeds overlap the ladder's {old[0]}..{old[-1]}")
    t0 = time.perf_counter()
    reused = {}
    if args.reuse:
        try:
            prev = json.loads(Path(args.reuse).read_text())
            idx = [prev["seeds"].index(s) for s in seeds]
            reused = {k: [prev["per_seed"][k][i] for i in idx] for k in ("heuristic", "sim-MPC")}
        except (OSError, ValueError, KeyError) as e:
            return _fail(f"--reuse {args.reuse}: not a run of this script on these seeds ({e})")
        specs = specs[:1]
    res = run_controllers(cfg, specs, seeds, args.workers, desc="learned vs sim-MPC")
    new = {s.name: [float(m["cost_usd"]) for m in rows] for s, rows in zip(specs, res,
                                                                           strict=True)}
    new.update(reused)
    allc = {k: np.array(by[k]["per_seed"] + new[k]) for k in new}
    d, lo, hi = paired_ci(allc["learned"], allc["sim-MPC"])
    base = float(allc["heuristic"].mean())
    goal = hi <= GOAL_PCT / 100 * base
    n = len(old) + len(seeds)
    print(f"{args.scenario}: {n} test seeds ({len(old)} of the ladder + {len(seeds)} new); "
          f"$ per episode")
    for k, v in allc.items():
        print(f"  {k:10s} {v.mean():8.2f}")
    print(f"learned - sim-MPC: {d:+.2f} $ [{lo:+.2f}, {hi:+.2f}] = {100 * d / base:+.2f}% "
          f"[{100 * lo / base:+.2f}, {100 * hi / base:+.2f}] of the heuristic; lower on "
          f"{int((allc['learned'] < allc['sim-MPC']).sum())} of {n} seeds")
    print(f"goal (upper end <= +{GOAL_PCT}% of the heuristic = {GOAL_PCT / 100 * base:.2f} $): "
          f"{'met' if goal else 'not met'}")
    if args.json:
        out = {"scenario": args.scenario, "checkpoint": checkpoint, "seeds": old + seeds,
               "per_seed": {k: v.tolist() for k, v in allc.items()},
               "learned_minus_sim_mpc_ci95": [d, lo, hi],
               "pct_of_heuristic_ci95": [100 * x / base for x in (d, lo, hi)],
               "goal_met": bool(goal), "sim_mpc": sim_params,
               "wall_s": time.perf_counter() - t0,
               "command": " ".join(["python", "experiments/analyses/learned_vs_sim_mpc.py",
                                    *(argv if argv is not None else sys.argv[1:])])}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    if args.headline_json:
        command = " ".join(["python", "experiments/analyses/learned_vs_sim_mpc.py",
                            *(argv if argv is not None else sys.argv[1:])])
        if not merge_headline(Path(args.headline_json), args.scenario, {
                "n_test_seeds": n, "ci95": [d, lo, hi],
                "pct_of_heuristic_ci95": [100 * x / base for x in (d, lo, hi)],
                "goal_met": bool(goal), "command": command}):
            return _fail(f"--headline-json {args.headline_json}: no row of {args.scenario}")
        print(f"updated {args.scenario}'s row of {args.headline_json}")
    return 0


def merge_headline(path: Path, scenario: str, more: dict) -> bool:
    """Set ``diff_vs_sim_mpc_more_seeds`` of ``scenario``'s row of ``path``; False if none."""
    data = json.loads(path.read_text())
    for row in data.get("scenarios", []):
        if row.get("scenario") == scenario:
            row["diff_vs_sim_mpc_more_seeds"] = more
            path.write_text(json.dumps(data, indent=2) + "\n")
            return True
    return False


if __name__ == "__main__":
    raise SystemExit(main())
