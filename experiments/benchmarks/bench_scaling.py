"""Scaling: Ape-X BDQ vs RLlib's synchronous BDQ over 1, 2, 4 env runners, plus a model.

What it does:

1. Measured. On the branching cluster env (``cloudrl/ClusterBranching-v0``, N servers,
   poisson workload) it builds, for each number of remote env runners, both

   * ``apex``: :class:`cloudrl.algorithms.apex_bdq.ApexBDQ` (async runners with per-runner
     epsilon that assemble n-step transitions and compute their initial priorities, one replay shard
     actor, the local learner pulling batches asynchronously), and
   * ``sync``: the stock BDQ algorithm (``BDQConfig`` = DQN's synchronous
     ``training_step``: sample from all runners, add to the driver's
     ``PrioritizedEpisodeReplayBuffer``, update, repeat),

   from the same ``cloudrl.training.build_algo_config`` settings (8 vectorized envs per
   runner, batch 64, hidden 128, learning starts after 1000 env steps; ``--fragment``
   sets ``rollout_fragment_length`` for both, default DQN's "auto" = n_step = 3 steps per
   env; ``--max-replay-ratio`` caps Ape-X's learner and is the sync DQN's
   ``training_intensity``, the same ratio of trained samples to sampled steps). Each
   configuration trains for a warm-up (until the learner has updated and ``--warmup`` s
   have passed), then for a fixed wall-clock window (``--window`` s); the window's env
   steps/s and learner updates/s (calls of ``learner_group.update``, one gradient step
   on one batch each) are reported, with the driver's CPU use and the share of the window
   the driver spent inside learner updates. Ray gets ``num_cpus=8`` (``--num-cpus``) on
   the 2-core machine: every runner asks for 1 CPU, the shard for 1, so 4 runners + shard
   + driver oversubscribe the 2 cores ~3x. Scaling efficiency = throughput(2) /
   throughput(1) (the target for Ape-X: >= 1.7x).

2. Model. In-process, single torch thread, it times what one Ape-X shard and the learner
   do: ``ReplayShard.add`` of one runner call's complete transitions with their
   priorities (F rows: no model compute, the runners did it), ``ReplayShard.sample(64)``,
   ``ReplayShard.update_priorities`` of 64, and one learner update of 64 (the local
   ``BDQTorchLearner``), and r = env steps/s of one un-starved actor (the config's env
   runner class in-process for 15 s doing what ``sample_into_shard`` does:
   sample, n-step windows, initial priorities, numpy for the shard, metrics). With R
   runners, S shards and 1 learner, each on its own core:

   * runner demand:  E_R = R * r env steps/s;
   * learner demand: U_L = 1 / t_update updates/s (Ape-X learns as fast as it can);
   * a shard is one single-threaded actor serving adds and samples FIFO; its load at
     those demands is rho = (E_R / S / F) * t_add + (U_L / S) * (t_sample + t_prio);
   * rho <= 1: E = E_R (linear in R) and U = U_L (flat); rho > 1: the shards saturate
     and, serving FIFO, slow both by 1/rho: E = E_R / rho, U = U_L / rho. The ceiling of
     env steps/s is S * F / t_add (shards doing nothing but adds);
   * the learner's limit is on learning, not sampling: at replay ratio 1 it keeps up with
     B / t_update env steps/s; past that, more runners lower the replay ratio.

   Not modelled: the driver's per-report cost (one small report per runner call, ~6/s
   per runner at F=128), weight broadcasts (one ``ray.put`` per 4 updates, fanned out to R
   runners), the network. The reference system (Horgan et al., Ape-X) claims ~20x the env
   throughput of a single node with linear actor scaling up to hundreds of actors.

How to run (starts its own Ray; ~10 minutes for 2 kinds x 3 runner counts)::

    .venv/bin/python experiments/benchmarks/bench_scaling.py [--n-servers 15] [--runners 1 2 4]
        [--warmup 15] [--window 45] [--num-cpus 8] [--max-replay-ratio X]
        [--fragment 16] [--kinds apex sync] [--model-only] [--rate R]

Results measured 2026-11-22 06:54-07:10 on the idle 2-core dev machine (load average
1.5-3 from the runs themselves), N=15, 30 s windows after >= 10 s warm-up.

(a) Sampling scaling, learner nearly idle (``--max-replay-ratio 0.05 --fragment 16``;
the sync DQN at ``training_intensity`` 0.05)::

    algo  runners  env steps/s  updates/s  ms/update learn share driver cores replay ratio
    apex        1          778       0.59       47.8        0.03         0.09        0.049
    sync        1          674       1.05       43.4        0.05         0.24        0.100
    apex        2         1287       0.99       45.5        0.04         0.12        0.049
    sync        2          966       1.26       49.3        0.06         0.33        0.083
    scaling 1->2 runners: apex 1.65x, sync 1.43x; apex / sync 1.15x (1), 1.33x (2)

Run-to-run noise is large on this box: the same measurement at ``--fragment 32`` right
after another job gave 682 / 1021 env steps/s (1.50x).

Same, DQN's default fragment (``auto`` = 3 steps per env, 24 per call): apex 490 and 687
env steps/s with 1 and 2 runners (1.40x): per-call costs dominate 24-step rollouts, which
is why ``ApexBDQConfig`` defaults to ``rollout_fragment_length`` 16.

(b) Learning at replay ratio 1 (``--max-replay-ratio 1 --fragment 16 --runners 1 2 4``)::

    apex        1          653      10.20       47.2        0.48         0.63        1.000
    sync        1          255       7.97       50.4        0.40         0.65        2.000
    apex        2          654      10.34       49.1        0.51         0.65        1.013
    sync        2          381       8.93       47.7        0.43         0.73        1.500
    apex        4          817       7.63       49.7        0.38         0.50        0.598
    sync        4          427       8.33       48.6        0.40         0.69        1.250
    scaling 1->2: apex 1.00x, sync 1.49x; apex / sync: 2.56x (1), 1.72x (2), 1.92x (4)

With a learner doing ~10 updates of 64 per second, the one runner plus the learner
already fill the 2 cores (runner ~0.75 core, driver 0.63, shard and Ray the rest), so a
second runner has no core to run on: 1->2 is 1.00x here, and the >= 1.7x target is met
only in (a) (1.65x, with the learner idle). The sync DQN cannot hold the ratio at 1 with
one runner (its sample/update loop is serial; ratio 2.0) and is 1.7-2.6x slower.

Model (run (b)'s inputs: F=126 rows per call, t_add 1.31 ms, t_sample(64) 0.73 ms,
t_prio(64) 0.40 ms, t_update(64) 41.6 ms, r = 873 env steps/s per un-starved actor)::

    runners shards  env steps/s x 1 runner  updates/s shard load replay ratio  bound
         16      1        13969       16.0       24.0       0.17        0.110  runners
         64      1        55876       64.0       24.0       0.61        0.028  runners
        128      1        94291      108.0       20.3       1.19        0.014  shards
        128      4       111752      128.0       24.0       0.30        0.014  runners

Since the actors compute the initial priorities (Ape-X's design), a shard stores ~96k
env steps/s (it did ~2.7k when it ran the priority forward pass itself: a 24-row add took
9 ms), so one shard feeds ~100 actors and 4 shards keep 128 actors linear. The learner is
the real limit: one CPU learner at replay ratio 1 keeps up with ~1.5k env steps/s, about
two actors; beyond that actors add data diversity but the replay ratio falls as 1/R, so a
cluster needs a GPU learner with large batches (README, "Sizing a cluster").

Re-measured with the faster BDQ learner and the batched env runner (``--model-only --fragment
16``, 2026-11-23 22:45 UTC, load ~0.9): F=126, t_add 0.94 ms, t_sample(64) 0.61 ms,
t_prio(64) 0.33 ms, **t_update(64) 22.2 ms** (was 41.6), r = 2,218 env steps/s per actor
(was 873). At replay ratio 1 the learner keeps up with 2,882 env steps/s (1.9x), i.e. 1.3
of today's faster actors; a shard stores ~135k env steps/s (4 shards: 128 runners linear).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from cloudrl.algorithms.apex_bdq import ApexBDQConfig, ReplayShard
from cloudrl.algorithms.apex_bdq.actor_side import NStepAssembler, as_numpy, initial_td_abs
from cloudrl.algorithms.bdq.training_step import replay_batch
from cloudrl.argparsing import CliParser
from cloudrl.replay import ReplayConfig
from cloudrl.training import TrainConfig, build_algo_config, env_steps_of
from envs.cluster_env import ClusterBranchingEnv
from models.bdq import BDQTorchRLModule

BATCH = 64
N_STEP = 3
ENVS_PER_RUNNER = 8
HIDDEN = 128
LEARNING_STARTS = 1000


def algo_config(kind: str, runners: int, n_servers: int,
                max_replay_ratio: float | None = None, fragment: int | None = None) -> Any:
    """``build_algo_config``'s BDQ; for ``apex`` the same settings in an ApexBDQConfig
    (``fragment``: ``rollout_fragment_length`` per env, None: DQN's auto = n_step; a
    ``max_replay_ratio`` caps Ape-X's learner and is the sync DQN's ``training_intensity``)."""
    cfg = TrainConfig(algo="bdq", env={"n_servers": n_servers, "workload": {"kind": "poisson"}},
                      num_env_runners=runners, env_steps=1_000_000,
                      envs_per_runner=ENVS_PER_RUNNER, hidden=HIDDEN,
                      hparams={"num_steps_sampled_before_learning_starts": LEARNING_STARTS,
                               "train_batch_size_per_learner": BATCH, "n_step": N_STEP})
    config = build_algo_config(cfg)
    config.env_runners(num_cpus_per_env_runner=1.0)
    if fragment:
        config.env_runners(rollout_fragment_length=fragment)
    if kind == "sync":  # DQN's training_intensity is the same ratio as max_replay_ratio
        return config.training(training_intensity=max_replay_ratio)
    apex = ApexBDQConfig().update_from_dict(config.to_dict())
    assert apex.env_config == config.env_config and apex.num_env_runners == runners
    return apex.training(num_replay_shards=1, num_cpus_per_replay_shard=1.0,
                         replay_shard_capacity=100_000, max_replay_ratio=max_replay_ratio)


def bench(kind: str, runners: int, n_servers: int, warmup_s: float, window_s: float,
          max_replay_ratio: float | None = None, fragment: int | None = None
          ) -> dict[str, Any]:
    """Warm-up, then ``window_s`` of ``algo.train()``: env steps/s and learner updates/s."""
    t0 = time.perf_counter()
    algo = algo_config(kind, runners, n_servers, max_replay_ratio, fragment).build_algo()
    build_s = time.perf_counter() - t0
    updates, update_s = [0], [0.0]
    original = algo.learner_group.update

    def counted(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            updates[0] += 1
            update_s[0] += time.perf_counter() - start

    algo.learner_group.update = counted
    try:
        start = time.perf_counter()
        result = algo.train()
        while (updates[0] == 0 or time.perf_counter() - start < warmup_s) and \
                time.perf_counter() - start < 4 * warmup_s + 60:
            result = algo.train()
        steps0, upd0, upd_s0 = env_steps_of(result), updates[0], update_s[0]
        t0, c0 = time.perf_counter(), time.process_time()
        iters = 0
        while time.perf_counter() - t0 < window_s:
            result = algo.train()
            iters += 1
        elapsed, driver_cpu = time.perf_counter() - t0, time.process_time() - c0
        steps = env_steps_of(result) - steps0
        n_upd = updates[0] - upd0
        learn_s = update_s[0] - upd_s0
    finally:
        algo.stop()
    return {"kind": kind, "runners": runners, "build_s": build_s, "seconds": elapsed,
            "iters": iters, "steps_per_s": steps / elapsed, "updates_per_s": n_upd / elapsed,
            "ms_per_update": 1000 * learn_s / max(1, n_upd),
            "learn_share": learn_s / elapsed, "driver_cores": driver_cpu / elapsed,
            "replay_ratio": n_upd * BATCH / max(1, steps)}


# -- in-process costs for the model -----------------------------------------------------------

def fragment_rows(env: ClusterBranchingEnv, n: int, seed: int, stream: int) -> dict[str, Any]:
    """``n`` single-step rows as ``episodes_to_transitions`` makes them (real obs shapes)."""
    space = env.observation_space
    space.seed(seed)
    obs = [space.sample() for _ in range(n + 1)]
    stack = {k: np.stack([o[k] for o in obs]).astype(np.float32) for k in obs[0]}
    stack["action_mask"] = np.ones_like(stack["action_mask"])
    rng = np.random.default_rng(seed)
    return {"obs": {k: v[:-1] for k, v in stack.items()},
            "next_obs": {k: v[1:] for k, v in stack.items()},
            "action": rng.integers(0, np.asarray(env.branch_sizes),
                                   size=(n, len(env.branch_sizes))).astype(np.int64),
            "reward": rng.normal(size=n).astype(np.float32),
            "terminated": np.zeros(n, dtype=bool), "truncated": np.zeros(n, dtype=bool),
            "stream_id": np.full(n, stream, dtype=np.int64)}


def median_s(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def runner_rate(n_servers: int, seconds: float, fragment: int | None = None) -> float:
    """Env steps/s of one Ape-X actor in-process, 1 thread: sample, n-step windows and
    initial priorities (:mod:`cloudrl.algorithms.apex_bdq.actor_side`), numpy for the shard,
    metrics."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from cloudrl.algorithms.apex_bdq.actor_side import NStepAssembler, as_numpy, initial_td_abs
    from cloudrl.algorithms.apex_bdq.runner import runner_module
    from cloudrl.algorithms.bdq.training_step import EpisodeStreams, episodes_to_transitions

    torch.set_num_threads(1)
    config = algo_config("apex", 1, n_servers, fragment=fragment)
    runner = (config.env_runner_cls or SingleAgentEnvRunner)(config=config, worker_index=1)
    module = runner_module(runner)
    streams = EpisodeStreams(2 * ENVS_PER_RUNNER)
    assembler = NStepAssembler(module.observation_space, len(module.action_space.nvec),
                               N_STEP, 0.99, 2 * ENVS_PER_RUNNER)

    def actor_step() -> int:
        episodes = runner.sample()
        done = assembler.push(episodes_to_transitions(episodes, streams))
        if done is not None:
            initial_td_abs(module, done, 0.99)
            as_numpy(done)
        runner.get_metrics()
        return sum(len(ep) for ep in episodes)

    for _ in range(5):
        actor_step()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps += actor_step()
    rate = steps / (time.perf_counter() - t0)
    runner.stop()
    return rate


