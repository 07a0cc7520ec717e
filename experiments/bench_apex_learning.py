"""Time to a test-seed result: Ape-X BDQ vs single-process BDQ, same env-step budget.

What it does (issue 6, "the Ape-X BDQ reaches the single-process BDQ's test-seed result in
less wall time"):

1. trains, one after the other on the same machine, ``bdq`` (RLlib's synchronous BDQ on
   the device replay, sampling in the driver: sample 24 steps, one update, repeat) and
   ``apex_bdq`` (``--runners`` actors, ``--shards`` replay shards, the learner in the
   driver) from the same ``cloudrl.training`` settings (N servers, poisson, branching
   interface, 8 envs per runner, batch 64, n-step 3, lr 5e-4, hidden 128) to
   ``--env-steps``. Ape-X's ``max_replay_ratio`` is set to BDQ's own replay ratio (64
   trained samples per 24 sampled steps = 2.67) unless ``--replay-ratio`` says otherwise,
   so both learn from as many replayed samples per env step;
2. every ``--every`` seconds of training wall time (the clock stops while a checkpoint
   is written) it saves a checkpoint, and one at the end;
3. evaluates every checkpoint and ``power_aware`` on the held-out test seeds (greedy,
   branching interface) and prints, per checkpoint: training seconds, env steps, test
   reward (the env's own objective: energy and SLA penalties; what both agents maximize),
   energy and SLA violation rate;
4. time to target: the target is the single-process BDQ's FINAL test reward; for each
   algorithm, the first checkpoint whose mean test reward reaches it.

How to run (~15 min with the defaults: two ~2-3 min trainings, then ~16 evaluations of
50 episodes)::

    .venv/bin/python experiments/bench_apex_learning.py [--n-servers 15]
        [--env-steps 30000] [--runners 2] [--shards 2] [--replay-ratio 2.67]
        [--every 20] [--eval-seeds 50] [--out results/apex_learning]

Results to expect: see the README ("Learning, same budget"), measured with this script.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import ray

from cloudrl.evaluate import EvalConfig, evaluate, summary_rows
from cloudrl.training import TrainConfig, build_algo_config, flat_metrics, write_meta

BDQ_REPLAY_RATIO = 64 / 24  # batch 64 per sample() of 8 envs x n_step 3 steps


def train_config(algo: str, args: argparse.Namespace) -> TrainConfig:
    hparams: dict[str, Any] = {"device_replay": True} if algo == "bdq" else {
        "num_replay_shards": args.shards, "max_replay_ratio": args.replay_ratio}
    return TrainConfig(algo=algo, env={"n_servers": args.n_servers,
                                       "workload": {"kind": args.workload}},
                       env_steps=args.env_steps, run_seed=args.seed,
                       num_env_runners=0 if algo == "bdq" else args.runners,
                       hparams=hparams)


def train_with_checkpoints(cfg: TrainConfig, out: Path, every_s: float
                           ) -> list[dict[str, Any]]:
    """Train ``cfg``; checkpoint every ``every_s`` s of training time and at the end."""
    algo = build_algo_config(cfg).build_algo()
    points: list[dict[str, Any]] = []
    train_s, steps, next_mark = 0.0, 0, every_s
    try:
        while steps < cfg.env_steps:
            t0 = time.perf_counter()
            metrics = flat_metrics(algo.train())
            train_s += time.perf_counter() - t0
            steps = int(metrics["env_steps"])
            if train_s >= next_mark or steps >= cfg.env_steps:
                path = out / f"{cfg.algo}_{len(points):02d}"
                algo.save_to_path(str(path))
                write_meta(path, cfg)
                points.append({"algo": cfg.algo, "train_s": train_s, "env_steps": steps,
                               "checkpoint": str(path)})
                print(f"  {cfg.algo}: {train_s:6.1f} s, {steps} env steps -> {path.name}",
                      flush=True)
                while next_mark <= train_s:
                    next_mark += every_s
    finally:
        algo.stop()
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-servers", type=int, default=15)
    parser.add_argument("--workload", default="poisson")
    parser.add_argument("--env-steps", type=int, default=30_000)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--replay-ratio", type=float, default=BDQ_REPLAY_RATIO)
    parser.add_argument("--every", type=float, default=20.0)
    parser.add_argument("--eval-seeds", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algos", nargs="+", default=["bdq", "apex_bdq"],
                        choices=("bdq", "apex_bdq"))
    parser.add_argument("--out", type=Path, default=Path("results/apex_learning"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {os.getloadavg()}", flush=True)

    ray.init(num_cpus=8, include_dashboard=False)  # 1 CPU per runner and per shard
    points: list[dict[str, Any]] = []
    for algo in args.algos:
        points += train_with_checkpoints(train_config(algo, args), args.out, args.every)
    ray.shutdown()
    print(f"load average after training: {os.getloadavg()}", flush=True)

    cfg = train_config(args.algos[0], args)
    policies = [p["checkpoint"] for p in points] + ["power_aware"]
    results = evaluate(EvalConfig(env=cfg.env, interface="branching", policies=policies,
                                  n_seeds=args.eval_seeds), progress=False)
    rows = {r["policy"]: r for r in summary_rows(results)}
    for p in points:
        p.update(rows[f"{p['algo']}:{Path(p['checkpoint']).name}"])
    (args.out / "points.json").write_text(json.dumps(points, indent=1))

    print(f"\nN={args.n_servers}, {args.workload}, {args.env_steps} env steps, apex: "
          f"{args.runners} runners, {args.shards} shards, max_replay_ratio "
          f"{args.replay_ratio:.2f}; {args.eval_seeds} test seeds, mean (95% CI)")
    print(f"{'algo':<9} {'train s':>7} {'env steps':>9} {'test reward':>16} "
          f"{'energy kWh':>14} {'SLA viol.':>16}")
    table = points + [{"algo": "power_aware", "train_s": 0.0, "env_steps": 0,
                       **rows["power_aware"]}]
    for p in table:
        print(f"{p['algo']:<9} {p['train_s']:>7.1f} {p['env_steps']:>9} "
              f"{p['episode_reward_mean']:>9.1f} ±{p['episode_reward_ci95']:>5.1f} "
              f"{p['energy_kwh_mean']:>7.1f} ±{p['energy_kwh_ci95']:>4.1f} "
              f"{100 * p['sla_violation_rate_mean']:>8.2f}% "
              f"±{100 * p['sla_violation_rate_ci95']:>4.2f}")
    finals = {a: [p for p in points if p["algo"] == a][-1] for a in args.algos}
    if "bdq" in finals:
        target = finals["bdq"]["episode_reward_mean"]
        print(f"\ntarget: single-process BDQ's final test reward {target:.1f} "
              f"(after {finals['bdq']['train_s']:.0f} s)")
        for algo in args.algos:
            hit = next((p for p in points if p["algo"] == algo
                        and p["episode_reward_mean"] >= target), None)
            print(f"  {algo:<9} " + (f"reaches it after {hit['train_s']:.0f} s "
                                     f"({hit['env_steps']} env steps)" if hit
                                     else "does not reach it"))


if __name__ == "__main__":
    main()
