"""models/bdq.py + cloudrl/algorithms/bdq/: the Branching Dueling Q-Network on RLlib."""

from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.rllib.algorithms.dqn.dqn_learner import QF_NEXT_PREDS, QF_PREDS, QF_TARGET_NEXT_PREDS
from ray.rllib.core import (
    COMPONENT_LEARNER,
    COMPONENT_LEARNER_GROUP,
    COMPONENT_RL_MODULE,
    DEFAULT_MODULE_ID,
)
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, LEARNER_RESULTS, TD_ERROR_KEY
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from ray.rllib.utils.torch_utils import FLOAT_MIN

from cloudrl.algorithms.bdq import BDQ, BDQConfig, BDQTorchLearner, register_bdq
from envs.cluster_env import ClusterBranchingEnv
from envs.registration import BRANCHING_ID, register_rllib_envs
from models.bdq import REPRESENTATION, BDQTorchRLModule, branch_feasibility

ENV_CONFIG = {"n_servers": 5, "sim": {"episode_length": 50}, "seed_pool": [0, 1, 2]}
TINY_MODEL = {"encoder": {"hidden": 32, "macro_hiddens": [32], "row_hiddens": [16]},
              "trunk_hiddens": [32], "head_hiddens": [16]}


@pytest.fixture(scope="module")
def env() -> ClusterBranchingEnv:
    return ClusterBranchingEnv(ENV_CONFIG)


def build(env: gym.Env, **model_config: Any) -> BDQTorchRLModule:
    return BDQTorchRLModule(observation_space=env.observation_space,
                            action_space=env.action_space,
                            model_config={**TINY_MODEL, **model_config})


def random_obs(env: gym.Env, batch: int, seed: int,
               mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    space = env.observation_space
    out = {k: torch.randn((batch, *space[k].shape), generator=gen)
           for k in ("macro", "servers", "jobs")}
    out["action_mask"] = mask if mask is not None else torch.ones(
        batch, space["action_mask"].shape[0])
    return out


def random_masks(sizes: list[int], batch: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(batch, sum(sizes), generator=gen) < 0.5).float()


def stub_learner() -> types.SimpleNamespace:
    return types.SimpleNamespace(metrics=MetricsLogger())


# -- module -------------------------------------------------------------------------------

def test_dueling_identity_mean_feasible_q_equals_value(env: ClusterBranchingEnv) -> None:
    """Per sample and branch: mean over FEASIBLE sub-actions of Q_d minus V(s) is 0."""
    torch.manual_seed(0)
    module = build(env)
    sizes = env.branch_sizes
    obs = random_obs(env, 6, seed=1, mask=random_masks(sizes, 6, seed=2))
    batch = {Columns.OBS: obs}
    q = module.compute_q_values(batch)[QF_PREDS]
    assert q.shape == (6, len(sizes), max(sizes))
    value = module.value_head(module.representation(batch))  # (B, 1)
    feasible = branch_feasibility(obs["action_mask"], sizes, 6, q.device)
    assert (q[~feasible] == FLOAT_MIN).all()  # infeasible and padding
    mean_q = torch.where(feasible, q, 0.0).sum(-1) / feasible.sum(-1)
    torch.testing.assert_close(mean_q - value, torch.zeros_like(mean_q), atol=1e-5, rtol=0)
    # The advantages are not trivially zero: Q differs across sub-actions.
    assert (q.masked_fill(~feasible, 0.0).amax(-1) - mean_q).abs().max() > 1e-4
    assert module.representation(batch).shape == (6, module.representation_dim)


@pytest.fixture(scope="module")
def eps1_module(env: ClusterBranchingEnv) -> BDQTorchRLModule:
    torch.manual_seed(0)
    return build(env, epsilon=1.0)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_masked_sub_actions_are_never_chosen(eps1_module: BDQTorchRLModule,
                                             env: ClusterBranchingEnv,
                                             data: st.DataObject) -> None:
    sizes = env.branch_sizes
    batch = data.draw(st.integers(1, 4))
    rows = []
    for _ in range(batch):
        row: list[bool] = []
        for n in sizes:
            allowed = data.draw(st.integers(0, n - 1))
            branch = [False] * n if data.draw(st.booleans()) else data.draw(
                st.lists(st.booleans(), min_size=n, max_size=n))
            branch[allowed] = True  # single-feasible branches when the coin said so
            row += branch
        rows.append(row)
    mask = torch.tensor(rows, dtype=torch.float32)
    obs = random_obs(env, batch, seed=data.draw(st.integers(0, 1000)), mask=mask)
    greedy = eps1_module.forward_inference({Columns.OBS: obs})[Columns.ACTIONS]
    explore = eps1_module.forward_exploration({Columns.OBS: obs}, t=0)[Columns.ACTIONS]
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(sizes)[:-1]]))
    for actions in (greedy, explore):
        assert actions.dtype == torch.int64 and actions.shape == (batch, len(sizes))
        assert mask.gather(1, actions + offsets).all()


