"""Learner updates/s: BDQ (branching, N=50) vs the flat masked DQN, same batch size.

What: one RLlib learner per algorithm, built from the same configs ``cloudrl.training``
uses (encoder hidden 128, head hiddens [128]; BDQ trunk [128] -> 12 branch heads), fed
synthetic batches of realistic shapes for N=50 servers (macro 23, servers 50x15, jobs
8x7; mask 421 with 12 branches for BDQ, 451 with one flat action for DQN). Rows:

* ``bdq update``: ``Learner.update(batch=MultiAgentBatch)`` on a prebuilt tensor batch
  (forward online + target on obs and next obs, branching loss, backward, Adam step);
* ``bdq replay+update``: the device-replay step of ``cloudrl.algorithms.bdq.training_step``:
  ``DeviceReplayBuffer.sample`` (n_step 3, 20k transitions) -> update -> priority update
  from the learner's TD-error tensor;
* ``dqn update``: RLlib's stock ``DQNTorchLearner`` with ``MaskedDQNTorchRLModule``
  (double Q, dueling off) on the flat env's shapes.

How: ``.venv/bin/python experiments/benchmarks/bench_bdq_learner.py [--batch 512] [--seconds 8]
[--threads T]`` (CPU; ``--device cuda`` on a GPU machine).

Results measured 2026-11-22 on 2 CPU cores shared with a running training sweep (load
average 3-5, so absolute numbers are low and noisy; rerun on an idle machine), torch
threads 2, batch 512, ``--seconds 20``:

    row                    updates/s  ms/update  samples/s
    bdq update                  0.54     1843.8        278
    bdq replay+update           0.46     2166.4        236
    dqn update                  1.07      934.6        548

A shorter run (``--seconds 8``) gave 0.33 / 0.28 / 1.19 updates/s. On the idle machine
(2026-11-22 01:26, ``--seconds 8``, torch threads 2) the same rows gave 7.39 / 6.54 /
10.72 updates/s (135 / 153 / 93 ms per update of 512): contention cost 14x. BDQ costs ~2x the flat
DQN per update on CPU: both run the shared encoder on 2B (online, obs + next obs) + B
(target) observations, but BDQ adds a trunk MLP and 13 heads (value + 12 branches, each
128 hidden) on the online and target passes (4-5x the matmul calls and Adam tensors).
The device-replay sample + priority update adds ~15% here (a gather of 512 x 2 x 5120
floats plus four tree levels), noise included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from cloudrl.algorithms.bdq import BDQConfig
from cloudrl.algorithms.bdq.training_step import replay_batch
from cloudrl.argparsing import CliParser
from cloudrl.replay import DeviceReplayBuffer, ReplayConfig
from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from models.bdq import BDQTorchRLModule
from models.masked_dqn import MaskedDQNTorchRLModule

N_SERVERS = 50
HIDDEN = 128


def random_obs(space: gym.spaces.Dict, batch: int, gen: torch.Generator,
               device: str) -> dict[str, torch.Tensor]:
    """Random features and a ~50% feasible mask of the space's shapes."""
    out = {k: torch.randn((batch, *space[k].shape), generator=gen)
           for k in space.spaces if k != "action_mask"}
    out["action_mask"] = (torch.rand(batch, space["action_mask"].shape[0], generator=gen)
                          < 0.5).float()
    return {k: v.to(device) for k, v in out.items()}


def random_actions(action_space: gym.Space, batch: int, gen: torch.Generator) -> torch.Tensor:
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        nvec = torch.as_tensor(action_space.nvec)
        return (torch.rand(batch, len(nvec), generator=gen) * nvec).long()
    return torch.randint(int(action_space.n), (batch,), generator=gen)


def synthetic_columns(env: gym.Env, batch: int, device: str, seed: int = 0
                      ) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    space = env.observation_space
    return {"obs": random_obs(space, batch, gen, device),
            "next_obs": random_obs(space, batch, gen, device),
            "action": random_actions(env.action_space, batch, gen).to(device),
            "reward": torch.randn(batch, generator=gen).to(device),
            "terminated": (torch.rand(batch, generator=gen) < 0.02).to(device)}


