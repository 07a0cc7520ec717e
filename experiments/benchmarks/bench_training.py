"""PPO sampling+training throughput: masked PPO on the cluster env (N=50) vs stock PPO on CartPole.

What it does: builds two RLlib PPO algorithms with the same runner and
batch config — cloudrl's masked PPO RLModule on the flat cluster env
(N=50 servers, action space 451) and RLlib's default PPO module on
CartPole-v1 — and times ``algo.train()`` for a few iterations after one
warm-up iteration. Prints env steps/s (sampling + learning) and the share of
time spent sampling, and the ratio cluster/CartPole.

Run:  .venv/bin/python -m experiments.benchmarks.bench_training [--iters 3] [--batch 2000]
      [--runners 0] [--envs-per-runner 1]
(with --runners 0 sampling happens in the driver, so the sampling share is measured;
with remote runners it reads 0).

      .venv/bin/python -m experiments.benchmarks.bench_training --sampling [--envs-per-runner 32]
measures sampling alone: env steps/s of one RLlib env runner
(``sample()`` of the config's runner class, exploring, in this process, torch threads 1 as an env
runner actor with 1 CPU) over B envs at N=50, for masked PPO (flat) and BDQ (branching):
the code at ``--reference-rev`` (default 59af842, the last revision before the batched env and
env runner; unpacked with
``git archive`` and run in a child process) alternating with the current code's rows
(SyncVectorEnv + RLlib's connectors, batched env + RLlib's connectors, batched env +
stacked connectors on RLlib's runner, and the default: + the batched env runner); best of
``--rounds`` x ``--iters`` timed calls after a warm-up call each. Measured (README, 20:25
UTC, load 1.1-1.8): PPO 2,757 -> 12,435 env steps/s (4.51x), BDQ 2,318 -> 7,253 (3.13x);
four more runs 4.18x / 4.25x / 4.65x / 5.82x and 3.57x / 3.07x / 3.64x / 3.86x.
The goal of 3x is met.

Target: the cluster env is not the bottleneck (>= CartPole's rate).
Results to expect: see the README table (measured in this change on the
2-core machine).
"""

from __future__ import annotations

import argparse
import time

import ray

from cloudrl.argparsing import CliParser


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


def sampling_rate(algo: str, n_envs: int, n_servers: int, iters: int,
                  steps_per_env: int = 40, **overrides: bool) -> tuple[str, float]:
    """(env class the runner stepped, best env steps/s of ``runner.sample``).

    ``overrides``: ``TrainConfig`` switches (``batched_env``, ``stacked_connectors``); none
    for a reference tree whose ``TrainConfig`` predates them."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from cloudrl.training import TrainConfig, build_algo_config

    tc = TrainConfig(algo=algo, env={"n_servers": n_servers}, envs_per_runner=n_envs,
                     **overrides)
    config = build_algo_config(tc)
    runner = (config.env_runner_cls or SingleAgentEnvRunner)(config=config)
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


# (label, TrainConfig switches) of the current tree's rows; the reference row is the tree
# at --reference-rev with its own defaults.
SAMPLING_ROWS = (
    ("SyncVectorEnv, RLlib connectors", {"batched_env": False, "stacked_connectors": False}),
    ("batched env, RLlib connectors", {"batched_env": True, "stacked_connectors": False}),
    ("batched env, stacked connectors", {"batched_env": True, "stacked_connectors": True,
                                         "batched_runner": False}),
    ("+ batched env runner", {"batched_env": True, "stacked_connectors": True,
                              "batched_runner": True}),
)


def _reference_tree(rev: str) -> str:
    """``git archive`` of ``rev`` unpacked into a temporary directory (its path)."""
    import subprocess
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    try:
        archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", rev],
                                 check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        import sys

        detail = (getattr(err, "stderr", b"") or str(err).encode()).decode(errors="replace")
        print(f"--reference-rev {rev}: not a revision of {root} "
              f"({(detail.strip().splitlines() or ['?'])[-1]}); a shallow clone lacks it: "
              "fetch it or pass --reference-rev none", file=sys.stderr)
        sys.exit(2)
    tree = tempfile.mkdtemp(prefix=f"cloudrl-ref-{rev[:12]}-")
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def _reference_rate(tree: str, algo: str, args) -> tuple[str, float]:
    """The reference tree's sampling rate, measured in a child process on its own code."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(
        [sys.executable, __file__, "--child-sampling", algo, "--iters", str(args.iters),
         "--torch-threads", str(args.torch_threads),
         "--n-servers", str(args.n_servers), "--envs-per-runner", str(args.envs_per_runner)],
        cwd=tree, env=env, check=True, capture_output=True, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    return row["kind"], row["rate"]


