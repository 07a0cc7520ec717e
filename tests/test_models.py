"""models/: shared encoder, masked PPO and masked Double-DQN RLModules (RLlib new API stack)."""

from __future__ import annotations

import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.rllib.core import (
    COMPONENT_LEARNER,
    COMPONENT_LEARNER_GROUP,
    COMPONENT_RL_MODULE,
    DEFAULT_MODULE_ID,
)
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.core.rl_module.rl_module import RLModule, RLModuleSpec
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, LEARNER_RESULTS, NUM_ENV_STEPS_SAMPLED

from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from envs.registration import FLAT_ID, register_rllib_envs
from models.bdq import BDQTorchRLModule
from models.encoders import ClusterEncoder, EncoderConfig
from models.masked_appo import MaskedAPPOTorchRLModule
from models.masked_dqn import MaskedDQNTorchRLModule
from models.masked_ppo import MaskedPPOTorchRLModule

ENV_CONFIG = {"n_servers": 5, "sim": {"episode_length": 50}, "seed_pool": [0, 1, 2]}
TINY_MODEL = {"encoder": {"hidden": 32, "macro_hiddens": [32], "row_hiddens": [32]},
              "head_hiddens": [32]}


@pytest.fixture(scope="module")
def env() -> ClusterSchedulingEnv:
    return ClusterSchedulingEnv(ENV_CONFIG)


@pytest.fixture(scope="module")
def real_obs(env: ClusterSchedulingEnv) -> dict[str, torch.Tensor]:
    """16 observations of one episode under uniformly random feasible actions."""
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    rows = [obs]
    for _ in range(15):
        obs, *_ = env.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
        rows.append(obs)
    return {k: torch.as_tensor(np.stack([o[k] for o in rows])) for k in rows[0]}


