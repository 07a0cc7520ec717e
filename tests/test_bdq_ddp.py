"""BDQ on DDP learners: ``num_learners=2`` (gloo on CPU) matches one learner.

Two remote learners each get half of a batch of 2B (``LearnerGroup`` shards it), DDP
averages their gradients; one local learner gets all 2B rows. Same initial weights, same
batch: same weights after k updates, and every TD-error priority goes back to the replay
slot it was computed on (the shards report their slots next to their errors).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID

from cloudrl.algorithms.bdq import BDQConfig
from cloudrl.algorithms.bdq.training_step import update_learners
from cloudrl.replay import DeviceReplayBuffer, ReplayConfig
from envs.cluster_env import ClusterBranchingEnv

ENV_CONFIG = {"n_servers": 5, "sim": {"episode_length": 50}, "seed_pool": [0, 1, 2]}
TINY_MODEL = {"encoder": {"hidden": 16, "macro_hiddens": [16], "row_hiddens": [8]},
              "trunk_hiddens": [16], "head_hiddens": [8]}
MODULE_STATE = f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}"


def bdq_config(env: ClusterBranchingEnv, num_learners: int) -> BDQConfig:
    return (BDQConfig()
            .environment(observation_space=env.observation_space,
                         action_space=env.action_space)
            .rl_module(model_config=TINY_MODEL)
            .training(lr=1e-2, n_step=3, grad_clip=10.0, device_replay=True,
                      target_network_update_freq=10_000)
            .learners(num_learners=num_learners, num_cpus_per_learner=1)
            .debugging(seed=0))


def filled_buffer(env: ClusterBranchingEnv, rows: int = 300) -> DeviceReplayBuffer:
    buffer = DeviceReplayBuffer(ReplayConfig(capacity=rows + 10, n_step=3, gamma=0.99),
                                env.observation_space,
                                action_shape=(len(env.action_space.nvec),))
    gen = torch.Generator().manual_seed(0)
    space = env.observation_space

    def obs() -> dict[str, torch.Tensor]:
        out = {k: torch.randn((rows, *space[k].shape), generator=gen)
               for k in ("macro", "servers", "jobs")}
        out["action_mask"] = (torch.rand(rows, space["action_mask"].shape[0],
                                         generator=gen) < 0.6).float()
        return out

    nvec = torch.as_tensor(env.action_space.nvec)
    buffer.add({"obs": obs(), "next_obs": obs(),
                "action": (torch.rand(rows, len(nvec), generator=gen) * nvec).long(),
                "reward": torch.randn(rows, generator=gen),
                "terminated": torch.rand(rows, generator=gen) < 0.05})
    return buffer


def module_state(group: Any) -> dict[str, torch.Tensor]:
    state = group.get_state(components=MODULE_STATE)
    return {k: torch.as_tensor(v) for k, v in
            state[COMPONENT_LEARNER][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID].items()}


def by_slot(slots: torch.Tensor, td: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort(slots, stable=True)
    return slots[order], td[order]


def test_device_replay_rejects_a_single_remote_learner() -> None:
    env = ClusterBranchingEnv(ENV_CONFIG)
    with pytest.raises(ValueError, match="num_learners >= 2"):
        bdq_config(env, num_learners=1).validate()
    bdq_config(env, num_learners=2).validate()  # DDP: allowed


@pytest.mark.slow
def test_two_ddp_learners_match_one_learner_at_twice_the_batch(ray_session: None) -> None:
    env = ClusterBranchingEnv(ENV_CONFIG)
    local = bdq_config(env, 0).build_learner_group(env=env)
    ddp = bdq_config(env, 2).build_learner_group(env=env)
    try:
        ddp.set_state(local.get_state(components=MODULE_STATE))
        start = module_state(local)
        for name, value in module_state(ddp).items():
            assert torch.equal(value, start[name]), name
        buffer = filled_buffer(env)
        ts = {"num_env_steps_sampled_lifetime": 0}
        for k in range(3):
            sample = buffer.sample(64, generator=torch.Generator().manual_seed(k))
            _, (slots_local, td_local) = update_learners(local, sample, ts)
            results, (slots_ddp, td_ddp) = update_learners(ddp, sample, ts)
            assert len(results) == 2  # one result per learner shard
            assert torch.equal(slots_local, sample["indices"])
            s_local, t_local = by_slot(slots_local, td_local.detach())
            s_ddp, t_ddp = by_slot(slots_ddp, td_ddp)
            assert torch.equal(s_ddp, s_local)  # every sampled slot, once per sample row
            torch.testing.assert_close(t_ddp, t_local, rtol=1e-4, atol=1e-5)
        after_local, after_ddp = module_state(local), module_state(ddp)
        moved = 0
        for name, value in after_local.items():
            torch.testing.assert_close(after_ddp[name], value, rtol=1e-4, atol=1e-5,
                                       msg=name)
            moved += not torch.equal(value, start[name])
        assert moved > 20  # three real updates happened
    finally:
        ddp.shutdown()
        local.shutdown()


@pytest.mark.slow
def test_priorities_from_each_shard_reach_their_replay_rows(ray_session: None) -> None:
    """A wrong routing (e.g. shard results concatenated in the other order) would put a
    row's priority on another row: compare the buffer's priorities row by row."""
    env = ClusterBranchingEnv(ENV_CONFIG)
    local = bdq_config(env, 0).build_learner_group(env=env)
    ddp = bdq_config(env, 2).build_learner_group(env=env)
    try:
        ddp.set_state(local.get_state(components=MODULE_STATE))
        buf_local, buf_ddp = filled_buffer(env), filled_buffer(env)
        sample = buf_local.sample(64, generator=torch.Generator().manual_seed(7))
        ts = {"num_env_steps_sampled_lifetime": 0}
        _, prios_local = update_learners(local, sample, ts)
        _, prios_ddp = update_learners(ddp, sample, ts)
        buf_local.update_priorities(*prios_local)
        buf_ddp.update_priorities(*prios_ddp)
        slots = sample["indices"].unique()
        torch.testing.assert_close(buf_ddp.priorities()[slots],
                                   buf_local.priorities()[slots], rtol=1e-4, atol=1e-6)
        # ... and the priorities did change from their initial value where sampled.
        assert not torch.allclose(buf_local.priorities()[slots], torch.ones(len(slots),
                                                                             dtype=torch.float64))
    finally:
        ddp.shutdown()
        local.shutdown()