def test_exploration_is_per_branch_and_follows_the_epsilon_schedule() -> None:
    space = spaces.Dict({"macro": spaces.Box(-1, 1, (2,)), "servers": spaces.Box(-1, 1, (1, 1)),
                         "jobs": spaces.Box(-1, 1, (1, 1)), "action_mask": spaces.Box(0, 1, (7,))})
    action_space = spaces.MultiDiscrete([4, 3])
    torch.manual_seed(0)
    module = BDQTorchRLModule(observation_space=space, action_space=action_space,
                              model_config={**TINY_MODEL, "epsilon": [(0, 1.0), (100, 0.0)]})
    obs = {"macro": torch.zeros(4000, 2), "servers": torch.zeros(4000, 1, 1),
           "jobs": torch.zeros(4000, 1, 1), "action_mask": torch.ones(4000, 7)}
    actions = module.forward_exploration({Columns.OBS: obs}, t=0)[Columns.ACTIONS]
    for d, n in enumerate((4, 3)):  # epsilon = 1: uniform per branch
        freq = torch.bincount(actions[:, d], minlength=n).float() / 4000
        torch.testing.assert_close(freq, torch.full((n,), 1.0 / n), atol=0.04, rtol=0)
    # Branches draw independently: the joint frequency factorizes.
    joint = (actions[:, 0] == 0) & (actions[:, 1] == 0)
    assert abs(joint.float().mean().item() - 1 / 12) < 0.03
    greedy = module.forward_inference({Columns.OBS: obs})[Columns.ACTIONS]
    late = module.forward_exploration({Columns.OBS: obs}, t=100)[Columns.ACTIONS]
    assert torch.equal(late, greedy)  # epsilon = 0 at t = 100
    # epsilon = 0.5 at t = 50: half the (row, branch) pairs draw uniformly, the rest greedy,
    # so P(action != greedy) = 0.5 * (1 - 1/n) per branch
    mid = module.forward_exploration({Columns.OBS: obs}, t=50)[Columns.ACTIONS]
    for d, n in enumerate((4, 3)):
        differ = (mid[:, d] != greedy[:, d]).float().mean().item()
        assert abs(differ - 0.5 * (1 - 1 / n)) < 0.03


def test_inference_only_variant_drops_the_target_nets(env: ClusterBranchingEnv) -> None:
    torch.manual_seed(0)
    full = build(env)
    full.make_target_networks()
    state = full.get_state(inference_only=True)
    assert state and not any(k.startswith("_target_") for k in state)
    assert any(k.startswith("_target_") for k in full.get_state())
    light = BDQTorchRLModule(observation_space=env.observation_space,
                             action_space=env.action_space, inference_only=True,
                             model_config=TINY_MODEL)
    light.set_state(state)  # raises on missing keys
    obs = random_obs(env, 5, seed=3, mask=random_masks(env.branch_sizes, 5, seed=4))
    assert torch.equal(light.forward_inference({Columns.OBS: obs})[Columns.ACTIONS],
                       full.forward_inference({Columns.OBS: obs})[Columns.ACTIONS])
    with pytest.raises(RuntimeError, match="inference.only"):
        light.forward_train({Columns.OBS: obs, Columns.NEXT_OBS: obs})


# -- loss ----------------------------------------------------------------------------------

SIZES = [3, 2]


def hand_batch(terminated: bool = False) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """2 samples, 2 branches (sizes 3 and 2), hand-set Q tables."""
    pad = FLOAT_MIN
    q_curr = torch.tensor([[[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]],
                           [[0.0, 1.0, 0.0], [2.0, 2.0, 0.0]]], requires_grad=True)
    next_mask = torch.tensor([[1.0, 0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0, 1.0]])
    next_feasible = branch_feasibility(next_mask, SIZES, 2, torch.device("cpu"))
    q_next_online = torch.tensor([[[5.0, 9.0, 1.0], [1.0, 2.0, pad]],
                                  [[1.0, 1.0, 7.0], [3.0, 1.0, pad]]])
    q_next_target = torch.tensor([[[10.0, 20.0, 30.0], [40.0, 50.0, pad]],
                                  [[1.0, 2.0, 3.0], [4.0, 6.0, pad]]])
    fwd_out = {QF_PREDS: q_curr,
               QF_NEXT_PREDS: BDQTorchRLModule.mask_q(q_next_online, next_feasible),
               QF_TARGET_NEXT_PREDS: BDQTorchRLModule.mask_q(q_next_target, next_feasible)}
    batch = {Columns.ACTIONS: torch.tensor([[2, 0], [1, 1]]),
             Columns.REWARDS: torch.tensor([1.0, -1.0]),
             Columns.TERMINATEDS: torch.tensor([False, terminated]),
             "n_step": torch.tensor([1, 2]), "weights": torch.tensor([1.0, 0.5])}
    return batch, fwd_out