def component_costs(n_servers: int, fragment: int, reps: int = 60) -> dict[str, float]:
    """Seconds per shard add (``fragment`` complete transitions with their priorities),
    sample (64), priority update (64), learner update (64)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    env = ClusterBranchingEnv({"n_servers": n_servers})
    streams = 2 * ENVS_PER_RUNNER
    model_config = {"encoder": {"hidden": HIDDEN}, "head_hiddens": [HIDDEN]}
    spec = RLModuleSpec(module_class=BDQTorchRLModule, observation_space=env.observation_space,
                        action_space=env.action_space, model_config=model_config)
    config = (ApexBDQConfig()
              .environment(observation_space=env.observation_space,
                           action_space=env.action_space)
              .env_runners(num_env_runners=1, num_envs_per_env_runner=ENVS_PER_RUNNER)
              .rl_module(rl_module_spec=spec)
              .training(n_step=N_STEP, train_batch_size_per_learner=BATCH, lr=5e-4,
                        num_replay_shards=1))
    learner = config.build_learner(env=env)
    module = learner.module[DEFAULT_MODULE_ID]
    shard = ReplayShard(0, 1, ReplayConfig(capacity=100_000, gamma=0.99),
                        env.observation_space, env.action_space)
    assembler = NStepAssembler(env.observation_space, len(env.branch_sizes), N_STEP, 0.99,
                               num_streams=streams)
    pool = []
    for seed in range(16):  # what runners send: complete transitions + their priorities
        done = assembler.push(fragment_rows(env, fragment, seed, seed % streams))
        pool.append((as_numpy(done), initial_td_abs(module, done, 0.99).numpy()))
    for transitions, td in pool * 8:  # thousands of transitions stored before timing
        shard.add(transitions, td)
    it = iter(range(10**9))
    t_add = median_s(lambda: shard.add(*pool[next(it) % len(pool)]), reps)
    t_sample = median_s(lambda: shard.sample(BATCH), reps)
    reply = shard.sample(BATCH)
    td = torch.rand(BATCH)
    t_prio = median_s(lambda: shard.update_priorities(
        reply["batch"]["indices"], reply["stamps"], td, reply["incarnation"]), reps)
    sample = {k: v for k, v in reply["batch"].items() if k != "indices"}
    ts = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 10**6}

    def update() -> None:
        learner.update(batch=replay_batch(sample), timesteps=ts)
        learner.device_td_errors.pop(DEFAULT_MODULE_ID, None)

    t_update = median_s(update, max(10, reps // 3))
    return {"fragment": float(np.mean([len(t[1]) for t in pool])), "t_add": t_add,
            "t_sample": t_sample,
            "t_prio": t_prio, "t_update": t_update}


def predict(runners: int, shards: int, rate: float, c: dict[str, float]) -> dict[str, Any]:
    """The throughput model of the module docstring."""
    demand_e = runners * rate
    demand_u = 1.0 / c["t_update"]
    rho = (demand_e / shards / c["fragment"]) * c["t_add"] + \
        (demand_u / shards) * (c["t_sample"] + c["t_prio"])
    slow = max(1.0, rho)
    return {"runners": runners, "shards": shards, "env_steps_per_s": demand_e / slow,
            "updates_per_s": demand_u / slow, "shard_load": rho,
            "bound": "shards" if rho > 1 else "runners (linear)"}


def print_model(costs: dict[str, float], rate: float, measured_1: float | None) -> None:
    f = costs["fragment"]
    print(f"\nmodel inputs (in-process, 1 torch thread): fragment F={f:.0f} rows, "
          f"t_add={1000 * costs['t_add']:.2f} ms, t_sample(64)="
          f"{1000 * costs['t_sample']:.2f} ms, t_prio(64)={1000 * costs['t_prio']:.2f} ms, "
          f"t_update(64)={1000 * costs['t_update']:.1f} ms; per-runner rate r={rate:.0f} "
          "env steps/s")
    print(f"shard add ceiling S*F/t_add = S x {f / costs['t_add']:.0f} env steps/s; learner "
          f"1/t_update = {1 / costs['t_update']:.1f} updates/s "
          f"({BATCH / costs['t_update']:.0f} samples/s)")
    print(f"{'runners':>7} {'shards':>6} {'env steps/s':>12} {'x 1 runner':>10} "
          f"{'updates/s':>10} {'shard load':>10} {'replay ratio':>12}  bound")
    for runners in (16, 64, 128):
        for shards in (1, 4, 8):
            p = predict(runners, shards, rate, costs)
            ratio = p["updates_per_s"] * BATCH / p["env_steps_per_s"]
            print(f"{runners:>7} {shards:>6} {p['env_steps_per_s']:>12.0f} "
                  f"{p['env_steps_per_s'] / rate:>10.1f} {p['updates_per_s']:>10.1f} "
                  f"{p['shard_load']:>10.2f} {ratio:>12.3f}  {p['bound']}")
    feed = BATCH / costs["t_update"]
    print(f"learner: at replay ratio 1 it keeps up with {feed:.0f} env steps/s = "
          f"{feed / rate:.1f} runners; beyond that more runners only lower the replay ratio "
          "(a GPU learner or larger batches move this limit)")
    best = predict(128, 8, rate, costs)["env_steps_per_s"]
    print(f"reference (Ape-X paper): ~20x one node, linear in actors. Model at 128 runners, "
          f"8 shards: {best / rate:.0f}x one runner"
          + (f" (measured 1-runner rate here: {measured_1:.0f} env steps/s)"
             if measured_1 else ""))


def main() -> None:
    parser = CliParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-servers", type=int, default=15)
    parser.add_argument("--runners", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--kinds", nargs="+", default=["apex", "sync"],
                        choices=("apex", "sync"))
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--window", type=float, default=45.0)
    parser.add_argument("--num-cpus", type=int, default=8)
    parser.add_argument("--max-replay-ratio", type=float, default=None,
                        help="Ape-X max_replay_ratio (default None: the learner runs free)")
    parser.add_argument("--fragment", type=int, default=None,
                        help="Ape-X rollout_fragment_length per env (default: DQN's auto, "
                             "= n_step)")
    parser.add_argument("--model-only", action="store_true", help="skip the Ray runs")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="per-runner env steps/s for the model (default: measured "
                             "in-process, one runner sampling alone)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)

    rows: list[dict[str, Any]] = []
    if not args.model_only:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False)
        for runners in args.runners:
            for kind in args.kinds:
                row = bench(kind, runners, args.n_servers, args.warmup, args.window,
                            args.max_replay_ratio, args.fragment)
                rows.append(row)
                print(f"{kind} runners={runners}: {row['steps_per_s']:.0f} env steps/s, "
                      f"{row['updates_per_s']:.2f} updates/s (load {os.getloadavg()[0]:.1f})",
                      flush=True)
        ray.shutdown()

    rows_per_call = (args.fragment or N_STEP) * ENVS_PER_RUNNER
    costs = component_costs(args.n_servers, rows_per_call)
    rate = args.rate or runner_rate(args.n_servers, seconds=15.0, fragment=args.fragment)
    print(f"load average after: {os.getloadavg()}")

    if rows:
        print(f"\nN={args.n_servers}, poisson, {ENVS_PER_RUNNER} envs/runner, batch {BATCH}, "
              f"window {args.window:.0f} s after >= {args.warmup:.0f} s warm-up, "
              f"ray num_cpus={args.num_cpus} on {os.cpu_count()} cores")
        print(f"{'algo':<5} {'runners':>7} {'env steps/s':>12} {'updates/s':>10} "
              f"{'ms/update':>10} {'learn share':>11} {'driver cores':>12} {'replay ratio':>12}")
        for r in rows:
            print(f"{r['kind']:<5} {r['runners']:>7} {r['steps_per_s']:>12.0f} "
                  f"{r['updates_per_s']:>10.2f} {r['ms_per_update']:>10.1f} "
                  f"{r['learn_share']:>11.2f} {r['driver_cores']:>12.2f} "
                  f"{r['replay_ratio']:>12.3f}")
        print("\nscaling vs 1 runner (env steps/s ratio, updates/s ratio):")
        for kind in args.kinds:
            by_r = {r["runners"]: r for r in rows if r["kind"] == kind}
            if 1 not in by_r:
                continue
            base = by_r[1]
            parts = [f"{n} runners: {by_r[n]['steps_per_s'] / base['steps_per_s']:.2f}x / "
                     f"{by_r[n]['updates_per_s'] / max(1e-9, base['updates_per_s']):.2f}x"
                     for n in sorted(by_r) if n != 1]
            print(f"  {kind:<5} " + "; ".join(parts))
        apex_1 = next((r for r in rows if r["kind"] == "apex" and r["runners"] == 1), None)
        sync = {r["runners"]: r for r in rows if r["kind"] == "sync"}
        for r in rows:
            if r["kind"] == "apex" and r["runners"] in sync:
                s = sync[r["runners"]]
                print(f"  apex / sync at {r['runners']} runners: env steps/s "
                      f"{r['steps_per_s'] / s['steps_per_s']:.2f}x, updates/s "
                      f"{r['updates_per_s'] / max(1e-9, s['updates_per_s']):.2f}x")
    else:
        apex_1 = None
    print_model(costs, rate, apex_1["steps_per_s"] if apex_1 else None)


if __name__ == "__main__":
    main()
