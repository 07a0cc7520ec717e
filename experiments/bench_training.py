"""PPO sampling+training throughput: masked PPO on the cluster env (N=50) vs stock PPO on CartPole.

What it does: builds two RLlib PPO algorithms with the same runner and
batch config — cloudrl's masked PPO RLModule on the flat cluster env
(N=50 servers, action space 451) and RLlib's default PPO module on
CartPole-v1 — and times ``algo.train()`` for a few iterations after one
warm-up iteration. Prints env steps/s (sampling + learning) and the share of
time spent sampling, and the ratio cluster/CartPole.

Run:  .venv/bin/python -m experiments.bench_training [--iters 3] [--batch 2000] [--runners 0]

Target (issue 3): the cluster env is not the bottleneck (>= CartPole's rate).
Results to expect: see the README table (measured in this change on the
2-core machine).
"""

from __future__ import annotations

import argparse
import time

import ray


def _ppo_common(config, batch: int, runners: int):
    return (
        config.api_stack(enable_rl_module_and_learner=True,
                         enable_env_runner_and_connector_v2=True)
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=1)
        .training(train_batch_size_per_learner=batch, minibatch_size=250, num_epochs=4,
                  lr=3e-4)
        .reporting(metrics_num_episodes_for_smoothing=5)
    )


def time_algo(algo, iters: int) -> tuple[float, float]:
    """(env steps per second over ``iters`` iterations, fraction of time in sampling)."""
    from cloudrl.training import env_steps_of

    result = algo.train()  # warm-up: compile, first episodes
    start_steps = env_steps_of(result)
    t0 = time.perf_counter()
    sample_s = 0.0
    for _ in range(iters):
        result = algo.train()
        timers = result.get("timers", {})
        sample_s += float(timers.get("env_runner_sampling_timer", 0.0))
    elapsed = time.perf_counter() - t0
    return (env_steps_of(result) - start_steps) / elapsed, sample_s / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--runners", type=int, default=0)
    parser.add_argument("--n-servers", type=int, default=50)
    args = parser.parse_args()

    from ray.rllib.algorithms.ppo import PPOConfig

    from cloudrl.training import TrainConfig, build_algo_config

    ray.init(num_cpus=2, include_dashboard=False)
    rows = []
    cart = _ppo_common(PPOConfig().environment("CartPole-v1"), args.batch, args.runners)
    algo = cart.build_algo()
    rows.append(("CartPole-v1 (stock PPO module)", *time_algo(algo, args.iters)))
    algo.stop()

    tc = TrainConfig(algo="ppo", env={"n_servers": args.n_servers},
                     num_env_runners=args.runners)
    cluster = _ppo_common(build_algo_config(tc), args.batch, args.runners)
    algo = cluster.build_algo()
    rows.append((f"cluster flat N={args.n_servers} (masked PPO)", *time_algo(algo, args.iters)))
    algo.stop()
    ray.shutdown()

    print(f"\nPPO, batch {args.batch}, {args.runners} remote env runners, {args.iters} iters")
    print(f"{'env':<34} {'env steps/s':>12} {'sampling share':>15}")
    for name, rate, share in rows:
        print(f"{name:<34} {rate:>12.0f} {share:>15.0%}")
    print(f"ratio cluster / CartPole: {rows[1][1] / rows[0][1]:.2f}")


if __name__ == "__main__":
    main()