def tensor_batch(cols: dict[str, Any]) -> MultiAgentBatch:
    size = int(cols["reward"].shape[0])
    dev = cols["reward"].device
    batch = {Columns.OBS: cols["obs"], Columns.NEXT_OBS: cols["next_obs"],
             Columns.ACTIONS: cols["action"], Columns.REWARDS: cols["reward"],
             Columns.TERMINATEDS: cols["terminated"],
             "n_step": torch.full((size,), 3, device=dev), "weights": torch.ones(size, device=dev)}
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=size)


def build_learner(config: Any, module_class: type, env: gym.Env, device: str) -> Any:
    spec = RLModuleSpec(module_class=module_class, model_config={
        "encoder": {"hidden": HIDDEN}, "head_hiddens": [HIDDEN]})
    config = (config.environment(observation_space=env.observation_space,
                                 action_space=env.action_space)
              .learners(num_gpus_per_learner=1 if device.startswith("cuda") else 0)
              .rl_module(rl_module_spec=spec)
              .training(lr=5e-4, n_step=3, target_network_update_freq=1000, grad_clip=10.0))
    return config.build_learner(env=env)


def timed(step: Callable[[], None], seconds: float, device: str) -> tuple[int, float]:
    for _ in range(2):  # warm-up (allocations, first-call paths)
        step()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        n += 1
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return n, time.perf_counter() - start


def main() -> None:
    parser = CliParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    branching = ClusterBranchingEnv({"n_servers": N_SERVERS})
    flat = ClusterSchedulingEnv({"n_servers": N_SERVERS})
    ts = {NUM_ENV_STEPS_SAMPLED_LIFETIME: 0}
    bdq = build_learner(BDQConfig(), BDQTorchRLModule, branching, args.device)
    dqn = build_learner(DQNConfig().training(double_q=True, dueling=False),
                        MaskedDQNTorchRLModule, flat, args.device)
    bdq_batch = tensor_batch(synthetic_columns(branching, args.batch, args.device, 1))
    dqn_batch = tensor_batch(synthetic_columns(flat, args.batch, args.device, 2))

    replay_bdq = build_learner(BDQConfig().training(device_replay=True), BDQTorchRLModule,
                               branching, args.device)
    buffer = DeviceReplayBuffer(
        ReplayConfig(capacity=20_000, n_step=3, gamma=0.99, device=args.device),
        branching.observation_space, action_shape=(len(branching.action_space.nvec),))
    for seed in range(10):  # 20k single-step rows, one stream, episode ends ~1 in 50
        cols = synthetic_columns(branching, 2000, args.device, 100 + seed)
        buffer.add(cols)

    def replay_step() -> None:
        sample = buffer.sample(args.batch)
        replay_bdq.update(batch=replay_batch(sample), timesteps=ts)
        buffer.update_priorities(sample["indices"],
                                 replay_bdq.device_td_errors.pop(DEFAULT_MODULE_ID))

    rows = [("bdq update", lambda: bdq.update(batch=bdq_batch, timesteps=ts)),
            ("bdq replay+update", replay_step),
            ("dqn update", lambda: dqn.update(batch=dqn_batch, timesteps=ts))]
    print(f"device {args.device}, torch threads {torch.get_num_threads()}, batch {args.batch},"
          f" N={N_SERVERS}: BDQ {len(branching.action_space.nvec)} branches, mask "
          f"{branching.observation_space['action_mask'].shape[0]}; DQN {flat.action_space.n}"
          " actions")
    print(f"{'row':<22}{'updates/s':>10}{'ms/update':>11}{'samples/s':>11}")
    for name, step in rows:
        n, elapsed = timed(step, args.seconds, args.device)
        rate = n / elapsed
        print(f"{name:<22}{rate:>10.2f}{1000 / rate:>11.1f}{rate * args.batch:>11.0f}")


if __name__ == "__main__":
    main()
