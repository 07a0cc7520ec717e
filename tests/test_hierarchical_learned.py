"""Learned sub-agents in the hierarchy: checkpoint sub-agents reproduce their own episodes
under a supervisor that always picks them, and co-training (sub-agent modules in the one
MultiRLModule) trains them only when asked. Each test trains tiny checkpoints: slow."""

from __future__ import annotations

import numpy as np
import pytest

from cloudrl.training import TrainConfig, build_algo_config, write_meta
from envs.hierarchical_env import SUPERVISOR, sub_agent_id

pytestmark = pytest.mark.slow

ENV = {"n_servers": 6, "sim": {"episode_length": 50}}
PPO_HP = {"train_batch_size_per_learner": 100, "minibatch_size": 50, "num_epochs": 1}
HIER_HP = {"k": 5, "train_batch_size_per_learner": 100, "minibatch_size": 50,
           "num_epochs": 1, "supervisor_hidden": 16, "lr": 0.01}


def _train_and_save(cfg: TrainConfig, iterations: int = 1) -> dict:
    algo = build_algo_config(cfg).build_algo()
    try:
        for _ in range(iterations):
            result = algo.train()
        algo.save_to_path(cfg.checkpoint_dir)
        write_meta(__import__("pathlib").Path(cfg.checkpoint_dir), cfg)
        weights = {mid: {k: v.detach().clone() for k, v in m.state_dict().items()}
                   for mid, m in algo.learner_group._learner.module.items()} \
            if algo.learner_group._learner is not None else {}
    finally:
        algo.stop()
    return {"result": result, "weights": weights}


@pytest.fixture(scope="module")
def checkpoints(ray_session, tmp_path_factory):
    """A masked PPO (flat) and a gated DQN (branching) checkpoint, one iteration each."""
    tmp = tmp_path_factory.mktemp("subs")
    ppo = TrainConfig(algo="ppo", env=ENV, env_steps=100, envs_per_runner=1,
                      checkpoint_dir=str(tmp / "ppo"), hparams=PPO_HP)
    gated = TrainConfig(algo="gated_dqn", env=ENV, env_steps=100, envs_per_runner=1,
                        checkpoint_dir=str(tmp / "gated"),
                        hparams={"decision_every": 5, "num_steps_sampled_before_learning_starts":
                                 20})
    _train_and_save(ppo)
    _train_and_save(gated)
    return {"flat": str(tmp / "ppo"), "branching": str(tmp / "gated"), "tmp": tmp}


@pytest.mark.parametrize("interface", ["flat", "branching"])
@pytest.mark.parametrize("pick", [0, 1])
def test_always_picking_a_checkpoint_reproduces_its_episode(checkpoints, interface, pick):
    from cloudrl.algorithms.hierarchical.policy import HierarchicalPolicy
    from cloudrl.algorithms.hierarchical.sub_agents import make_sub_agent
    from cloudrl.algorithms.hierarchical.supervisors import FixedSupervisor
    from cloudrl.checkpoint_policy import CheckpointPolicy
    from cloudrl.evaluate import make_env, run_episode
    from envs.env_config import EnvConfig
    from envs.hierarchical_env import HierarchicalClusterEnv

    ckpt = checkpoints[interface]
    specs = [ckpt, "power_aware"] if pick == 0 else ["sjf", ckpt]
    env_cfg = EnvConfig.model_validate(ENV)
    env = make_env(env_cfg, interface)
    alone = CheckpointPolicy(ckpt, mode="greedy")
    hier = HierarchicalPolicy(FixedSupervisor(pick), [make_sub_agent(s, interface)
                                                      for s in specs], k=5, interface=interface)
    for seed in (1_000_000, 1_000_001):
        expected = {**run_episode(alone, env, seed).as_dict(), "policy": "-"}
        assert {**run_episode(hier, env, seed).as_dict(), "policy": "-"} == expected
        # the MultiAgentEnv, the supervisor always picking `pick`: the same episode
        menv = HierarchicalClusterEnv({"env": env_cfg, "interface": interface, "k": 5,
                                       "sub_agents": specs,
                                       "sub_agent_factory": make_sub_agent})
        menv.reset(seed=seed)
        total, done, energy = 0.0, False, 0.0
        while not done:
            _, rewards, _, truncated, infos = menv.step({SUPERVISOR: pick})
            total += rewards[SUPERVISOR]
            energy += infos[SUPERVISOR]["energy_kwh"]
            assert infos[SUPERVISOR]["sub_agent"] == pick
            done = truncated["__all__"]
        assert total == pytest.approx(expected["episode_reward"], abs=1e-6)
        assert energy == pytest.approx(expected["energy_kwh"], abs=1e-9)


def test_hparams_refuse_mismatched_or_untrainable_sub_agents(checkpoints) -> None:
    from cloudrl.algorithms.hierarchical.hparams import (
        HierarchicalBranchingHparams,
        HierarchicalHparams,
    )

    with pytest.raises(ValueError, match="branching interface.*hierarchical_branching"):
        HierarchicalHparams(sub_agents=[checkpoints["branching"]])
    with pytest.raises(ValueError, match="flat interface.*--algo hierarchical\\)"):
        HierarchicalBranchingHparams(sub_agents=[checkpoints["flat"]])
    with pytest.raises(ValueError, match="gated_dqn checkpoint: only masked PPO"):
        HierarchicalBranchingHparams(sub_agents=[checkpoints["branching"]], co_train=True)
    assert HierarchicalBranchingHparams(sub_agents=[checkpoints["branching"], "sjf"]).k == 10


def _hier(checkpoints, name: str, **hp) -> TrainConfig:
    return TrainConfig(algo="hierarchical", env=ENV, env_steps=100, envs_per_runner=1,
                       checkpoint_dir=str(checkpoints["tmp"] / name),
                       hparams={**HIER_HP, "sub_agents": [checkpoints["flat"], "power_aware"],
                                **hp})


@pytest.mark.parametrize("co_train", [True, False])
def test_co_training_updates_the_sub_agent_only_when_asked(checkpoints, co_train) -> None:
    import torch
    from ray.rllib.core.rl_module.rl_module import RLModule

    from cloudrl.checkpoint_policy import MODULE_SUBDIR, load_policy

    before = RLModule.from_checkpoint(str(__import__("pathlib").Path(checkpoints["flat"])
                                          / MODULE_SUBDIR)).state_dict()
    name = "co" if co_train else "frozen"
    cfg = _hier(checkpoints, name, co_train=co_train, embed_sub_agents=False)
    out = _train_and_save(cfg)
    sub = sub_agent_id(0)
    learners = out["result"]["learners"]
    assert SUPERVISOR in learners and (sub in learners or not co_train)
    after = out["weights"][sub]
    assert set(after) == set(before)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    if co_train:
        assert changed  # the PPO update moved the sub-agent's weights
    else:
        assert changed == []
    # the checkpoint acts with the sub-agent's module as trained in the hierarchy
    policy = load_policy(cfg.checkpoint_dir)
    saved = policy.sub_agents[0].module.state_dict()
    assert all(torch.equal(saved[k], after[k]) for k in after)
    assert policy.sub_agent_names[1] == "power_aware"
    macros = np.zeros((1, policy.supervisor.module.observation_space.shape[0]), np.float32)
    assert policy.choose({"macro": macros[0]}) in (0, 1)
