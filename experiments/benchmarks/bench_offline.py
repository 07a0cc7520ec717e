"""Offline constrained agent vs its baselines on one logged dataset.

What it does, per workload: records a dataset (the four heuristics, each as is and
ε-noised, on train seeds), derives the budget B (the best behaviour's mean episode
violations, at least 0.5) and, on that same data, RETRAINS every row each run:

* ``cql_lag`` at B and ``cql_lag_half`` at B/2: CQL on the reward head, cost critic,
  dual ascent on log λ, and BCQ's support filter (behaviour head cloned on the episodes
  within the budget, τ = 0.3);
* ``no_filter``: the same without the filter (τ = 0: the agent before this change);
* the source's three failure causes, one ablation each: ``abl_no_feasible`` (data without
  the best behaviour and without any episode within B), ``abl_cost_cql`` (CQL on the
  cost head too), ``abl_plain_dual`` (the source's raw dual ascent, no warm-up);
* RLlib's BC and MARWIL (masked PPO module) and OSRL's BC-Safe (BC on the episodes
  within B, ``bc_safe``; within B/2, ``bc_safe_half``);

then evaluates them with the heuristics (the best behaviour among them) on held-out test
seeds: reward and violations (mean ± 95% t-CI), normalised cost (violations / budget) and
the share of seeds within the budget with its 95% Wilson interval.

Run: ``python -m experiments.benchmarks.bench_offline --workloads poisson google_v2_like``
(results in ``results/bench_offline_<workload>_n<N>.json``).

At the goal's size (2026-11-23 23:32-23:49 UTC, ``--n-servers 50 --episode-length 1000
--n-seeds 50 --iterations 40 --epochs 4 --hidden 32``, one process per workload, 965-985 s
each): cql_lag -3,074 reward, 2.22 violations, 24% of seeds within B = 0.5 (poisson) and
-7,093, 74.4, 38% within B = 44 (google_v2_like); power_aware -2,269 / 0.16 / 84% and
-4,642 / 47.5 / 68%; BC -26,865 / 405 and -8,334 / 96; the source's CQL on the cost head
56.2 violations on poisson. Goal not met (README, "Offline constrained agent", has the
whole table).

Measured (2026-11-23, 10:43-10:52 UTC, both workloads in parallel, one process each, load
average 0-5 on the shared 2-core machine): ``--n-servers 15 --episode-length 200
--iterations 40 --epochs 4 --hidden 32 --n-seeds 20`` (defaults otherwise: lr 1e-3, γ 0.9,
τ_polyak 0.1, warm-up 150): 640 updates per cql_lag learner, 26-39 s each, BC/MARWIL
15-75 s; 421 s (google_v2_like) and 438 s (poisson) per workload, evaluation included.
Dataset per workload: 4 heuristics x ε in {0, 0.2, 0.5} x 3 train seeds = 36 episodes,
7,200 steps. Best behaviour: power_aware on both. Poisson: power_aware had 0 violations
on the train seeds -> B = 0.5 (the floor), B/2 = 0.25 (both mean: no violation at all);
14 episodes within B. google_v2_like: B = 17.67, B/2 = 8.83; 12 / 9 episodes within.

poisson, B = 0.5 (20 test seeds; reward, violations per 200-tick episode):

    policy              reward          violations    norm.cost  <= B [95% CI]
    cql_lag             -693.2 ±  56.5  1.95 ± 0.85     3.90      30% [15, 52]
    no_filter           -707.3 ±  58.3  2.15 ± 0.86     4.30      25% [11, 47]
    abl_cost_cql        -701.7 ±  56.0  2.15 ± 0.81     4.30      20% [ 8, 42]
    abl_plain_dual      -709.3 ±  53.8  2.20 ± 0.80     4.40      20% [ 8, 42]
    abl_no_feasible     -702.0 ±  85.4  2.20 ± 1.39     4.40      40% [22, 61]
    bc                  -738.4 ± 101.9  2.70 ± 1.59     5.40      40% [22, 61]
    marwil              -720.6 ±  82.9  2.40 ± 1.26     4.80      40% [22, 61]
    bc_safe             -867.4 ± 106.0  4.95 ± 1.62     9.90      10% [ 3, 30]
    power_aware (best)  -482.3 ±  25.2  0.05 ± 0.10     0.10      95% [76, 99]
    sjf                 -591.9 ±  17.9  0.15 ± 0.17     0.30      85% [64, 95]
    ffd                 -726.1 ±  64.8  2.35 ± 0.94     4.70      30% [15, 52]
    round_robin         -653.9 ±  78.2  1.50 ± 1.25     3.00      65% [43, 82]

poisson, B/2 = 0.25: cql_lag_half -758.0 ± 67.6, 3.00 violations, 5% [1, 24] within;
bc_safe_half -963.7, 5%; bc 40%, marwil 40%, power_aware 95% [76, 99].

google_v2_like, B = 17.67:

    policy              reward           violations     norm.cost  <= B [95% CI]
    cql_lag             -1050.2 ± 715.4   9.15 ± 11.68    0.52      95% [76, 99]
    no_filter           -1013.5 ± 695.1   8.55 ± 11.32    0.48      95% [76, 99]
    abl_cost_cql        -1041.7 ± 689.4   9.00 ± 11.26    0.51      95% [76, 99]
    abl_plain_dual      -1095.0 ± 720.8   9.85 ± 11.76    0.56      95% [76, 99]
    abl_no_feasible      -980.2 ± 714.6   7.90 ± 11.65    0.45      95% [76, 99]
    bc                  -1651.1 ± 1164.7 19.25 ± 19.27    1.09      85% [64, 95]
    marwil              -1001.0 ± 700.7   8.25 ± 11.42    0.47      95% [76, 99]
    bc_safe             -1796.1 ± 1111.4 21.75 ± 18.37    1.23      70% [48, 85]
    power_aware (best)   -668.9 ± 588.3   5.20 ±  9.47    0.29      95% [76, 99]
    sjf                  -874.5 ± 676.9   6.10 ± 11.03    0.35      95% [76, 99]

google_v2_like, B/2 = 8.83: cql_lag_half -1055.6 ± 702.1, 9.15 violations, norm. cost
1.04, 85% [64, 95] within; marwil 85%, bc 55%, bc_safe_half 30%, power_aware 95%.

Learner end values (per-step rates): poisson cql_lag cost estimate 0.0035 vs d = 0.0025,
λ 8.2 (rising: the constraint binds); abl_plain_dual λ 9.0, abl_no_feasible 13.4,
abl_cost_cql's estimate is NEGATIVE (-0.0048: CQL on the cost head pushes Q_c of the
policy's actions below 0, the source's optimistic cost) with λ 1.1. google_v2_like: the
estimates (0.027-0.046) sit far below d = 0.088, λ at its floor (0.002-0.008), except
abl_cost_cql (0.12, λ 0.29); abl_plain_dual's λ fell to its 1e-3 floor.

Goal (norm. cost <= 1 on >= 95% of seeds at both budgets, reward above the best behaviour
and BC): NOT met. cql_lag beats BC on both workloads (poisson -693 vs -738, google -1050
vs -1651) but no learner comes near power_aware (-482 / -669); on google_v2_like cql_lag
is within B on 95% of seeds (as are power_aware and MARWIL) but not at B/2 (85%). The
fix (BCQ filter on the safe episodes) does not separate from ``no_filter`` or from the
three ablations: all CIs overlap, so with this data and model size none of the source's
failure causes is what limits the agent. Diagnosis (N=15 poisson, 640 updates; and the
earlier N=5 checkpoint): (1) Q_r is over-estimated on the data actions by CQL's shift
(mean Q_r(s, a) +0.55 against a Monte-Carlo discounted return of -0.5 at N=5: with
reward_scale 0.01 the CQL term, of order α = 1, outweighs the reward differences between
actions); (2) the behaviour head cannot imitate the best behaviour: top-1 agreement with
power_aware's own actions on its train episodes is 30-52%, and the policy toggles
servers half as often (energy 9.6 vs 7.9 kWh) - RLlib's BC-Safe on the same module size
is worse still (-867). The limit is the fit of the policy class (hidden 32, 640
updates), not λ: the next step is a larger encoder and many more updates (CPU-bound
here: ~0.06 s per update at load 0, 0.35 s at load 10).

Branching interface (``--interface branching``; 2026-11-24, N=15, 200 ticks, 20 test
seeds, both workloads in parallel; the BC rows are the cql_lag module's behaviour head
alone, τ = 1, MARWIL left out). No behaviour in either dataset has a violation: B = 0.5.
Reward / violations / share within B / energy kWh:

    arm (updates)                    poisson                        google_v2_like
    cql_lag (640, hidden 32)         -586 ± 14  0.05  95%  9.72     -510 ± 27  0.00 100%  8.50
    bc (640)                         -586 ± 15  0.05  95%  9.71     -511 ± 28  0.00 100%  8.52
    abl_cost_cql (640)               -572 ± 13  0.00 100%  9.51     -521 ± 38  0.25  80%  8.34
    abl_plain_dual (640)             -584 ± 12  0.00 100%  9.74     -516 ± 31  0.10  90%  8.51
    cql_lag_top (3,200, hidden 64)   -496 ± 26  0.00 100%  8.19     -412 ± 46  0.15  90%  6.60
    pct_bc (3,200, hidden 64)        -485 ± 25  0.00 100%  7.97     -406 ± 70  0.50  80%  6.18
    power_aware                      -485 ± 27  0.10  90%  7.81     -355 ± 43  0.00 100%  5.89

(the 3,200-update rows: ``--iterations 200 --hidden 64 --arms pct_bc cql_lag_top``.) At 640
updates no learned row sleeps a server (the energy of sjf / ffd); with 5x the updates and
the behaviour head on the best quarter of the safe episodes they do, and %BC matches
power_aware on poisson. Goal still not met: no row above power_aware's reward.

Branching at the goal's size (N=50, 1,000 ticks, 50 test seeds, hidden 64; B = 0.5, no
violation in either dataset), reward / violations / within B / kWh:

    arm (updates)             poisson                         google_v2_like
    cql_lag_top (3,200)       -2911 ± 18  0.00 100% 159.9     -2116 ± 121 2.52  44% 107.7
    pct_bc (3,200)            -2776 ± 55  0.08  92% 151.7     -2028 ± 134 2.66  46% 102.3
    bc (3,200)                -2958 ± 18  0.00 100% 162.5     -2660 ±  58 0.00 100% 146.1
    abl_cost_cql (3,200)      -2954 ± 18  0.00 100% 162.3     -2602 ±  79 0.06  96% 142.2
    cql_lag_top (9,600)       -2577 ± 72  0.10  92% 139.6     -1870 ±  76 0.78  72%  99.8
    pct_bc (9,600)            -2416 ± 78  0.08  92% 130.3     -1871 ±  88 0.44  80% 100.9
    power_aware               -2266 ± 42  0.12  90% 121.0     -1759 ±  72 0.00 100%  96.2

(cql_lag_top_half at 3,200: -2800 ± 60, within B/2 on 98% of poisson seeds, 44% on
google_v2_like.) More updates close the gap to power_aware from below; none passes it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from cloudrl.argparsing import CliParser
from cloudrl.data.offline import DatasetError, read_dataset
from cloudrl.offline.config import OfflineConfig
from cloudrl.offline.dataset import format_summary, record_dataset, subset_dataset, summarize
from cloudrl.offline.evaluation import evaluate, format_rows
from cloudrl.offline.train import dataset_budget, train

HEURISTICS = ["power_aware", "sjf", "ffd", "round_robin"]
TOP = 0.25  # support_top of the %BC arms
BEST = "power_aware"  # the best behaviour on every dataset this script records (checked)

# arm -> (dataset, budget fraction, train overrides); every arm is retrained each run
ARMS: dict[str, tuple[str, float, dict[str, Any]]] = {
    "cql_lag": ("data", 1.0, {}),
    "cql_lag_half": ("data", 0.5, {}),
    "no_filter": ("data", 1.0, {"support_threshold": 0.0}),  # the agent before the fix
    "abl_cost_cql": ("data", 1.0, {"cql_cost_alpha": 1.0}),  # cause 2: CQL on cost
    "abl_plain_dual": ("data", 1.0, {"lagrange_mode": "plain", "lagrange_warmup": 0,
                                     "lagrange_lr": 2.0}),  # cause 3: raw dual ascent
    "abl_no_feasible": ("infeasible", 1.0, {}),  # cause 1: no feasible behaviour
    "bc": ("data", 1.0, {"algo": "bc"}),
    "marwil": ("data", 1.0, {"algo": "marwil"}),
    "bc_safe": ("safe", 1.0, {"algo": "bc"}),  # OSRL's BC-Safe: BC on episodes <= B
    "bc_safe_half": ("safe_half", 0.5, {"algo": "bc"}),
    # the behaviour head on the top quarter of the safe episodes by return (%BC as BCQ's
    # generative model), with the Q heads choosing among its supported actions ...
    "cql_lag_top": ("data", 1.0, {"support_top": TOP}),
    "cql_lag_top_half": ("data", 0.5, {"support_top": TOP}),
    # ... and alone (τ = 1: %BC of Chen et al. 2021 on the safe episodes)
    "pct_bc": ("data", 1.0, {"support_top": TOP, "support_threshold": 1.0}),
}


# On the branching interface RLlib's BC / MARWIL (flat masked PPO module) do not apply:
# the cloners there are the cql_lag module's own behaviour head acting alone (τ = 1: only
# each branch's most likely sub-action), trained on the same data; MARWIL is left out.
BRANCHING_CLONE = {"algo": "cql_lag", "support_threshold": 1.0, "support_data": "all"}


def arm_overrides(arm: str, interface: str) -> dict[str, Any] | None:
    """The arm's train overrides on ``interface`` (None: the arm does not apply)."""
    over = ARMS[arm][2]
    if interface == "flat" or over.get("algo") not in ("bc", "marwil"):
        return over
    return None if arm == "marwil" else BRANCHING_CLONE


