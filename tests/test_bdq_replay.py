"""BDQ on the device-resident replay: ``BDQConfig.training(device_replay=True)``."""

from __future__ import annotations

import math

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    REPLAY_BUFFER_RESULTS,
)

from cloudrl.algorithms.bdq import BDQConfig, BDQTorchLearner, bdq_td_errors
from cloudrl.algorithms.bdq.training_step import EpisodeStreams
from envs.registration import BRANCHING_ID, register_rllib_envs
from tests.test_bdq import (
    TINY_MODEL,
    ToyBranchingBandit,
    bandit_config,
    hand_batch,
    stub_learner,
    train_until_optimal,
)

ENV_CONFIG = {"n_servers": 4, "sim": {"episode_length": 30}, "seed_pool": [0, 1, 2]}


def learner_params(algo) -> list[torch.Tensor]:
    module = algo.learner_group._learner.module[DEFAULT_MODULE_ID]
    return [p.detach().clone() for p in module.parameters()]


def test_loss_takes_per_sample_discounts_instead_of_n_step() -> None:
    batch, fwd_out = hand_batch()
    config = BDQConfig().training(gamma=0.9)
    by_n_step = BDQTorchLearner.compute_loss_for_module(
        stub_learner(), module_id="m", config=config, batch=batch, fwd_out=fwd_out)
    with_discounts = {k: v for k, v in batch.items() if k != "n_step"}
    with_discounts["discounts"] = torch.tensor([0.9, 0.81])  # gamma**1, gamma**2
    by_discounts = BDQTorchLearner.compute_loss_for_module(
        stub_learner(), module_id="m", config=config, batch=with_discounts, fwd_out=fwd_out)
    torch.testing.assert_close(by_discounts, by_n_step)
    # A window cut by an episode end: the discount given wins over gamma**n_step.
    _, target = bdq_td_errors(fwd_out, {**batch, "discounts": torch.tensor([0.5, 0.0])}, 0.9)
    torch.testing.assert_close(target, torch.tensor([1.0 + 0.5 * 30.0, -1.0]))


def test_episode_streams_free_ids_at_episode_end_and_count_pending_rows() -> None:
    streams = EpisodeStreams(num_streams=2)
    assert streams.stream_of("a") == 0 and streams.stream_of("b") == 1
    streams.advance("a", 5, done=False)
    streams.advance("b", 1, done=False)
    assert streams.pending_rows(n_step=3) == 2 + 1
    streams.advance("a", 2, done=True)  # "a" ends: its stream is free again
    assert streams.stream_of("c") == 0 and streams.pending_rows(3) == 1
    assert streams.take_evicted() == []  # "a" ended: nothing to drop
    assert streams.stream_of("d") == 1  # all taken: the oldest ("b") is reused
    assert streams.take_evicted() == [1] and streams.take_evicted() == []


@pytest.mark.usefixtures("ray_session")
def test_device_replay_iteration_on_the_branching_cluster_env() -> None:
    register_rllib_envs()
    n_step = 3
    config = (
        BDQConfig()
        .environment(BRANCHING_ID, env_config=ENV_CONFIG)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=16)
        .reporting(min_sample_timesteps_per_iteration=64)
        .training(device_replay=True, device_replay_capacity=500, n_step=n_step,
                  train_batch_size_per_learner=16, num_steps_sampled_before_learning_starts=32,
                  target_network_update_freq=32, epsilon=[(0, 1.0), (1000, 0.1)])
        .rl_module(model_config=TINY_MODEL)
    )
    algo = config.build_algo()
    try:
        before = learner_params(algo)
        result = algo.train()
        replay = algo.device_replay
        buffer = replay.buffer
        steps = result[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED_LIFETIME]
        assert steps >= 64 and replay.num_added == steps
        # Every sampled step is stored except the incomplete n-step windows still pending.
        assert len(buffer) == steps - replay.streams.pending_rows(n_step) > 0
        assert result[REPLAY_BUFFER_RESULTS]["device_replay_size"] == len(buffer)
        prios = buffer.priorities()[: len(buffer)]
        assert prios.min() > 0 and not torch.all(prios == prios[0])  # updated from TD errors
        stats = result[LEARNER_RESULTS][DEFAULT_MODULE_ID]
        assert math.isfinite(float(stats["qf_loss"])) and stats["num_target_updates"] >= 1
        after = learner_params(algo)
        assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
        # Stored actions are int64 (B, D) within the branch sizes; discounts <= gamma**n.
        sample = buffer.sample(32)
        sizes = torch.as_tensor(algo.get_module().branch_sizes)
        assert buffer.action_shape == (len(sizes),)
        assert sample["actions"].dtype == torch.int64
        assert ((sample["actions"] >= 0) & (sample["actions"] < sizes)).all()
        assert (sample["discounts"] <= config.gamma + 1e-6).all()
        assert (sample["discounts"] >= config.gamma ** n_step - 1e-6).all()
    finally:
        algo.stop()


@pytest.mark.usefixtures("ray_session")
def test_device_replay_bdq_learns_the_optimum_of_a_toy_branching_bandit() -> None:
    algo = bandit_config(device_replay=True, device_replay_capacity=5000).build_algo()
    try:
        steps = train_until_optimal(algo)
        # 1-step bandit episodes: every sampled step is stored at once.
        assert len(algo.device_replay.buffer) == min(steps, 5000)
    finally:
        algo.stop()


@pytest.mark.usefixtures("ray_session")
def test_device_replay_checkpoint_restores_the_buffer(tmp_path) -> None:
    from cloudrl.algorithms.bdq import BDQ

    config = (
        BDQConfig()
        .environment(ToyBranchingBandit)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=8)
        .reporting(min_sample_timesteps_per_iteration=64)
        .training(device_replay=True, device_replay_capacity=300, device_replay_checkpoint=True,
                  n_step=1, train_batch_size_per_learner=16,
                  num_steps_sampled_before_learning_starts=32)
        .rl_module(model_config=TINY_MODEL)
    )
    algo = config.build_algo()
    try:
        algo.train()
        buffer = algo.device_replay.buffer
        path = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    restored = BDQ.from_checkpoint(path)
    try:
        again = restored.device_replay.buffer
        assert len(again) == len(buffer) > 0
        assert torch.equal(again.priorities(), buffer.priorities())
        assert torch.equal(again.transitions(torch.arange(len(buffer)))["actions"],
                           buffer.transitions(torch.arange(len(buffer)))["actions"])
    finally:
        restored.stop()
