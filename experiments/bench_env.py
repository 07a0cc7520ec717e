"""Env step throughput: both cluster interfaces at N=15, 50, 200 vs CartPole-v1, same run.

What it does: steps each env for a fixed number of steps with a trivial
policy (flat: first feasible placement, else wait; branching: slot 0 on its
first feasible server, other slots defer, tiers hold), timing only
``env.step`` (and ``reset`` at episode ends), and prints steps/s, µs/step
and the cost of a step relative to a CartPole-v1 step measured in the same
process. Raw env classes are compared with raw CartPoleEnv; the
``gym.make`` rows compare both through gymnasium's wrappers.

Run:  .venv/bin/python -m experiments.bench_env [--steps 20000]

Target (issue 2): at N=50 a flat step costs <= 5x a CartPole step.
Results to expect (2-core CI-class machine, numba kernels warm; see README
for the table measured in this change): CartPole ~7-10 µs/step; cluster
flat N=50 ~4-5x CartPole, branching N=50 ~6-7x, N=200 ~8-10x.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

import envs  # noqa: F401  (registers the gymnasium ids)
from envs import kernels
from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv


def _flat_policy(env):
    wait = env.unwrapped.wait_action
    n_place = wait - env.unwrapped.n_servers

    def act(obs):
        m = obs["action_mask"][:n_place]
        i = int(m.argmax())
        return i if m[i] > 0 else wait
    return act


def _branching_policy(env):
    base = env.unwrapped
    k, n = base.queue_window, base.n_servers
    hold = np.array([n] * k + [1] * base.n_tiers + [0], dtype=np.int64)

    def act(obs):
        a = hold.copy()
        row = obs["action_mask"][:n]
        i = int(row.argmax())
        if row[i] > 0:
            a[0] = i
        return a
    return act


def time_env(env, policy, steps: int, seed: int = 0) -> float:
    """Mean seconds per ``env.step`` (resets included) over ``steps`` steps."""
    obs, _ = env.reset(seed=seed)
    elapsed = 0.0
    for i in range(steps):
        action = policy(obs)
        t0 = time.perf_counter()
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset(seed=seed + i)
        elapsed += time.perf_counter() - t0
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[15, 50, 200])
    args = parser.parse_args()
    kernels.warm_up()

    cart_raw = time_env(CartPoleEnv(), lambda o: 0 if o[2] < 0 else 1, args.steps)
    cart_made = time_env(gym.make("CartPole-v1"), lambda o: 0 if o[2] < 0 else 1, args.steps)
    rows = [("CartPole-v1", "raw", "-", cart_raw, cart_raw),
            ("CartPole-v1", "gym.make", "-", cart_made, cart_made)]
    for n in args.sizes:
        cfg = {"n_servers": n}
        for name, cls, make_id, pol in (
            ("flat", ClusterSchedulingEnv, envs.FLAT_ID, _flat_policy),
            ("branching", ClusterBranchingEnv, envs.BRANCHING_ID, _branching_policy),
        ):
            env = cls(cfg)
            rows.append((f"cluster {name}", "raw", n, time_env(env, pol(env), args.steps),
                         cart_raw))
            made = gym.make(make_id, config=cfg)
            rows.append((f"cluster {name}", "gym.make", n,
                         time_env(made, pol(made), args.steps), cart_made))

    print(f"{'env':<18} {'via':<9} {'N':>4} {'steps/s':>10} {'us/step':>9} {'x CartPole':>11}")
    for env_name, via, n, sec, ref in rows:
        print(f"{env_name:<18} {via:<9} {n!s:>4} {1 / sec:>10.0f} {sec * 1e6:>9.1f} "
              f"{sec / ref:>11.2f}")


if __name__ == "__main__":
    main()