def datasets(root: Path, budget: float) -> dict[str, Path | None]:
    """The full dataset and its subsets (None where a subset is empty)."""
    out: dict[str, Path | None] = {"data": root / "data"}
    for name, kw in (("safe", {"max_cost": budget}), ("safe_half", {"max_cost": budget / 2}),
                     ("infeasible", {"min_cost": budget + 1e-6, "drop_behaviours": [BEST]})):
        path = root / f"data_{name}"
        if not path.exists():
            try:
                summary = subset_dataset(root / "data", path, **kw)
            except DatasetError as exc:
                print(f"subset {name}: {exc}", flush=True)
                out[name] = None
                continue
        else:
            summary = summarize(read_dataset(path))
        print(f"subset {name}: {summary['episodes']} episodes, behaviours "
              f"{[r['policy'] for r in summary['behaviours']]}", flush=True)
        out[name] = path
    return out


def run_workload(args: argparse.Namespace, workload: str) -> dict[str, Any]:
    t0 = time.time()
    tag = f"{workload}_n{args.n_servers}" + ("" if args.interface == "flat" else
                                             f"_{args.interface}")
    root = Path(args.out) / tag
    env = {"n_servers": args.n_servers, "workload": {"kind": workload},
           "sim": {"episode_length": args.episode_length}}
    if not (root / "data").exists():
        record_dataset(root / "data", HEURISTICS, env_config=env, episodes=args.episodes,
                       epsilons=args.epsilons, interface=args.interface)
    summary = summarize(read_dataset(root / "data"))
    print(format_summary(summary), flush=True)
    plain = [r for r in summary["behaviours"] if "+eps" not in r["policy"]]
    best = max(plain, key=lambda r: r["mean_return"])["policy"]
    budget = dataset_budget(summary)
    print(f"{workload}: best behaviour {best}, budget B = {budget:g}", flush=True)
    data = datasets(root, budget)
    base = {"iterations": args.iterations, "hidden": args.hidden, "budget": budget,
            "train_batch_size": args.batch, "num_epochs": args.epochs, "gamma": args.gamma,
            "tau": args.tau, "lagrange_warmup": args.warmup, "lr": args.lr}
    report: dict[str, Any] = {"workload": workload, "interface": args.interface,
                              "dataset": summary, "budget": budget,
                              "best_behaviour": best, "arms": {}, "tables": {}}
    specs: dict[str, str] = {}
    for arm in args.arms:
        source, fraction, _ = ARMS[arm]
        over = arm_overrides(arm, args.interface)
        if over is None:
            print(f"{arm}: skipped (not on the {args.interface} interface)", flush=True)
            continue
        if data.get(source) is None:
            print(f"{arm}: skipped (no {source} episodes)", flush=True)
            continue
        t = time.time()
        cfg = OfflineConfig.model_validate({"env": env, "mlflow": False, "train": {
            **base, "data": str(data[source]), "budget_fraction": fraction, **over,
            "out": str(root / arm)}})
        ck, metrics, b = train(cfg)
        specs[arm] = str(ck)
        report["arms"][arm] = {"budget": b, "seconds": round(time.time() - t),
                               "last_metrics": metrics, "data": source}
        print(f"{arm}: trained in {time.time() - t:.0f} s, budget {b:g}, last metrics "
              f"{json.dumps({k: round(v, 4) for k, v in metrics.items()})}", flush=True)
    names = list(specs) + HEURISTICS
    t = time.time()
    rows = evaluate(list(specs.values()) + HEURISTICS, OfflineConfig.model_validate(
        {"env": env}).env, budget, args.n_seeds, names=names, keep_costs=True,
        interface=args.interface)
    report["eval_seconds"] = round(time.time() - t)
    for fraction in (1.0, 0.5):
        b = budget * fraction
        table = [renormalise(r, b) for r in rows if shown_at(r["policy"], fraction)]
        print(format_rows(table, b), flush=True)
        report["tables"][f"{b:g}"] = table
    report["seconds"] = round(time.time() - t0)
    return report