@pytest.mark.parametrize(("loss_fn", "double_q", "terminated"), [
    ("mse", True, False), ("huber", True, False), ("mse", True, True), ("mse", False, False)])
def test_loss_and_priorities_match_hand_computed_targets(loss_fn: str, double_q: bool,
                                                         terminated: bool) -> None:
    batch, fwd_out = hand_batch(terminated)
    config = BDQConfig().training(gamma=0.9, td_error_loss_fn=loss_fn, double_q=double_q)
    stub = stub_learner()
    loss = BDQTorchLearner.compute_loss_for_module(stub, module_id="m", config=config,
                                                   batch=batch, fwd_out=fwd_out)
    # Double Q, sample 0: online argmax over FEASIBLE next sub-actions: branch 0 -> 0
    # (1 is masked), branch 1 -> 1; target there 10 and 50; mean 30 -> y0 = 1 + 0.9 * 30.
    # Sample 1 (n_step 2): branch 0 -> 2 (only one feasible), branch 1 -> 1: (3 + 6) / 2.
    # Plain Q (max of the masked target): sample 0 branch 0 -> 30, mean (30 + 50) / 2.
    y0 = 1.0 + 0.9 * (30.0 if double_q else 40.0)
    y1 = -1.0 if terminated else -1.0 + 0.81 * 4.5
    q_selected = np.array([[3.0, 4.0], [1.0, 2.0]])
    delta = np.array([[y0], [y1]]) - q_selected
    td = np.asarray(stub.metrics.peek(("m", TD_ERROR_KEY)), dtype=np.float64).ravel()
    np.testing.assert_allclose(td, np.abs(delta).sum(-1), rtol=1e-6)  # priorities
    if loss_fn == "mse":
        per_branch = delta**2
    else:
        per_branch = np.where(np.abs(delta) <= 1.0, 0.5 * delta**2, np.abs(delta) - 0.5)
    expected = float(np.mean(np.array([1.0, 0.5]) * per_branch.mean(-1)))
    assert math.isclose(float(loss.detach()), expected, rel_tol=1e-6)
    if loss_fn == "mse" and double_q and not terminated:
        assert math.isclose(expected, (0.5 * (25**2 + 24**2) + 0.25 * (
            (y1 - 1) ** 2 + (y1 - 2) ** 2)) / 2, rel_tol=1e-9)
    loss.backward()  # the gradient reaches Q(s, a) only at the replayed sub-actions
    grad = fwd_out[QF_PREDS].grad
    assert grad is not None and int((grad != 0).sum()) == 4


def test_trunk_gradient_is_scaled_by_one_over_branches_plus_one(
        env: ClusterBranchingEnv) -> None:
    torch.manual_seed(0)
    scaled = build(env)
    plain = build(env, scale_trunk_grad=False)
    plain.load_state_dict(scaled.state_dict())
    for module in (scaled, plain):
        module.make_target_networks()
    sizes = env.branch_sizes
    batch = {Columns.OBS: random_obs(env, 4, seed=5, mask=random_masks(sizes, 4, 6)),
             Columns.NEXT_OBS: random_obs(env, 4, seed=7, mask=random_masks(sizes, 4, 8)),
             Columns.ACTIONS: torch.zeros(4, len(sizes), dtype=torch.int64),
             Columns.REWARDS: torch.randn(4), Columns.TERMINATEDS: torch.zeros(4, dtype=bool),
             "n_step": torch.ones(4, dtype=torch.int64), "weights": torch.ones(4)}
    config = BDQConfig().training(gamma=0.9)
    for module in (scaled, plain):
        out = module.forward_train(batch)
        assert REPRESENTATION in out
        BDQTorchLearner.compute_loss_for_module(stub_learner(), module_id="m", config=config,
                                                batch=batch, fwd_out=out).backward()
    d = len(sizes)
    trunk_pairs = list(zip(scaled.trunk.parameters(), plain.trunk.parameters(), strict=True))
    for p_scaled, p_plain in trunk_pairs:
        torch.testing.assert_close(p_scaled.grad * (d + 1), p_plain.grad, rtol=1e-4, atol=1e-7)
    assert any(p.grad.abs().max() > 1e-6 for _, p in trunk_pairs)
    for p_scaled, p_plain in zip(scaled.advantage_heads.parameters(),
                                 plain.advantage_heads.parameters(), strict=True):
        torch.testing.assert_close(p_scaled.grad, p_plain.grad)  # heads unscaled


