"""Preference-alignment head benchmark: plain BDQ vs BDQ + head at the same env-step budget.

What it does (issue 12, item 4 and the "Safety" benchmark):

1. Demonstrations: ``--episodes`` episodes each of power_aware and round_robin
   (branching interface, N=``--n-servers``, poisson) on train seeds, recorded with
   :func:`cloudrl.alignment.recording.record_episodes`.
2. Teacher pairs: :func:`cloudrl.alignment.teacher.make_teacher_pairs` cuts ``--pairs``
   segment pairs of ``--segment`` steps and labels them with the default safety-bound
   teacher (SLA violations, overload, slowdown spread, then energy; no label noise).
3. Two BDQ runs from the same run seed and the same cloudrl defaults
   (``cloudrl train --algo bdq``), ``--env-steps`` each: plain, and with the head
   (``alignment_pairs``, ``alignment_weight=--weight``, ``alignment_batch=--batch``,
   ``alignment_trunk_grad_scale=--grad-scale``). Per iteration the TD loss (``qf_loss``,
   the TD part alone in both runs) and, for the head, ``alignment/bt_loss`` and
   ``alignment/pair_accuracy``.
4. Both checkpoints (and power_aware for reference) on ``--test-seeds`` held-out test
   seeds, greedy: per episode the return and the teacher's statistics over the whole
   episode: SLA violations, overload (server-steps above the utilisation threshold 0.9),
   slowdown spread (p90 - p10 of the placed jobs' slowdowns) and energy (kWh).

Printed: the TD-loss summary (mean and max over the last ``--tail`` iterations, and over
all learning iterations) and a table of mean +- 95% t-CI per test episode; everything
is also written to ``--out``/results.json.

Run (about 15-25 min on a shared 2-core machine)::

    .venv/bin/python -m experiments.bench_alignment_head [--env-steps 20000] [--out DIR]

Measured with the defaults (shared 2-core machine, load average 15-20 from other engineers'
jobs; N=15, poisson, 20,160 env steps per run, run seed 0, 4+4 demonstration episodes,
1,000 teacher pairs of 20 steps: 961 decided by overload, 22 by SLA violations, 15 by
energy, 2 by slowdown spread; head weight 0.1, 8 pairs per update, trunk scale 1.0;
10 test seeds; 35 min in all). One run seed: a first look, not a verdict.

TD loss (qf_loss), last 10 iterations mean / max, all 19 learning iterations mean / max:

    bdq        0.00206 / 0.00267    0.00143 / 0.00296    883 s
    bdq_head   0.00133 / 0.00151    0.00110 / 0.00317   1136 s (head: BT loss 0.69 -> 0.39,
                                                          training-pair accuracy 0.82)

Test seeds, mean +- 95% CI per 1,000-step episode:

    policy       return          SLA viol.     overload        slowdown spr.   energy kWh
    bdq          -2955 +- 249    9.4 +- 3.1    2113 +- 150     0.54 +- 0.06    39.7 +- 1.3
    bdq_head     -2977 +- 73     0.5 +- 0.5    1753 +- 123     0.09 +- 0.02    47.5 +- 1.1
    power_aware  -2488 +- 142    1.6 +- 0.8    1889 +- 134     0.01 +- 0.01    39.1 +- 1.7

With the head the critic stays stable (TD loss no higher, a smaller late max) and the
return is the same within the CI. There are fewer violations of all three teacher bounds
(SLA violations 9.4 -> 0.5, overload server-steps -17%, slowdown spread 0.54 -> 0.09),
but 20% MORE energy. So the safety goal ("fewer, with no more energy") is met for the
bounds but not for energy: the teacher ranks energy last and the labels are almost all
decided by overload; a likely reason (not checked) is that fewer overloaded servers means keeping
more of them awake.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

STATS = ("sla_violations", "overload", "slowdown_spread", "energy_kwh")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/bench_alignment_head")
    p.add_argument("--n-servers", type=int, default=15)
    p.add_argument("--env-steps", type=int, default=20_000)
    p.add_argument("--run-seed", type=int, default=0)
    p.add_argument("--episodes", type=int, default=4, help="demonstrations per heuristic")
    p.add_argument("--pairs", type=int, default=1000)
    p.add_argument("--segment", type=int, default=20)
    p.add_argument("--weight", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--grad-scale", type=float, default=1.0)
    p.add_argument("--test-seeds", type=int, default=10)
    p.add_argument("--tail", type=int, default=10, help="last iterations for the TD summary")
    return p.parse_args(argv)


def record_demos(out: Path, env: dict[str, Any], episodes: int) -> dict[str, float]:
    from cloudrl.alignment.recording import record_episodes

    returns = {}
    for i, policy in enumerate(("power_aware", "round_robin")):
        seeds = [i * episodes + k for k in range(episodes)]
        summary = record_episodes(policy, out, env_config=env, interface="branching",
                                  episodes=episodes, seeds=seeds)
        returns[policy] = float(np.mean(summary.returns))
    return returns


def train_run(name: str, cfg: Any, out: Path) -> tuple[Path, list[dict[str, float]], float]:
    """Train ``cfg`` to its budget; the checkpoint, per-iteration learner metrics, wall s."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.utils.metrics import LEARNER_RESULTS

    from cloudrl.algorithms.alignment_head import BT_LOSS_KEY, PAIR_ACCURACY_KEY
    from cloudrl.training import build_algo_config, env_steps_of, write_meta

    algo = build_algo_config(cfg).build_algo()
    history: list[dict[str, float]] = []
    start = time.perf_counter()
    try:
        steps = 0
        while steps < cfg.env_steps:
            result = algo.train()
            steps = env_steps_of(result)
            stats = result.get(LEARNER_RESULTS, {}).get(DEFAULT_MODULE_ID, {})
            row = {"env_steps": float(steps)}
            for key in ("qf_loss", BT_LOSS_KEY, PAIR_ACCURACY_KEY):
                if key in stats:
                    row[key] = float(stats[key])
            history.append(row)
            print(f"[{name}] steps {steps:>6} " + " ".join(
                f"{k} {v:.4g}" for k, v in row.items() if k != "env_steps"), flush=True)
        path = out / f"ckpt_{name}"
        algo.save_to_path(str(path.resolve()))
        write_meta(path, cfg)
    finally:
        algo.stop()
    return path, history, time.perf_counter() - start


