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

      .venv/bin/python -m experiments.bench_training --sampling [--envs-per-runner 32]
measures sampling alone (issue 18): env steps/s of one RLlib env runner
(``SingleAgentEnvRunner.sample``, exploring, in this process) over B envs at N=50, with
``TrainConfig(batched_env=False)`` (gymnasium's SyncVectorEnv of the single env, the
previous default) and ``batched_env=True`` (envs.vector_env), for masked PPO (flat) and
BDQ (branching); best of ``--iters`` timed calls after a warm-up call.

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


def sampling_rate(algo: str, batched: bool, n_envs: int, n_servers: int, iters: int,
                  steps_per_env: int = 40) -> tuple[str, float]:
    """(env class the runner stepped, best env steps/s of ``runner.sample``)."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from cloudrl.training import TrainConfig, build_algo_config

    tc = TrainConfig(algo=algo, env={"n_servers": n_servers}, envs_per_runner=n_envs,
                     batched_env=batched)
    runner = SingleAgentEnvRunner(config=build_algo_config(tc))
    runner.sample(num_timesteps=n_envs * 10, explore=True)  # warm-up (compile, first resets)
    best = 0.0
    for _ in range(iters):
        t0 = time.perf_counter()
        episodes = runner.sample(num_timesteps=n_envs * steps_per_env, explore=True)
        elapsed = time.perf_counter() - t0
        best = max(best, sum(len(e) for e in episodes) / elapsed)
    kind = type(runner.env.unwrapped).__name__
    runner.stop()
    return kind, best


def sampling_main(args) -> None:
    import os

    print("load average:", os.getloadavg(), "(start)", flush=True)
    rows = [(algo, batched, *sampling_rate(algo, batched, args.envs_per_runner,
                                           args.n_servers, args.iters))
            for algo in ("ppo", "bdq") for batched in (False, True)]
    print(f"\nsampling only: one env runner in the driver, {args.envs_per_runner} envs, "
          f"N={args.n_servers}, best of {args.iters} calls")
    print(f"{'algo':<5} {'env runner steps':<28} {'env steps/s':>12} {'vs sync':>8}")
    for algo, _batched, kind, rate in rows:
        ref = next(r for a, b, _, r in rows if a == algo and not b)
        print(f"{algo:<5} {kind:<28} {rate:>12.0f} {rate / ref:>7.2f}x")
    print("load average:", os.getloadavg(), "(end)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--runners", type=int, default=0)
    parser.add_argument("--n-servers", type=int, default=50)
    parser.add_argument("--envs-per-runner", type=int, default=1)
    parser.add_argument("--sampling", action="store_true",
                        help="time one env runner's sampling, sync vs batched env (issue 18)")
    args = parser.parse_args()
    if args.sampling:
        sampling_main(args)
        return

    from gymnasium.envs.classic_control import CartPoleEnv
    from ray.rllib.algorithms.ppo import PPOConfig

    from cloudrl.training import TrainConfig, build_algo_config
    from envs.cluster_env import ClusterSchedulingEnv
    from envs.vector_env import ClusterSchedulingVectorEnv

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
    env_cls = ClusterSchedulingVectorEnv if tc.batched_env else ClusterSchedulingEnv
    rows.append((f"cluster flat N={args.n_servers} (masked PPO)",
                 *time_algo(algo, args.iters, env_cls)))
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