def test_config_wiring_and_validation() -> None:
    import ray.tune.registry as registry

    config = BDQConfig()
    assert config.algo_class is BDQ and BDQ.get_default_config().algo_class is BDQ
    assert config.get_default_learner_class() is BDQTorchLearner
    assert config.get_default_rl_module_spec().module_class is BDQTorchRLModule
    register_bdq()
    assert registry.get_trainable_cls("BDQ") is BDQ
    with pytest.raises(ValueError, match="distributional"):
        BDQConfig().training(num_atoms=3).validate()


# -- RLlib runs ------------------------------------------------------------------------------

BEST_SUB_ACTIONS = np.array([[0, 1, 2], [2, 0, 1]])  # per context bit, per branch


class ToyBranchingBandit(gym.Env):
    """1-step contextual bandit, 3 branches of 3: reward = fraction of branches at their best.

    The best sub-action of each branch depends on a context bit (``macro``); the optimum
    (reward 1) needs every branch right in both contexts.
    """

    def __init__(self, config: dict | None = None) -> None:
        self.observation_space = spaces.Dict({
            "macro": spaces.Box(0, 1, (2,), np.float32),
            "servers": spaces.Box(0, 1, (1, 1), np.float32),
            "jobs": spaces.Box(0, 1, (1, 1), np.float32),
            "action_mask": spaces.Box(0, 1, (9,), np.float32)})
        self.action_space = spaces.MultiDiscrete([3, 3, 3])
        self.context = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {"macro": np.eye(2, dtype=np.float32)[self.context],
                "servers": np.zeros((1, 1), np.float32), "jobs": np.zeros((1, 1), np.float32),
                "action_mask": np.ones(9, np.float32)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.context = int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        reward = float(np.mean(np.asarray(action) == BEST_SUB_ACTIONS[self.context]))
        return self._obs(), reward, True, False, {}


def bandit_config(**training: Any) -> BDQConfig:
    """A small BDQ on :class:`ToyBranchingBandit`; ``training`` adds to the defaults."""
    return (
        BDQConfig()
        .environment(ToyBranchingBandit)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=8)
        .reporting(min_sample_timesteps_per_iteration=256)
        .training(n_step=1, lr=2e-3, gamma=0.0, train_batch_size_per_learner=64,
                  num_steps_sampled_before_learning_starts=128, target_network_update_freq=100,
                  epsilon=[(0, 1.0), (1500, 0.05)], **training)
        .rl_module(model_config={"encoder": {"hidden": 32, "macro_hiddens": [32],
                                             "row_hiddens": [8]},
                                 "trunk_hiddens": [32], "head_hiddens": [32]})
        .debugging(seed=0)
    )


def train_until_optimal(algo: Any, max_iterations: int = 16) -> int:
    """Train until the greedy action is the bandit's optimum in both contexts; returns the
    env steps used and asserts the optimum was reached within 4096 steps."""
    env = ToyBranchingBandit()
    obs = {k: torch.as_tensor(np.stack([v, v])) for k, v in env._obs().items()}
    obs["macro"] = torch.eye(2)
    for _ in range(max_iterations):  # 256 env steps per iteration
        result = algo.train()
        greedy = algo.get_module().forward_inference({Columns.OBS: obs})[Columns.ACTIONS]
        if np.array_equal(greedy.numpy(), BEST_SUB_ACTIONS):
            break
    steps = result[ENV_RUNNER_RESULTS]["num_env_steps_sampled_lifetime"]
    assert np.array_equal(greedy.numpy(), BEST_SUB_ACTIONS), (steps, greedy)
    assert steps <= 4096
    return steps


@pytest.mark.usefixtures("ray_session")
def test_bdq_learns_the_optimum_of_a_toy_branching_bandit() -> None:
    algo = bandit_config(replay_buffer_config={
        "type": "PrioritizedEpisodeReplayBuffer", "capacity": 5000, "alpha": 0.6,
        "beta": 0.4}).build_algo()
    try:
        train_until_optimal(algo)  # the optimum is usually reached by ~1000 env steps
    finally:
        algo.stop()