def evaluate(policy: Any, env: dict[str, Any], seeds: list[int]) -> list[dict[str, float]]:
    """Per test episode: return and the teacher's statistics over the whole episode."""
    from cloudrl.alignment.recording import make_env, record_episode
    from cloudrl.alignment.teacher import TeacherConfig, episode_data, segment_stats
    from envs.env_config import EnvConfig

    gym_env = make_env(EnvConfig.coerce(env), policy.interface)
    cfg = TeacherConfig()
    rows = []
    for seed in seeds:
        episode = record_episode(gym_env, policy, seed)
        data = episode_data(episode)
        rows.append({"return": float(episode.get_return()),
                     **segment_stats(data, 0, data.length, cfg)})
    return rows


def mean_ci(values: list[float]) -> tuple[float, float]:
    from scipy import stats

    arr = np.asarray(values, dtype=np.float64)
    if arr.size < 2:
        return float(arr.mean()), float("nan")
    half = stats.t.ppf(0.975, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size)
    return float(arr.mean()), float(half)


def td_summary(history: list[dict[str, float]], tail: int) -> dict[str, float]:
    losses = [h["qf_loss"] for h in history if "qf_loss" in h and math.isfinite(h["qf_loss"])]
    if not losses:
        return {}
    last = losses[-tail:]
    return {"td_last_mean": float(np.mean(last)), "td_last_max": float(np.max(last)),
            "td_all_mean": float(np.mean(losses)), "td_all_max": float(np.max(losses)),
            "iterations": len(losses)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import ray

    from cloudrl.alignment.recording import make_policy
    from cloudrl.alignment.teacher import make_teacher_pairs
    from cloudrl.checkpoint_policy import CheckpointPolicy
    from cloudrl.protocol import test_seeds
    from cloudrl.training import TrainConfig

    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"n_servers": args.n_servers, "workload": {"kind": "poisson"}}
    t0 = time.perf_counter()
    demos = out / "demos"
    demo_returns = record_demos(demos, env, args.episodes)
    pairs = out / "pairs"
    summary = make_teacher_pairs(demos, args.pairs, args.segment, seed=args.run_seed,
                                 out_dir=pairs)
    print(f"demonstrations {demo_returns}; pairs {summary.n_pairs} labels "
          f"{dict(summary.labels)} decided by {dict(summary.decided_by)} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)

    head = {"alignment_pairs": str(pairs.resolve()), "alignment_weight": args.weight,
            "alignment_batch": args.batch, "alignment_trunk_grad_scale": args.grad_scale}
    ray.init(num_cpus=2, include_dashboard=False)
    runs: dict[str, Any] = {}
    try:
        for name, hparams in (("bdq", {}), ("bdq_head", head)):
            cfg = TrainConfig(algo="bdq", env=env, env_steps=args.env_steps,
                              run_seed=args.run_seed, hparams=hparams)
            path, history, wall = train_run(name, cfg, out)
            runs[name] = {"checkpoint": str(path), "history": history, "wall_s": wall,
                          "td": td_summary(history, args.tail)}
    finally:
        ray.shutdown()

    seeds = list(test_seeds(args.test_seeds))
    policies = {name: CheckpointPolicy(run["checkpoint"]) for name, run in runs.items()}
    policies["power_aware"] = make_policy("power_aware", "branching")
    table: dict[str, dict[str, tuple[float, float]]] = {}
    episodes: dict[str, list[dict[str, float]]] = {}
    for name, policy in policies.items():
        episodes[name] = evaluate(policy, env, seeds)
        table[name] = {k: mean_ci([e[k] for e in episodes[name]])
                       for k in ("return", *STATS)}

    print(f"\nTD loss (qf_loss; last {args.tail} iterations / all learning iterations)")
    for name, run in runs.items():
        td = run["td"]
        print(f"  {name:<9} last mean {td.get('td_last_mean', math.nan):.4g} max "
              f"{td.get('td_last_max', math.nan):.4g} | all mean "
              f"{td.get('td_all_mean', math.nan):.4g} max {td.get('td_all_max', math.nan):.4g}"
              f" | {td.get('iterations', 0)} iterations, {run['wall_s']:.0f} s")
    head_hist = [h for h in runs["bdq_head"]["history"] if "alignment/bt_loss" in h]
    if head_hist:
        tail = head_hist[-args.tail:]
        print(f"  head: bt_loss {np.mean([h['alignment/bt_loss'] for h in tail]):.4f}, "
              f"pair accuracy {np.nanmean([h['alignment/pair_accuracy'] for h in tail]):.3f}"
              f" (last {len(tail)} iterations; first: bt_loss "
              f"{head_hist[0]['alignment/bt_loss']:.4f})")
    cols = ("return", *STATS)
    print(f"\nTest seeds ({len(seeds)} episodes each; mean +- 95% CI per episode)")
    print(f"  {'policy':<12}" + "".join(f"{c:>24}" for c in cols))
    for name, row in table.items():
        print(f"  {name:<12}" + "".join(f"{row[c][0]:>14.3f} +- {row[c][1]:<6.3f}"
                                        for c in cols))
    results = {"args": vars(args), "demo_returns": demo_returns,
               "pairs": {"n": summary.n_pairs, "labels": {str(k): v for k, v in
                                                            summary.labels.items()},
                         "decided_by": dict(summary.decided_by)},
               "runs": runs, "table": table, "episodes": episodes,
               "wall_s": time.perf_counter() - t0}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out / 'results.json'} ({results['wall_s']:.0f} s)")
    return results


if __name__ == "__main__":
    main()