def random_obs(env: ClusterSchedulingEnv, batch: int, seed: int,
               mask: torch.Tensor | None = None, scale: float = 1.0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    space = env.observation_space
    out = {k: scale * torch.randn((batch, *space[k].shape), generator=gen)
           for k in ("macro", "servers", "jobs")}
    out["action_mask"] = mask if mask is not None else torch.ones(batch, env.n_actions)
    return out


def build(cls: type, env: ClusterSchedulingEnv, **model_config) -> torch.nn.Module:
    return cls(observation_space=env.observation_space, action_space=env.action_space,
               model_config={**TINY_MODEL, **model_config})


# -- action space vs interface ----------------------------------------------------------------

FLAT_MODULES = [MaskedPPOTorchRLModule, MaskedDQNTorchRLModule, MaskedAPPOTorchRLModule]


@pytest.mark.parametrize("cls", [*FLAT_MODULES, BDQTorchRLModule])
def test_module_on_the_other_interfaces_action_space_names_the_module_that_fits(
        cls: type, env: ClusterSchedulingEnv) -> None:
    """Built as RLlib builds it (``RLModuleSpec.build``), not hidden behind its deprecation."""
    branching = ClusterBranchingEnv(ENV_CONFIG)
    wrong = env if cls is BDQTorchRLModule else branching
    spec = RLModuleSpec(module_class=cls, observation_space=wrong.observation_space,
                        action_space=wrong.action_space, model_config=TINY_MODEL)
    with pytest.raises(ValueError) as err:
        spec.build()
    message = str(err.value)
    assert "deprecated" not in message and "\n" not in message
    assert message.startswith(f"{cls.__name__} needs ")
    assert str(wrong.action_space) in message
    if cls is BDQTorchRLModule:
        assert "Discrete action space" in message and "MultiDiscrete" in message
        assert all(m.__name__ in message for m in FLAT_MODULES)
    else:
        assert "MultiDiscrete" in message and "BDQTorchRLModule" in message
    # On its own interface's space the same spec builds.
    right = branching if cls is BDQTorchRLModule else env
    spec.observation_space, spec.action_space = right.observation_space, right.action_space
    assert isinstance(spec.build(), cls)


# -- encoder ------------------------------------------------------------------------------

def test_encoder_shape_and_config(env: ClusterSchedulingEnv) -> None:
    cfg = EncoderConfig.from_model_config({"encoder": {"hidden": 24, "row_hiddens": [16, 8]}})
    assert cfg.row_hiddens == (16, 8) and cfg.hidden == 24
    enc = ClusterEncoder(env.observation_space, cfg)
    out = enc(random_obs(env, 3, seed=0))
    assert out.shape == (3, 24) and enc.output_dim == 24
    servers, jobs = enc.encode_rows(random_obs(env, 3, seed=0))
    assert servers.shape == (3, 5, 8) and jobs.shape == (3, env.queue_window, 8)
    assert EncoderConfig.from_model_config(None) == EncoderConfig()
    with pytest.raises(ValueError, match="unknown encoder settings"):
        EncoderConfig.from_model_config({"encoder": {"hiden": 3}})
    with pytest.raises(ValueError, match="positive"):
        EncoderConfig(hidden=0)


def test_encoder_is_permutation_invariant_over_server_and_job_rows(
        env: ClusterSchedulingEnv) -> None:
    torch.manual_seed(0)
    enc = ClusterEncoder(env.observation_space)
    obs = random_obs(env, 4, seed=1)
    base = enc(obs)
    perm_s = torch.randperm(obs["servers"].shape[1])
    perm_j = torch.randperm(obs["jobs"].shape[1])
    permuted = {**obs, "servers": obs["servers"][:, perm_s], "jobs": obs["jobs"][:, perm_j]}
    assert not torch.equal(perm_s, torch.arange(len(perm_s)))
    torch.testing.assert_close(enc(permuted), base, atol=1e-5, rtol=0)
    # ... while the rows' contents still matter.
    changed = {**obs, "servers": obs["servers"].clone()}
    changed["servers"][:, 0] += 1.0
    assert (enc(changed) - base).abs().max() > 1e-4


# -- masked PPO -----------------------------------------------------------------------------

def test_ppo_module_forward_shapes(env: ClusterSchedulingEnv,
                                   real_obs: dict[str, torch.Tensor]) -> None:
    module = build(MaskedPPOTorchRLModule, env)
    batch = {Columns.OBS: real_obs}
    b, a = real_obs["macro"].shape[0], env.n_actions
    for out in (module.forward_inference(batch), module.forward_exploration(batch, t=0)):
        assert out[Columns.ACTION_DIST_INPUTS].shape == (b, a)
    train = module.forward_train(batch)
    assert train[Columns.ACTION_DIST_INPUTS].shape == (b, a)
    values = module.compute_values(batch)
    assert values.shape == (b,)
    torch.testing.assert_close(module.compute_values(batch, train[Columns.EMBEDDINGS]), values)
    separate = build(MaskedPPOTorchRLModule, env, vf_share_encoder=False)
    assert Columns.EMBEDDINGS not in separate.forward_train(batch)
    assert separate.compute_values(batch).shape == (b,)


@pytest.fixture(scope="module")
def ppo_module(env: ClusterSchedulingEnv) -> MaskedPPOTorchRLModule:
    torch.manual_seed(0)
    return build(MaskedPPOTorchRLModule, env)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_ppo_masked_actions_have_zero_probability(
        ppo_module: MaskedPPOTorchRLModule, env: ClusterSchedulingEnv, data: st.DataObject) -> None:
    batch, n = data.draw(st.integers(1, 4)), env.n_actions
    rows = []
    for _ in range(batch):
        allowed = data.draw(st.integers(0, n - 1))
        if data.draw(st.booleans()):  # a single feasible action
            row = [False] * n
        else:
            row = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
        row[allowed] = True
        rows.append(row)
    mask = torch.tensor(rows, dtype=torch.float32)
    scale = data.draw(st.sampled_from([0.1, 1.0, 100.0]))
    obs = random_obs(env, batch, seed=data.draw(st.integers(0, 2**16)), mask=mask, scale=scale)
    logits = ppo_module.forward_exploration({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
    dist = TorchCategorical.from_logits(logits)
    samples = dist.sample(sample_shape=(64,))  # (64, B)
    assert mask.gather(1, samples.T).all()
    assert mask.gather(1, logits.argmax(-1, keepdim=True)).all()
    probs = torch.softmax(logits, -1)
    assert (probs[mask == 0] == 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(batch))
    assert torch.isfinite(dist.logp(samples)).all()


# -- masked DQN ------------------------------------------------------------------------------

def _set_q_bias(module: MaskedDQNTorchRLModule, online: list[float],
                target: list[float] | None = None) -> None:
    """Make Q(s, .) independent of s: zero last-layer weights, biases = the given values."""
    pairs = [(module.af, online)]
    if target is not None:
        pairs.append((module._target_af, target))
    with torch.no_grad():
        for net, values in pairs:
            net[-1].weight.zero_()
            net[-1].bias.copy_(torch.tensor(values))


@pytest.mark.parametrize("dueling", [False, True])
def test_dqn_greedy_and_epsilon_greedy_never_pick_masked_actions(
        env: ClusterSchedulingEnv, dueling: bool) -> None:
    n = env.n_actions
    module = build(MaskedDQNTorchRLModule, env, epsilon=1.0, dueling=dueling)
    q = torch.arange(n, dtype=torch.float32)  # the best raw Q is the last action
    _set_q_bias(module, q.tolist())
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(64, n, generator=gen) < 0.2).float()
    mask[:, -1] = 0.0  # the raw argmax is infeasible everywhere
    mask[torch.arange(64), torch.randint(0, n - 1, (64,), generator=gen)] = 1.0
    mask[:8] = 0.0
    mask[:8, 3] = 1.0  # a single feasible action
    batch = {Columns.OBS: random_obs(env, 64, seed=2, mask=mask)}
    greedy = module.forward_inference(batch)[Columns.ACTIONS]
    expected = (q.expand(64, n) - 1e9 * (1 - mask)).argmax(-1)
    assert torch.equal(greedy, expected)
    seen = set()
    for t in range(20):
        actions = module.forward_exploration(batch, t=t)[Columns.ACTIONS]
        assert mask.gather(1, actions[:, None]).all()
        seen.update(actions[8:].tolist())
    assert len(seen) > 10  # epsilon = 1: uniform over the feasible actions, not greedy


def test_dqn_masked_double_q_target_equals_hand_computed(env: ClusterSchedulingEnv) -> None:
    """Stock DQNTorchLearner loss on the module's outputs: argmax over FEASIBLE next actions."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
    from ray.rllib.utils.metrics import TD_ERROR_KEY
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    n = env.n_actions
    module = build(MaskedDQNTorchRLModule, env, double_q=True)
    module.make_target_networks()
    online = [0.0] * n
    online[:4] = [1.0, 5.0, 3.0, 2.0]
    target = [0.0] * n
    target[:4] = [10.0, 20.0, 30.0, 40.0]
    _set_q_bias(module, online, target)
    next_mask = torch.zeros(2, n)
    next_mask[0, [0, 2, 3]] = 1.0  # online best feasible: 2 (Q=3); target there: 30
    next_mask[1, 3] = 1.0  # only 3 feasible; target there: 40
    batch = {
        Columns.OBS: random_obs(env, 2, seed=3),
        Columns.NEXT_OBS: random_obs(env, 2, seed=4, mask=next_mask),
        Columns.ACTIONS: torch.tensor([0, 1]),
        Columns.REWARDS: torch.tensor([1.0, -1.0]),
        Columns.TERMINATEDS: torch.tensor([False, False]),
        "n_step": torch.tensor([1, 1]), "weights": torch.ones(2),
    }
    config = DQNConfig().training(double_q=True, gamma=0.9, td_error_loss_fn="mse")
    stub = types.SimpleNamespace(metrics=MetricsLogger(), config=config)
    loss = DQNTorchLearner.compute_loss_for_module(
        stub, module_id="m", config=config, batch=batch, fwd_out=module.forward_train(batch))
    targets = np.array([1.0 + 0.9 * 30.0, -1.0 + 0.9 * 40.0])  # 28, 35
    q_selected = np.array([1.0, 5.0])
    td = np.asarray(stub.metrics.peek(("m", TD_ERROR_KEY)), dtype=np.float64).ravel()
    np.testing.assert_allclose(td, np.abs(q_selected - targets), rtol=1e-6)
    mse = float(np.mean((q_selected - targets) ** 2))
    assert math.isclose(float(loss.detach()), mse, rel_tol=1e-6)
    # Unmasked, row 0 would bootstrap from action 1 (online Q=5): 1 + 0.9 * 20 = 19.
    assert not math.isclose(td[0], abs(1.0 - 19.0))


# -- one training iteration each, with a checkpoint round trip -------------------------------

def _greedy(module: RLModule, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    out = module.forward_inference({Columns.OBS: obs})
    if Columns.ACTIONS in out:
        return out[Columns.ACTIONS]
    return out[Columns.ACTION_DIST_INPUTS].argmax(-1)


def _check_iteration_and_checkpoint(algo, tmp_path: Path, obs: dict[str, torch.Tensor],
                                    loss_key: str) -> None:
    result = algo.train()
    assert result[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED] > 0
    stats = result[LEARNER_RESULTS][DEFAULT_MODULE_ID]
    assert math.isfinite(float(stats[loss_key]))
    # Every action the trained policy takes while exploring is feasible.
    episodes = algo.env_runner.sample(num_timesteps=50, explore=True)
    infos = [i for ep in episodes for i in ep.get_infos()[1:]]
    assert infos and not any(i["invalid_action"] for i in infos)
    path = algo.save_to_path(str(tmp_path / "ckpt"))
    restored = RLModule.from_checkpoint(Path(path) / COMPONENT_LEARNER_GROUP / COMPONENT_LEARNER
                                        / COMPONENT_RL_MODULE / DEFAULT_MODULE_ID)
    actions = _greedy(algo.get_module(), obs)
    assert torch.equal(_greedy(restored, obs), actions)
    assert obs["action_mask"].gather(1, actions[:, None]).all()
    algo.stop()


@pytest.mark.usefixtures("ray_session")
def test_ppo_trains_one_iteration_and_checkpoint_round_trips(
        tmp_path: Path, real_obs: dict[str, torch.Tensor]) -> None:
    from ray.rllib.algorithms.ppo import PPOConfig

    register_rllib_envs()
    config = (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .environment(FLAT_ID, env_config=ENV_CONFIG)
        .env_runners(num_env_runners=0, rollout_fragment_length=64)
        .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=MaskedPPOTorchRLModule,
                                               model_config=TINY_MODEL))
    )
    _check_iteration_and_checkpoint(config.build_algo(), tmp_path, real_obs, "policy_loss")


@pytest.mark.usefixtures("ray_session")
def test_dqn_trains_one_iteration_and_checkpoint_round_trips(
        tmp_path: Path, real_obs: dict[str, torch.Tensor]) -> None:
    from ray.rllib.algorithms.dqn import DQNConfig

    register_rllib_envs()
    config = (
        DQNConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .environment(FLAT_ID, env_config=ENV_CONFIG)
        .env_runners(num_env_runners=0, rollout_fragment_length=16)
        .reporting(min_sample_timesteps_per_iteration=64)
        .training(
            double_q=True, dueling=False, n_step=1, train_batch_size_per_learner=32,
            num_steps_sampled_before_learning_starts=32, target_network_update_freq=32,
            epsilon=[(0, 1.0), (1000, 0.1)],
            replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 2000,
                                  "alpha": 0.6, "beta": 0.4},
        )
        .rl_module(rl_module_spec=RLModuleSpec(module_class=MaskedDQNTorchRLModule,
                                               model_config=TINY_MODEL))
    )
    _check_iteration_and_checkpoint(config.build_algo(), tmp_path, real_obs, "qf_loss")
