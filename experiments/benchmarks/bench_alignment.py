"""Label efficiency of phase 3: PPO on the learned reward vs PPO on the true reward.

What it does: records heuristic demonstrations on the train seeds (power_aware,
round_robin, sjf), labels ``max(labels)`` teacher pairs from them, and for each label
count (default 300 and 1,000: the first L pairs of the same draw) trains the phase-2
reward model (Ray Train + DeepSpeed, :func:`cloudrl.alignment.reward_model.train_reward_model`)
and a PPO policy on it (:func:`cloudrl.alignment.phase3.train_phase3`, mix 1: learned
reward only, no anchor, no BC start, no re-query, so only the labels differ). A PPO policy
on the true env reward gets the same env-step budget. Every policy (and the power_aware
heuristic for reference) is evaluated on the first ``--eval-seeds`` held-out test seeds
(:mod:`cloudrl.evaluate`); the table gives mean +- 95% t-CI of the true episode reward,
SLA violation rate and energy, plus the reward model's held-out pair accuracy.

Run (about 20 min on a loaded 2-core machine at the defaults)::

    python experiments/benchmarks/bench_alignment.py --env-steps 16000 --labels 300 1000
    # -> results/bench_alignment/results.json and table.md

Results to expect (measured on the shared 2-core machine at the defaults: N=10, 200-tick
episodes, 16k PPO env steps each, 20 test seeds; ~16 min, niced next to other jobs), with the
transition reward r(s, s') of phase 2, true episode reward mean +- 95% CI:

    PPO, learned reward, 300 labels    -1666.6 +- 215.9   (reward model held-out acc. 0.850)
    PPO, learned reward, 1,000 labels  -1654.8 +- 243.2   (reward model held-out acc. 0.945)
    PPO, true reward                   -1613.2 +- 228.2
    power_aware heuristic               -532.9 +-  35.4

Both learned-reward policies land inside the true-reward policy's 95% CI (the alignment goal),
but at this budget every PPO policy is ~3x worse than power_aware, so that is weak evidence;
offline labels only here (no re-query, anchor or BC start). (With the earlier per-state
reward r(s): 300 labels -1482.5 +- 202.2, 1,000 labels -1629.9 +- 199.3.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from cloudrl.argparsing import CliParser


def main() -> None:
    p = CliParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-servers", type=int, default=10)
    p.add_argument("--episode-length", type=int, default=200)
    p.add_argument("--demo-episodes", type=int, default=4, help="per heuristic")
    p.add_argument("--labels", type=int, nargs="+", default=[300, 1000])
    p.add_argument("--segment-length", type=int, default=25)
    p.add_argument("--reward-epochs", type=int, default=15)
    p.add_argument("--env-steps", type=int, default=16_000)
    p.add_argument("--eval-seeds", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/bench_alignment")
    args = p.parse_args()

    import ray

    from cloudrl.alignment.phase3 import Phase3Config, train_phase3
    from cloudrl.alignment.reward_model import RewardModelConfig, train_reward_model
    from cloudrl.alignment.teacher import make_teacher_pairs
    from cloudrl.data.pairs import read_table, write_pairs
    from cloudrl.evaluate import EvalConfig, evaluate, format_table, summary_rows
    from cloudrl.recording import record_episodes
    from cloudrl.training import TrainConfig, train
    from envs.env_config import EnvConfig

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    env = EnvConfig.model_validate({"n_servers": args.n_servers,
                                    "sim": {"episode_length": args.episode_length}})
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    demos = out / "demos"
    if not demos.exists():
        for policy in ("power_aware", "round_robin", "sjf"):
            record_episodes(policy, demos, env_config=env, episodes=args.demo_episodes)
    all_pairs = out / f"pairs_{max(args.labels)}"
    if not all_pairs.exists():
        make_teacher_pairs(str(demos), max(args.labels), args.segment_length, args.seed,
                           all_pairs)
    table = read_table(all_pairs)
    timings["data_s"] = time.perf_counter() - t0

    hparams = {"train_batch_size_per_learner": 2000, "minibatch_size": 250, "num_epochs": 4}
    policies: dict[str, str] = {}
    accuracy: dict[str, float] = {}
    for n in sorted(args.labels):
        t = time.perf_counter()
        pairs = out / f"pairs_first_{n}"
        if not pairs.exists():
            write_pairs(table.slice(0, n), pairs, prefix=f"first{n}")
        rm = train_reward_model(RewardModelConfig(
            data=str(pairs), epochs=args.reward_epochs, num_workers=1, seed=args.seed,
            storage_path=str(out / "ray_train"), name=f"reward_{n}", mlflow=False))
        accuracy[f"learned_{n}"] = float(rm.final["val_accuracy"])
        res = train_phase3(Phase3Config(
            env_steps=args.env_steps, reward_model=str(rm.checkpoint_dir), pairs=str(pairs),
            bc_module=None, anchor_coeff=0.0, hparams=hparams, run_seed=args.seed,
            out=str(out / f"ppo_learned_{n}")), env)
        policies[f"learned_{n}"] = str(res.checkpoint)
        timings[f"learned_{n}_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ckpt, _ = train(TrainConfig(algo="ppo", env=env, env_steps=args.env_steps,
                                hparams=hparams, run_seed=args.seed,
                                checkpoint_dir=str(out / "ppo_true")))
    policies["true_reward"] = str(ckpt)
    timings["true_reward_s"] = time.perf_counter() - t

    t = time.perf_counter()
    results = evaluate(EvalConfig(env=env, policies=[*policies.values(), "power_aware"],
                                  n_seeds=args.eval_seeds, workers=2), progress=False)
    rows = summary_rows(results)
    timings["eval_s"] = time.perf_counter() - t
    names = {v: k for k, v in policies.items()}
    for row in rows:
        row["label"] = names.get(row["policy"], row["policy"])
        row["reward_model_val_accuracy"] = accuracy.get(row["label"])
    text = format_table(rows, markdown=True)
    summary = {"args": vars(args), "rows": rows, "timings": timings,
               "total_s": time.perf_counter() - t0}
    (out / "results.json").write_text(json.dumps(summary, indent=1, default=str))
    lines = [text, "", "| policy | reward-model held-out accuracy |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in accuracy.items()]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(f"{r['label']}: episode_reward {r['episode_reward_mean']:.1f} "
                    f"+- {r['episode_reward_ci95']:.1f}" for r in rows))
    print("\n".join(lines))
    print(json.dumps(timings))


if __name__ == "__main__":
    main()
