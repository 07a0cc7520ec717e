"""PPO sampling+training throughput: masked PPO on the cluster env (N=50) vs stock PPO on CartPole.

What it does: builds two RLlib PPO algorithms with the same runner and
batch config — cloudrl's masked PPO RLModule on the flat cluster env
(N=50 servers, action space 451) and RLlib's default PPO module on
CartPole-v1 — and times ``algo.train()`` for a few iterations after one
warm-up iteration. Prints env steps/s (sampling + learning) and the share of
time spent sampling, and the ratio cluster/CartPole.

Run:  .venv/bin/python -m experiments.bench_training [--iters 3] [--batch 2000] [--runners 0]
      [--envs-per-runner 1]
(with --runners 0 sampling happens in the driver, so the sampling share is measured;
with remote runners it reads 0).

Target (issue 3): the cluster env is not the bottleneck (>= CartPole's rate).
Results to expect: see the README table (measured in this change on the
2-core machine).
"""

from __future__ import annotations

import argparse
import time

import ray


def _ppo_common(config, batch: int, runners: int, envs: int):
    return (
        config.api_stack(enable_rl_module_and_learner=True,
                         enable_env_runner_and_connector_v2=True)
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs)
        .training(train_batch_size_per_learner=batch, minibatch_size=250, num_epochs=4,
                  lr=3e-4)
        .reporting(metrics_num_episodes_for_smoothing=5)
    )


class _EnvStepTimer:
    """Accumulates wall time spent inside ``env_cls.step`` (driver-local sampling only)."""

    def __init__(self, env_cls) -> None:
        self.env_cls, self.seconds = env_cls, 0.0
        self._original = env_cls.step

    def __enter__(self):
        original, timer = self._original, self

        def step(env, action):
            t = time.perf_counter()
            try:
                return original(env, action)
            finally:
                timer.seconds += time.perf_counter() - t
        self.env_cls.step = step
        return self

    def __exit__(self, *exc) -> None:
        self.env_cls.step = self._original


def time_algo(algo, iters: int, env_cls) -> tuple[float, float, float]:
    """(env steps/s over ``iters`` iterations, share of time sampling, share inside env.step).

    Sampling time is measured around the env runner's ``sample`` method, so the
    share does not depend on RLlib's timer smoothing.
    """
    from cloudrl.training import env_steps_of

    runner = algo.env_runner_group.local_env_runner
    sampled = {"s": 0.0}
    original = runner.sample

    def timed_sample(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sampled["s"] += time.perf_counter() - t

    result = algo.train()  # warm-up: compile, first episodes
    runner.sample = timed_sample
    start_steps = env_steps_of(result)
    with _EnvStepTimer(env_cls) as env_timer:
        t0 = time.perf_counter()
        for _ in range(iters):
            result = algo.train()
        elapsed = time.perf_counter() - t0
    runner.sample = original
    return ((env_steps_of(result) - start_steps) / elapsed, sampled["s"] / elapsed,
            env_timer.seconds / elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--runners", type=int, default=0)
    parser.add_argument("--n-servers", type=int, default=50)
    parser.add_argument("--envs-per-runner", type=int, default=1)
    args = parser.parse_args()

    from gymnasium.envs.classic_control import CartPoleEnv
    from ray.rllib.algorithms.ppo import PPOConfig

    from cloudrl.training import TrainConfig, build_algo_config
    from envs.cluster_env import ClusterSchedulingEnv

    ray.init(num_cpus=2, include_dashboard=False)
    rows = []
    cart = _ppo_common(PPOConfig().environment("CartPole-v1"), args.batch, args.runners,
                       args.envs_per_runner)
    algo = cart.build_algo()
    rows.append(("CartPole-v1 (stock PPO module)", *time_algo(algo, args.iters, CartPoleEnv)))
    algo.stop()

    tc = TrainConfig(algo="ppo", env={"n_servers": args.n_servers},
                     num_env_runners=args.runners)
    cluster = _ppo_common(build_algo_config(tc), args.batch, args.runners, args.envs_per_runner)
    algo = cluster.build_algo()
    rows.append((f"cluster flat N={args.n_servers} (masked PPO)",
                 *time_algo(algo, args.iters, ClusterSchedulingEnv)))
    algo.stop()
    ray.shutdown()

    print(f"\nPPO, batch {args.batch}, {args.runners} remote env runners x "
          f"{args.envs_per_runner} envs, {args.iters} iters")
    print(f"{'env':<34} {'env steps/s':>12} {'sampling share':>15} {'env.step share':>15}")
    for name, rate, share, env_share in rows:
        print(f"{name:<34} {rate:>12.0f} {share:>15.0%} {env_share:>15.1%}")
    print(f"ratio cluster / CartPole: {rows[1][1] / rows[0][1]:.2f}")


if __name__ == "__main__":
    main()
