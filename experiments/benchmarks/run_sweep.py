"""Run a sweep from a YAML file, then compare it with the heuristics: one command, one table.

What it does: reads a ``SweepConfig`` YAML (``experiments/configs/sweep_small.yaml``,
``experiments/configs/sweep_headline.yaml``), runs the Ray Tune sweep (algorithms x
run seeds x workloads; each trial trained on the 50 train seeds, one MLflow
run per trial with metrics at step = env steps), evaluates every final
checkpoint and the four heuristics on the held-out test seeds, then runs
``cloudrl compare`` for that sweep: prints one table per workload (mean ±
95% CI) and writes ``comparison.csv``/``.md``, ``pareto.png`` and
``learning_curves.png`` under ``--out`` (also logged to an MLflow run
``compare``).

Run:
    .venv/bin/python -m experiments.benchmarks.run_sweep experiments/configs/sweep_small.yaml
    mlflow ui --backend-store-uri sqlite:///$PWD/mlflow.db     # browse the runs

Results to expect (sweep_small.yaml, measured on a shared 2-core CPU machine:
4 trials, 2 at a time; about 170 s of Tune training plus 140 s of evaluation,
~5 min in all). 4000 env steps are only 4 episodes of 1000 ticks, so the
learned policies are far from converged and the power-aware heuristic wins
both workloads; the point of the small sweep is the pipeline, the headline
sweep is the comparison. Test seeds, N=15, mean ± 95% CI over 50 episodes:

    poisson          energy kWh   SLA viol. rate     google_v2_like   energy kWh   SLA viol.
    power_aware      39.4 ± 0.6   0.20% ± 0.05       power_aware      29.5 ± 1.7    8.41% ± 1.66
    sjf              48.9 ± 0.3   0.39% ± 0.09       sjf              43.7 ± 1.1   10.62% ± 2.12
    round_robin      47.5 ± 0.3   1.72% ± 0.42       round_robin      41.2 ± 1.1   15.56% ± 2.64
    ppo (4k steps)   48.0 ± 0.3   3.41% ± 0.23       ppo (4k steps)   39.2 ± 1.1   17.71% ± 1.93
    dqn (4k steps)   44.4 ± 0.5  17.26% ± 1.17       dqn (4k steps)   33.4 ± 1.7   66.11% ± 8.39

(ffd: 49.0 ± 0.3 kWh, 1.98% on poisson; 44.1 ± 1.1 kWh, 12.88% on google_v2_like.)
The learning curves have 4 points per run (one per
training iteration, x = env steps).
"""

from __future__ import annotations

import sys
import time

from cloudrl.argparsing import CliParser
from cloudrl.compare import run_compare
from cloudrl.config_loader import ConfigError, load_config
from cloudrl.sweep import SweepConfig, run_sweep


def main(argv: list[str] | None = None) -> int:
    parser = CliParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="sweep YAML, e.g. experiments/configs/sweep_small.yaml")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default sqlite:///$PWD/"
                                               "mlflow.db or $MLFLOW_TRACKING_URI)")
    parser.add_argument("--out", default="results/compare", help="comparison output directory")
    args = parser.parse_args(argv)
    try:
        overrides = {"tracking_uri": args.tracking_uri} if args.tracking_uri else {}
        cfg = load_config(SweepConfig, args.config, overrides)
    except ConfigError as e:
        print(f"run_sweep: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    out = run_sweep(cfg)
    sweep_s = time.perf_counter() - start
    cmp = run_compare(cfg.experiment, cfg.tracking_uri, args.out, sweep_id=out["sweep_id"])
    for group, text in cmp["text"].items():
        print(f"\n{cmp['titles'][group]}")
        print(text)
    print(f"\nsweep {out['sweep_id']}: {len(out['learned'])} trials, "
          f"{len(out['failed'])} failed, {sweep_s:.0f} s (train + evaluate)")
    for path in cmp["paths"]:
        print(f"wrote {path}")
    return 1 if out["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
