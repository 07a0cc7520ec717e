"""Env step throughput: both cluster interfaces vs CartPole-v1, single and batched, same run.

What it does: steps each env for a fixed number of steps with a trivial
policy (flat: first feasible placement, else wait; branching: slot 0 on its
first feasible server, other slots defer, tiers hold), timing only
``env.step`` (and ``reset`` at episode ends), and prints steps/s, µs/step
and the cost of a step relative to a CartPole-v1 step measured in the same
process. Raw env classes are compared with raw CartPoleEnv; the
``gym.make`` rows compare both through gymnasium's wrappers.

The second table is the cost per env step of B envs stepped together at
N=50: gymnasium's ``SyncVectorEnv`` of the single env and the natively batched env
(``envs.vector_env``, one numba call per step), B = 1, 8, 32, 128, against the raw
CartPole step. Every row is the best of ``--repeats`` blocks (the machine is shared;
the best block is the least disturbed one), and ``os.getloadavg()`` is printed
before and after.

The third table puts the envs with exogenous signals (``EnvConfig.signals``: price,
carbon, forecasts; the default ``SignalConfig``, no solar) beside the same envs without,
at N=50: the single env (resets included, as above) and the batched env at B=32, with the
ratio signals / no signals (target <= 1.2x). The two are timed in alternating blocks
(best of ``--repeats`` each) so that load changes hit both alike. It also prints the cost
of one reset with and without signals (the signals' series and forecast summary are built
there; on a repeated seed they come from a per-process cache) and that cost spread over an
episode's ticks (what a batched env's autoreset adds per env step, which the batched rows
do not include: their blocks end before an episode does), then the batched rows with that
reset cost added, and the batched env measured over whole episodes, its autoresets (new
seeds, so every one builds its signals) timed with the steps. Every block uses new episode
seeds, so the single-env rows pay the uncached build at each reset.

Run:  .venv/bin/python -m experiments.benchmarks.bench_env [--steps 20000] [--repeats 3]
      [--signals-only] [--cpu-clock]

Targets: at N=50 a single-env step costs <= 5x a CartPole step; the batched
env's cost per env step at B=32, N=50 is <= 1x a CartPole step.
Results to expect (2-core CI-class machine, numba kernels warm; see README
for the table measured in this change): CartPole ~8-9 µs/step; near idle, cluster
flat N=50 ~3.5x CartPole, branching N=50 ~4.3x (single-env observation in one numba
call), N=200 ~4-6x; batched at B=32 ~0.4x.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

import envs  # noqa: F401  (registers the gymnasium ids)
from cloudrl.argparsing import CliParser
from envs import kernels
from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from envs.vector_env import ClusterBranchingVectorEnv, ClusterSchedulingVectorEnv
from envs.vector_env import warm_up as vector_warm_up

_clock = time.perf_counter  # --cpu-clock: time.process_time


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


def time_env(env, policy, steps: int, seed: int = 0, repeats: int = 1) -> float:
    """Mean seconds per ``env.step`` (resets included) over ``steps`` steps; the best of
    ``repeats`` such blocks."""
    obs, _ = env.reset(seed=seed)
    best = float("inf")
    for _ in range(repeats):
        elapsed = 0.0
        for i in range(steps):
            action = policy(obs)
            t0 = _clock()
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs, _ = env.reset(seed=seed + i)
            elapsed += _clock() - t0
        best = min(best, elapsed / steps)
    return best


def _batched_policy(single, n_envs: int, branching: bool):
    """The trivial policies above for B envs at once (numpy over the batch)."""
    n, rows = single.n_servers, np.arange(n_envs)
    if not branching:
        wait = single.wait_action
        n_place = wait - n

        def act(obs):
            m = obs["action_mask"][:, :n_place]
            i = m.argmax(axis=1)
            return np.where(m[rows, i] > 0, i, wait)
        return act
    k = single.queue_window
    hold = np.array([n] * k + [1] * single.n_tiers + [0], dtype=np.int64)

    def act_b(obs):
        a = np.tile(hold, (n_envs, 1))
        row = obs["action_mask"][:, :n]
        i = row.argmax(axis=1)
        a[:, 0] = np.where(row[rows, i] > 0, i, n)
        return a
    return act_b


def time_vector(vec, policy, env_steps: int, seed: int = 0, repeats: int = 1) -> float:
    """Seconds per env step (batched step / B; autoresets included), best of ``repeats``."""
    obs, _ = vec.reset(seed=seed)
    steps = max(20, env_steps // vec.num_envs)
    best = float("inf")
    for _ in range(repeats):
        elapsed = 0.0
        for _ in range(steps):
            action = policy(obs)
            t0 = _clock()
            obs, _, _, _, _ = vec.step(action)
            elapsed += _clock() - t0
        best = min(best, elapsed / (steps * vec.num_envs))
    return best


def time_vector_episodes(vec, policy, env_steps: int, seed: int = 0) -> float:
    """Seconds per env step of the batched env over whole episodes of its sub-envs (at
    least one, about ``env_steps`` env steps), the autoresets that start the next episodes
    timed with the steps (on new seeds: without a seed pool each sub-env draws its next
    seed). The step after the last tick only resets, so per ``episode_length`` env steps
    there are ``episode_length + 1`` batched steps."""
    length = vec.config.sim.episode_length
    episodes = max(1, env_steps // (length * vec.num_envs))
    obs, _ = vec.reset(seed=seed)
    elapsed = 0.0
    for _ in range(episodes * (length + 1)):
        action = policy(obs)
        t0 = _clock()
        obs, _, _, _, _ = vec.step(action)
        elapsed += _clock() - t0
    return elapsed / (episodes * length * vec.num_envs)


def _load() -> str:
    return "load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def single_rows(sizes: list[int], steps: int, repeats: int, cart_raw: float,
                cart_made: float) -> list[tuple]:
    rows = []
    for n in sizes:
        cfg = {"n_servers": n}
        for name, cls, make_id, pol in (
            ("flat", ClusterSchedulingEnv, envs.FLAT_ID, _flat_policy),
            ("branching", ClusterBranchingEnv, envs.BRANCHING_ID, _branching_policy),
        ):
            env = cls(cfg)
            rows.append((f"cluster {name}", "raw", n,
                         time_env(env, pol(env), steps, repeats=repeats), cart_raw))
            made = gym.make(make_id, config=cfg, disable_env_checker=True)
            rows.append((f"cluster {name}", "gym.make", n,
                         time_env(made, pol(made), steps, repeats=repeats), cart_made))
    return rows


def vector_rows(batches: list[int], n: int, steps: int, repeats: int, cart: float
                ) -> list[tuple]:
    rows = []
    cfg = {"n_servers": n}
    for name, single_cls, vec_cls, branching in (
        ("flat", ClusterSchedulingEnv, ClusterSchedulingVectorEnv, False),
        ("branching", ClusterBranchingEnv, ClusterBranchingVectorEnv, True),
    ):
        single = single_cls(cfg)
        pol = (_branching_policy if branching else _flat_policy)(single)
        rows.append((name, "single env", 1, time_env(single, pol, steps, repeats=repeats),
                     cart))
        for b in batches:
            policy = _batched_policy(single, b, branching)
            sync = gym.vector.SyncVectorEnv([lambda c=single_cls: c(cfg) for _ in range(b)])
            rows.append((name, "SyncVectorEnv", b,
                         time_vector(sync, policy, steps, repeats=repeats), cart))
            rows.append((name, "batched", b,
                         time_vector(vec_cls(b, cfg), policy, steps, repeats=repeats), cart))
    return rows


def signal_rows(n: int, batch: int, steps: int, repeats: int) -> list[tuple]:
    """(interface, via, B, seconds without signals, seconds with) per env step; alternating
    blocks, best of ``repeats`` each. Per interface: the single env, the batched env's
    steps, the batched env over whole episodes with its autoresets (via ``episodes``)."""
    rows = []
    for name, single_cls, vec_cls, branching in (
        ("flat", ClusterSchedulingEnv, ClusterSchedulingVectorEnv, False),
        ("branching", ClusterBranchingEnv, ClusterBranchingVectorEnv, True),
    ):
        cfgs = ({"n_servers": n}, {"n_servers": n, "signals": {}})
        singles = [single_cls(c) for c in cfgs]
        pols = [(_branching_policy if branching else _flat_policy)(e) for e in singles]
        vecs = [vec_cls(batch, c) for c in cfgs]
        vpols = [_batched_policy(e, batch, branching) for e in singles]
        best_single, best_vec, best_ep = ([float("inf")] * 2 for _ in range(3))
        for r in range(repeats):
            seed = (r + 1) * 1_000_000  # new episode seeds every block: no cached signals
            for k in (0, 1):
                best_single[k] = min(best_single[k],
                                     time_env(singles[k], pols[k], steps, seed=seed))
                best_vec[k] = min(best_vec[k],
                                  time_vector(vecs[k], vpols[k], steps, seed=seed))
                best_ep[k] = min(best_ep[k],
                                 time_vector_episodes(vecs[k], vpols[k], steps, seed=seed))
        rows.append((name, "single env", 1, *best_single))
        rows.append((name, "batched", batch, *best_vec))
        rows.append((name, "episodes", batch, *best_ep))
    return rows


def reset_costs(n: int, resets: int = 30, repeats: int = 7) -> tuple[float, float, float]:
    """Seconds per ``reset(seed=...)`` of the flat single env: without signals, with signals
    on new seeds, with signals on repeated seeds (from the cache); alternating blocks of
    ``resets`` resets, best of ``repeats`` each."""
    plain = ClusterSchedulingEnv({"n_servers": n})
    sig = ClusterSchedulingEnv({"n_servers": n, "signals": {}})
    pool = [10**7 + i for i in range(resets)]
    for seed in pool:  # fill the cache
        sig.reset(seed=seed)
    best = [float("inf")] * 3
    for r in range(repeats):
        new = [10**8 + r * resets + i for i in range(resets)]
        for k, (env, seeds) in enumerate(((plain, new), (sig, new), (sig, pool))):
            t0 = _clock()
            for seed in seeds:
                env.reset(seed=seed)
            best[k] = min(best[k], (_clock() - t0) / resets)
    return best[0], best[1], best[2]


def print_signal_table(n: int, batch: int, steps: int, repeats: int) -> None:
    rows = signal_rows(n, batch, steps, repeats)
    print(f"\nwith signals (default SignalConfig) beside without, N={n}, per env step")
    print(f"{'interface':<10} {'via':<11} {'B':>4} {'us no signals':>14} "
          f"{'us signals':>11} {'signals/none':>13}")
    for name, via, b, none, sig in rows:
        if via == "episodes":
            continue
        print(f"{name:<10} {via:<11} {b:>4} {none * 1e6:>14.2f} {sig * 1e6:>11.2f} "
              f"{sig / none:>12.2f}x")
    length = ClusterSchedulingEnv({"n_servers": n}).config.sim.episode_length
    r_none, r_sig, r_cached = reset_costs(n, repeats=max(7, repeats))
    print(f"reset (flat, single env): {r_none * 1e3:.2f} ms without signals, "
          f"{r_sig * 1e3:.2f} ms with (new seeds), {r_cached * 1e3:.2f} ms with on repeated "
          f"seeds (signals cached); spread over a {length}-tick episode: "
          f"{r_none / length * 1e6:.2f} / {r_sig / length * 1e6:.2f} / "
          f"{r_cached / length * 1e6:.2f} us per env step")
    for name, via, b, none, sig in rows:
        if via != "batched":
            continue
        base = none + r_none / length
        fresh, pool = sig + r_sig / length, sig + r_cached / length
        print(f"{name} batched B={b} with its autoreset spread over the episode: "
              f"{base * 1e6:.2f} us no signals, {fresh * 1e6:.2f} us signals on new seeds "
              f"({fresh / base:.2f}x), {pool * 1e6:.2f} us on a seed pool ({pool / base:.2f}x)")
    for name, via, b, none, sig in rows:
        if via == "episodes":
            print(f"{name} batched B={b} over whole episodes, autoresets on new seeds timed "
                  f"in the steps: {none * 1e6:.2f} us no signals, {sig * 1e6:.2f} us signals "
                  f"({sig / none:.2f}x)")


def main() -> None:
    parser = CliParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[15, 50, 200])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--vector-n", type=int, default=50, help="N of the batched table")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--signal-batch", type=int, default=32,
                        help="B of the batched rows of the signals table")
    parser.add_argument("--signals-only", action="store_true",
                        help="only the signals table (signals beside no signals)")
    parser.add_argument("--cpu-clock", action="store_true",
                        help="time with this process's CPU clock (time.process_time) instead "
                        "of the wall clock: on a shared, overloaded machine it leaves out the "
                        "time other processes hold the cores")
    args = parser.parse_args()
    if args.cpu_clock:
        global _clock
        _clock = time.process_time
    kernels.warm_up()
    vector_warm_up()
    print(_load(), "(start)", flush=True)
    if args.signals_only:
        print_signal_table(args.vector_n, args.signal_batch, args.steps, args.repeats)
        print(_load(), "(end)")
        return

    def cartpole(env):
        return time_env(env, lambda o: 0 if o[2] < 0 else 1, args.steps, repeats=args.repeats)

    cart_raw = cartpole(CartPoleEnv())
    cart_made = cartpole(gym.make("CartPole-v1"))
    rows = [("CartPole-v1", "raw", "-", cart_raw, cart_raw),
            ("CartPole-v1", "gym.make", "-", cart_made, cart_made)]
    rows += single_rows(args.sizes, args.steps, args.repeats, cart_raw, cart_made)
    vrows = vector_rows(args.batches, args.vector_n, args.steps, args.repeats, cart_raw)
    cart_end = cartpole(CartPoleEnv())

    print(f"{'env':<18} {'via':<9} {'N':>4} {'steps/s':>10} {'us/step':>9} {'x CartPole':>11}")
    for env_name, via, n, sec, ref in rows:
        print(f"{env_name:<18} {via:<9} {n!s:>4} {1 / sec:>10.0f} {sec * 1e6:>9.1f} "
              f"{sec / ref:>11.2f}")
    print(f"\nper env step of B envs stepped together, N={args.vector_n} "
          f"(x CartPole: raw CartPole step {cart_raw * 1e6:.1f} us; "
          f"{cart_end * 1e6:.1f} us re-measured after the table)")
    print(f"{'interface':<10} {'via':<14} {'B':>4} {'env steps/s':>12} {'us/env step':>12} "
          f"{'x CartPole':>11}")
    for name, via, b, sec, ref in vrows:
        print(f"{name:<10} {via:<14} {b:>4} {1 / sec:>12.0f} {sec * 1e6:>12.2f} "
              f"{sec / ref:>11.2f}")
    print_signal_table(args.vector_n, args.signal_batch, args.steps, args.repeats)
    print(_load(), "(end)")


if __name__ == "__main__":
    main()