def sampling_main(args) -> None:
    import os
    import shutil

    import torch

    torch.set_num_threads(args.torch_threads)
    print("load average:", os.getloadavg(), "(start)", flush=True)
    tree = _reference_tree(args.reference_rev) if args.reference_rev != "none" else None
    best: dict[tuple[str, str], tuple[str, float]] = {}
    try:
        for algo in ("ppo", "bdq"):
            for _ in range(args.rounds):  # reference and current rows alternate
                measured = []
                if tree is not None:
                    measured.append((f"reference {args.reference_rev}",
                                     _reference_rate(tree, algo, args)))
                measured += [(label, sampling_rate(algo, args.envs_per_runner, args.n_servers,
                                                   args.iters, **switches))
                             for label, switches in SAMPLING_ROWS]
                for label, (kind, rate) in measured:
                    if rate > best.get((algo, label), ("", 0.0))[1]:
                        best[algo, label] = (kind, rate)
    finally:
        if tree is not None:
            shutil.rmtree(tree, ignore_errors=True)
    print(f"\nsampling only: one env runner in the driver, {args.envs_per_runner} envs, "
          f"N={args.n_servers}, torch threads {args.torch_threads}, best of {args.rounds} "
          f"rounds x {args.iters} calls")
    print(f"{'algo':<5} {'row':<34} {'env class':<28} {'env steps/s':>12} {'vs ref':>7}")
    for algo in ("ppo", "bdq"):
        rows = [(label, *best[algo, label]) for label in
                ([f"reference {args.reference_rev}"] if tree is not None else [])
                + [label for label, _ in SAMPLING_ROWS]]
        ref = rows[0][2]
        for label, kind, rate in rows:
            print(f"{algo:<5} {label:<34} {kind:<28} {rate:>12.0f} {rate / ref:>6.2f}x")
    print("load average:", os.getloadavg(), "(end)")


def child_sampling(args) -> None:
    """One JSON line: the importable tree's (its defaults) sampling rate of ``algo``."""
    import json

    import torch

    torch.set_num_threads(args.torch_threads)
    kind, rate = sampling_rate(args.child_sampling, args.envs_per_runner, args.n_servers,
                               args.iters)
    print(json.dumps({"kind": kind, "rate": rate}))


def main() -> None:
    parser = CliParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--runners", type=int, default=0)
    parser.add_argument("--n-servers", type=int, default=50)
    parser.add_argument("--envs-per-runner", type=int, default=1)
    parser.add_argument("--sampling", action="store_true",
                        help="time one env runner's sampling, sync vs batched env")
    parser.add_argument("--reference-rev", default="59af842",
                        help="--sampling: git revision measured as the reference in the same "
                        "run (default: the last revision before the batched env and env runner); "
                        "'none' skips it")
    parser.add_argument("--rounds", type=int, default=2,
                        help="--sampling: rounds of reference/current rows, alternating")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="--sampling: torch intra-op threads of the sampling process, as "
                        "an env runner actor with 1 CPU has (Ray sets OMP_NUM_THREADS=1)")
    parser.add_argument("--child-sampling", choices=("ppo", "bdq"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_sampling:
        child_sampling(args)
        return
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