@pytest.mark.usefixtures("ray_session")
def test_bdq_trains_one_iteration_on_the_branching_cluster_env(
        env: ClusterBranchingEnv, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import ray.rllib.algorithms.dqn.dqn as dqn_module

    captured: list[dict] = []
    original = dqn_module.update_priorities_in_episode_replay_buffer

    def capture(*, replay_buffer: Any, td_errors: dict) -> None:
        captured.append(td_errors)
        original(replay_buffer=replay_buffer, td_errors=td_errors)

    monkeypatch.setattr(dqn_module, "update_priorities_in_episode_replay_buffer", capture)
    register_rllib_envs()
    config = (
        BDQConfig()
        .environment(BRANCHING_ID, env_config=ENV_CONFIG)
        .env_runners(num_env_runners=0, rollout_fragment_length=16)
        .reporting(min_sample_timesteps_per_iteration=64)
        .training(n_step=3, train_batch_size_per_learner=16,
                  num_steps_sampled_before_learning_starts=32, target_network_update_freq=32,
                  epsilon=[(0, 1.0), (1000, 0.1)],
                  replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer",
                                        "capacity": 2000, "alpha": 0.6, "beta": 0.4})
        .rl_module(model_config=TINY_MODEL)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        stats = result[LEARNER_RESULTS][DEFAULT_MODULE_ID]
        assert math.isfinite(float(stats["qf_loss"])) and stats["num_target_updates"] >= 1
        # Priorities: one summed |TD error| per sampled transition went to the buffer.
        assert captured
        td = captured[-1][DEFAULT_MODULE_ID][TD_ERROR_KEY]
        assert td.shape == (16,) and np.all(np.isfinite(td)) and np.all(td >= 0)
        # Exploring policy never takes an action the branch masks forbid.
        episodes = algo.env_runner.sample(num_timesteps=50, explore=True)
        infos = [i for ep in episodes for i in ep.get_infos()[1:]]
        assert infos and not any(i["invalid_action"] for i in infos)
        obs = random_obs(env, 8, seed=9, mask=random_masks(env.branch_sizes, 8, seed=10))
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        restored = RLModule.from_checkpoint(Path(path) / COMPONENT_LEARNER_GROUP
                                            / COMPONENT_LEARNER / COMPONENT_RL_MODULE
                                            / DEFAULT_MODULE_ID)
        greedy = algo.get_module().forward_inference({Columns.OBS: obs})[Columns.ACTIONS]
        assert torch.equal(restored.forward_inference({Columns.OBS: obs})[Columns.ACTIONS],
                           greedy)
        actions = np.concatenate([ep.get_actions() for ep in episodes])
        assert actions.shape[1:] == (len(env.branch_sizes),)
        # RLlib's TensorToNumpy connector narrows the module's int64 to int32 on the way to
        # the env and the replay buffer; the learner casts back before its gather.
        assert actions.dtype.kind == "i"
        assert ((actions >= 0) & (actions < np.asarray(env.branch_sizes))).all()
    finally:
        algo.stop()


@pytest.mark.usefixtures("ray_session")
def test_cli_train_bdq_then_evaluate_on_the_branching_interface(tmp_path, capsys, monkeypatch):
    import json

    from cloudrl.checkpoint_policy import CheckpointPolicy
    from cloudrl.cli import main
    from cloudrl.sweep import SweepConfig
    from envs.cluster_env import ClusterBranchingEnv

    hp = {"train_batch_size_per_learner": 16, "n_step": 1,
          "num_steps_sampled_before_learning_starts": 16, "target_network_update_freq": 16}
    out = tmp_path / "bdq"
    monkeypatch.chdir(tmp_path)  # --eval-seeds writes its table under results/ of the cwd
    assert main(["train", "--algo", "bdq", "--n-servers", "4", "--episode-length", "30",
                 "--env-steps", "64", "--hparams", json.dumps(hp), "--out", str(out),
                 "--eval-seeds", "2"]) == 0
    text = capsys.readouterr().out
    assert "interface branching" in text and "bdq:bdq" in text and "power_aware" in text
    assert len(list((tmp_path / "results").glob("eval_bdq_*.csv"))) == 1
    policy = CheckpointPolicy(out)
    assert policy.interface == "branching"
    env = ClusterBranchingEnv(policy.env_config)
    obs, _ = env.reset(seed=1_000_000)
    for _ in range(10):
        action = policy.act(obs)
        assert action.shape == (len(env.branch_sizes),)
        obs, _, _, _, info = env.step(action)
        assert not info["invalid_action"]
    assert SweepConfig(algos=["ppo", "bdq"]).interfaces() == ["branching", "flat"]
    assert SweepConfig(algos=["bdq"]).train_config("bdq", "poisson", 0).interface() == \
        "branching"