def shown_at(name: str, fraction: float) -> bool:
    """Heuristics, BC and MARWIL (no budget) in both tables; a budgeted arm in its own."""
    if name not in ARMS or name in ("bc", "marwil"):
        return True
    return ARMS[name][1] == fraction


def renormalise(row: dict[str, Any], budget: float) -> dict[str, Any]:
    """``row`` with normalised cost and the within-budget share for ``budget``."""
    from cloudrl.offline.evaluation import within_budget

    return {**row, "normalized_cost": row["cost"] / budget,
            "within_budget": within_budget(row["costs"], budget),
            "within_budget_ci": within_budget(row["costs"], budget, ci=True)}


def main(argv: list[str] | None = None) -> int:
    p = CliParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", nargs="+", default=["poisson"],
                   choices=("poisson", "google_v2_like"))
    p.add_argument("--n-servers", type=int, default=15)
    p.add_argument("--episode-length", type=int, default=200)
    p.add_argument("--episodes", type=int, default=3, help="per (policy, ε)")
    p.add_argument("--epsilons", type=float, nargs="+", default=[0.0, 0.2, 0.5])
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--epochs", type=int, default=4, help="passes over each sampled batch")
    p.add_argument("--n-seeds", type=int, default=20)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch", type=int, default=1024, help="transitions per iteration")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--tau", type=float, default=0.1, help="Polyak rate of the target nets")
    p.add_argument("--warmup", type=int, default=150, help="updates with λ frozen")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--interface", choices=("flat", "branching"), default="flat",
                   help="branching: the per-branch agent; BC rows are its behaviour head "
                   "alone (τ = 1), no MARWIL")
    p.add_argument("--out", default="results/bench_offline")
    args = p.parse_args(argv)
    for workload in args.workloads:
        report = run_workload(args, workload)
        suffix = "" if args.interface == "flat" else f"_{args.interface}"
        out = Path(f"results/bench_offline_{workload}_n{args.n_servers}{suffix}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {out} in {report['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
