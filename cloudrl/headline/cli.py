"""Command line of the headline result: ``cloudrl tune-heuristic`` and ``cloudrl headline``."""

from __future__ import annotations

import argparse
from typing import Any

from cloudrl.config_loader import load_config

_SYNTHETIC = ("poisson", "google_v2_like")


def _cmd_tune(args: argparse.Namespace) -> int:
    from cloudrl.headline.tuning import TuneHeuristicConfig, tune_heuristic

    overrides: dict[str, Any] = {}
    env: dict[str, Any] = {}
    if args.workload:
        env["workload"] = {"kind": args.workload}
    if args.n_servers is not None:
        env["n_servers"] = args.n_servers
    if args.episode_length is not None:
        env["sim"] = {"episode_length": args.episode_length}
    if env:
        overrides["env"] = env
    for key in ("interface", "num_samples", "n_seeds", "tracking_uri", "experiment",
                "max_concurrent_trials", "confirm_seeds"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    cfg = load_config(TuneHeuristicConfig, args.config, overrides)
    tuned = tune_heuristic(cfg, args.out)
    out = args.out or cfg.default_out()
    print(f"\ntuned power_aware on {cfg.n_seeds} train seeds ({cfg.num_samples} trials), "
          f"workload {tuned.workload}, N={tuned.n_servers}, interface {tuned.interface}")
    for label, m in (("default", tuned.default_train), ("tuned", tuned.train)):
        if m:
            print(f"  {label:8s} reward {m['reward_mean']:10.1f} ± {m['reward_ci95']:.1f}  "
                  f"energy {m['energy_kwh_mean']:7.2f} kWh  "
                  f"SLA viol. {100 * m['sla_violation_rate_mean']:.3f}%  "
                  f"toggles {m['toggles_mean']:.1f}")
    for label, m in (("default", tuned.default_validation), ("best", tuned.validation)):
        if m:
            print(f"  {label:8s} on {cfg.confirm_seeds} validation seeds: reward "
                  f"{m['reward_mean']:10.1f}  energy {m['energy_kwh_mean']:7.2f} kWh")
    if tuned.source == "default":
        print("  kept the defaults: no trial beat them on the train seeds and then on the "
              "validation seeds")
    print("  params: " + ", ".join(f"{k}={v}" for k, v in tuned.params.items()))
    print(f"wrote {out}\nevaluate it: cloudrl evaluate --workload {tuned.workload} "
          f"--n-servers {tuned.n_servers} --interface {tuned.interface} "
          f"--policy power_aware --heuristic-params {out}")
    return 0


def _cmd_headline(args: argparse.Namespace) -> int:
    from cloudrl.headline.config import HeadlineConfig, tiny
    from cloudrl.headline.pipeline import run_headline
    from cloudrl.headline.report import format_table

    overrides: dict[str, Any] = {}
    for key in ("out_dir", "tracking_uri", "name"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    cfg = load_config(HeadlineConfig, args.config, overrides)
    if args.tiny:
        cfg = tiny(cfg)
    out = run_headline(cfg, reuse=args.reuse)
    for wl, rows in out["rows"].items():
        print(f"\n{out['results'][wl]['title']}\n{format_table(rows)}")
    goal = out["goal"]
    print(f"\ngoal met: {'yes' if goal['met'] else 'no'} (Pareto-dominates the tuned "
          f"heuristic: {goal['pareto_dominates']}; gap closed: "
          f"{ {k: round(v, 3) for k, v in goal['gap_closed'].items()} }, needs "
          f">= {goal['gap_goal']:.0%} on one workload)")
    for path in out["paths"]:
        print(f"wrote {path}")
    print(f"MLflow run {out['run_id']} (experiment {cfg.experiment!r})")
    return 0


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``tune-heuristic`` and ``headline`` to the ``cloudrl`` subparsers; returns the
    ``headline`` parser (the entry point adds the scenario form to it)."""
    tune = sub.add_parser("tune-heuristic", help="tune power_aware's knobs with a Ray Tune "
                                                 "sweep on the train seeds (MLflow-tracked)")
    tune.add_argument("--config", metavar="YAML", help="TuneHeuristicConfig file")
    tune.add_argument("--workload", choices=_SYNTHETIC, help="workload (default poisson)")
    tune.add_argument("--n-servers", type=int, help="fleet size (default 50)")
    tune.add_argument("--episode-length", type=int, help="ticks per episode (default 1000)")
    tune.add_argument("--interface", choices=("flat", "branching"),
                      help="action interface (default branching)")
    tune.add_argument("--num-samples", type=int, help="Tune trials (default 40)")
    tune.add_argument("--n-seeds", type=int, help="train seeds per trial (default 50)")
    tune.add_argument("--max-concurrent-trials", type=int, help="default 2")
    tune.add_argument("--confirm-seeds", type=int,
                      help="validation seeds on which the best must beat the defaults, else "
                           "they are kept (default 50; 0 = no check)")
    tune.add_argument("--experiment", help="MLflow experiment (default cloudrl-tune-heuristic)")
    tune.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI,"
                                             " else sqlite:///$PWD/mlflow.db)")
    tune.add_argument("--out", help="JSON of the best parameters (default results/headline/"
                                    "tune_<workload>_n<N>_<interface>/tuned_power_aware.json)")
    tune.set_defaults(func=_cmd_tune)

    head = sub.add_parser("headline", help="the headline result: tune the heuristic, train, "
                                           "select on validation seeds, test vs the bound")
    head.add_argument("--config", metavar="YAML", help="HeadlineConfig file, e.g. "
                                                       "experiments/configs/headline.yaml")
    head.add_argument("--reuse", action="store_true",
                      help="reuse the tuned heuristic JSON of an earlier run if present")
    head.add_argument("--tiny", action="store_true",
                      help="smoke size: N=5, 100-tick episodes, 2 seeds, 1,500 env steps (with "
                           "--scenario: the 'tiny' scenario, 3 test seeds, 2 run seeds)")
    head.add_argument("--out-dir", help="results root (default results/headline)")
    head.add_argument("--name", help="run name (default from the config: headline)")
    head.add_argument("--tracking-uri", help="MLflow tracking URI (default "
                                             "$MLFLOW_TRACKING_URI, else sqlite:///$PWD/mlflow.db)")
    head.set_defaults(func=_cmd_headline)
    return head
