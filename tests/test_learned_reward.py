"""Phase 3 of alignment: the learned-reward connector (PPO and BDQ), the anchors, re-querying.

Tiny env (5 servers, 50-step episodes). Rewards are checked on the batches RLlib's own
learner connector pipelines build (PPO: after GAE's extra step; BDQ: n-step replay).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.env_config import EnvConfig

pytestmark = pytest.mark.usefixtures("ray_session")

ENV = EnvConfig.model_validate({"n_servers": 5, "sim": {"episode_length": 50}})
NET = {"hidden": 16, "macro_hiddens": [16], "row_hiddens": [16], "head_hiddens": [16]}
SCALE, TARGET_STD, GAMMA = 0.01, 2.0, 0.9


def rollout(interface: str, steps: int, seed: int = 3):
    """A SingleAgentEpisode of random feasible actions, with its obs list and env rewards."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from cloudrl.policy import make_env

    env = make_env(ENV, interface)
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    ep = SingleAgentEpisode(observation_space=env.observation_space,
                            action_space=env.action_space)
    ep.add_env_reset(observation=obs, infos=info)
    observations, rewards = [obs], []
    for _ in range(steps):
        action = env.action_space.sample()
        if interface == "flat":
            action = int(rng.choice(np.flatnonzero(obs["action_mask"] > 0.5)))
        obs, r, term, trunc, info = env.step(action)
        r = float(r) * SCALE
        ep.add_env_step(observation=obs, action=action, reward=r, infos=info)
        observations.append(obs)
        rewards.append(r)
    return ep, observations, np.asarray(rewards, np.float32)


@pytest.fixture(scope="module")
def reward(tmp_path_factory):
    """A random small reward ensemble for the tiny env: (model, payload)."""
    from cloudrl.alignment.learned_reward import reward_payload
    from cloudrl.alignment.reward_model import RewardModelConfig, net_spec
    from models.reward_net import build_reward_ensemble

    _, observations, _ = rollout("flat", 1)
    o = observations[0]
    shape = {"macro_dim": o["macro"].shape[0], "n_servers": o["servers"].shape[0],
             "server_dim": o["servers"].shape[1], "k_slots": o["jobs"].shape[0],
             "job_dim": o["jobs"].shape[1]}
    torch.manual_seed(0)
    spec = net_spec(RewardModelConfig(net=NET, ensemble_size=2), shape)
    model = build_reward_ensemble(spec).eval()
    return model, reward_payload(model, spec, mean=0.3, std=0.05)


def expected_model_rewards(model, observations: list) -> np.ndarray:
    """The connector's reward of every step of n+1 observations: r(o_t, o_{t+1}), scored
    one transition at a time (ensemble mean, the fixture's normalisation and scales)."""
    out = []
    with torch.no_grad():
        for prev, nxt in zip(observations[:-1], observations[1:], strict=False):
            pair = [{k: torch.as_tensor(o[k], dtype=torch.float32)[None]
                     for k in ("macro", "servers", "jobs")} for o in (prev, nxt)]
            out.append(float(np.mean([m.reward(*pair).item() for m in model.members])))
    return SCALE * TARGET_STD * (np.asarray(out) - 0.3) / 0.05


def tiny_train_config(algo: str, hparams: dict | None = None):
    from cloudrl.training import TrainConfig

    defaults = {"ppo": {"train_batch_size_per_learner": 100, "minibatch_size": 50,
                        "num_epochs": 1},
                "appo": {"train_batch_size_per_learner": 100}}.get(
        algo, {"num_steps_sampled_before_learning_starts": 0, "gamma": GAMMA})
    return TrainConfig(algo=algo, env=ENV, env_steps=200, hidden=16, envs_per_runner=1,
                       reward_scale=SCALE, hparams={**defaults, **(hparams or {})})


def build(algo: str, payload, *, mix: float = 1.0, anchor: dict | None = None,
          requery=None, hparams: dict | None = None):
    from cloudrl.alignment.phase3 import configure_phase3
    from cloudrl.training import build_algo_config

    cfg = tiny_train_config(algo, hparams)
    if payload is None:
        return build_algo_config(cfg).build_algo()
    return build_algo_config(cfg, lambda c: configure_phase3(
        c, algo, reward=payload, mix=mix, reward_scale=SCALE, target_std=TARGET_STD,
        anchor=anchor or {}, requery=requery)).build_algo()


def learner_batch(algo, episodes) -> dict:
    learner = algo.learner_group._learner
    batch = learner._learner_connector(rl_module=learner.module, batch={},
                                       episodes=episodes, shared_data={}, metrics=None)
    return {k: (v.detach().cpu().numpy() if torch.is_tensor(v) else v)
            for k, v in batch["default_policy"].items() if not isinstance(v, dict)}


# ----------------------------------------------------------------------------- connector


def test_ppo_connector_replaces_then_mixes_rewards_before_gae(reward):
    from ray.rllib.core.columns import Columns

    from cloudrl.alignment.learned_reward import find_connector

    model, payload = reward
    algo = build("ppo", payload, mix=1.0)
    try:
        ep, observations, env_r = rollout("flat", 12)
        want = expected_model_rewards(model, observations)
        batch = learner_batch(algo, [copy.deepcopy(ep)])
        rewards, mask = batch[Columns.REWARDS], batch[Columns.LOSS_MASK].astype(bool)
        assert mask.sum() == 12 and not mask[-1]  # GAE's artificial step is masked ...
        np.testing.assert_allclose(rewards[mask], want, rtol=1e-5, atol=1e-7)
        assert rewards[~mask][0] == 0.0  # ... and keeps its 0 reward
        assert not np.allclose(want, env_r, atol=1e-3)  # the test can tell them apart
        assert "advantages" in batch and "value_targets" in batch

        find_connector(algo.learner_group._learner).mix = 0.5
        batch = learner_batch(algo, [copy.deepcopy(ep)])
        np.testing.assert_allclose(batch[Columns.REWARDS][mask], 0.5 * want + 0.5 * env_r,
                                   rtol=1e-5, atol=1e-7)
    finally:
        algo.stop()


def test_bdq_connector_n_step_sums_use_rewritten_rewards(reward):
    from ray.rllib.core.columns import Columns

    from cloudrl.alignment.learned_reward import find_connector

    model, payload = reward
    algo = build("bdq", payload, mix=1.0, hparams={"n_step": 3})
    try:
        ep, observations, env_r = rollout("branching", 15)
        model_r = expected_model_rewards(model, observations)
        buffer = algo.local_replay_buffer
        assert type(buffer).__name__ == "LearnedRewardPrioritizedEpisodeReplayBuffer"
        buffer.add([ep.to_numpy()])
        for mix in (1.0, 0.5):
            find_connector(algo.learner_group._learner).mix = mix
            sampled = buffer.sample(num_items=16, n_step=3, gamma=GAMMA)
            starts = [int(s.t_started) for s in sampled]
            batch = learner_batch(algo, sampled)
            disc = GAMMA ** np.arange(3)
            want = [mix * float(model_r[t:t + 3] @ disc)
                    + (1 - mix) * float(env_r[t:t + 3].astype(np.float64) @ disc)
                    for t in starts]
            np.testing.assert_allclose(batch[Columns.REWARDS], want, rtol=1e-5, atol=1e-7)
            assert (batch["n_step"] == 3).all()
    finally:
        algo.stop()


def test_reward_fixture_is_a_transition_reward(reward):
    """The default net on env observations reads (s, s'): the macro violation_rate column."""
    from envs.observation import MACRO_TAIL

    model, payload = reward
    assert model.transition
    macro_dim = payload["spec"]["macro_dim"]
    assert payload["spec"]["transition_features"] == {
        "violation_rate": macro_dim - len(MACRO_TAIL) + MACRO_TAIL.index("violation_rate"),
        "ema": 0.05}


def _with_violation_rates(observations: list, rates: list[float]) -> list:
    """Copies of the observations whose macro violation_rate is set by hand."""
    from envs.observation import MACRO_TAIL

    out = []
    for o, rate in zip(observations, rates, strict=True):
        o = {k: np.array(v, copy=True) for k, v in o.items()}
        o["macro"][len(o["macro"]) - len(MACRO_TAIL) + MACRO_TAIL.index("violation_rate")] = rate
        out.append(o)
    return out


def test_connector_scores_each_step_from_its_own_transition_by_hand(reward):
    """A 3-step episode and a replayed 3-step transition, rewards checked against the
    per-transition computation: the step violations the net sees are the hand-computed
    (ema' - 0.95 ema) / 0.05, and changing only o_1 changes the rewards of the two steps
    that touch it (steps 0 and 1), not step 2."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from cloudrl.alignment.learned_reward import INTERMEDIATE_OBS, LearnedRewardConnector
    from models.reward_net import TransitionFeatures

    model, payload = reward
    _, observations, _ = rollout("flat", 3)
    rates = [0.0, 0.05, 0.0975, 0.5]  # violations 1, 1, 8.1475 per step
    obs = _with_violation_rates(observations, rates)
    feats = TransitionFeatures(**payload["spec"]["transition_features"])
    macro = torch.as_tensor(np.stack([o["macro"] for o in obs]))
    np.testing.assert_allclose(feats.violations(macro[:-1], macro[1:]).numpy(),
                               [1.0, 1.0, (0.5 - 0.95 * 0.0975) / 0.05], rtol=1e-5)

    def episode(observations):
        return SingleAgentEpisode(observations=observations, actions=[0, 0, 0],
                                  rewards=[0.0, 0.0, 0.0], len_lookback_buffer=0)

    piece = LearnedRewardConnector(reward=payload, reward_scale=SCALE, target_std=TARGET_STD,
                                   gamma=GAMMA)
    ep = episode(obs)
    piece(rl_module=None, batch={}, episodes=[ep], shared_data={})
    want = expected_model_rewards(model, obs)
    np.testing.assert_allclose(ep.get_rewards(), want, rtol=1e-5, atol=1e-7)
    # only o_1 differs (its violation EMA): steps 0 and 1 change, step 2 does not
    other = _with_violation_rates(observations, [0.0, 0.2, 0.0975, 0.5])
    ep2 = episode(other)
    piece(rl_module=None, batch={}, episodes=[ep2], shared_data={})
    got2 = np.asarray(ep2.get_rewards())
    assert abs(got2[0] - want[0]) > 1e-6 and abs(got2[1] - want[1]) > 1e-6
    assert got2[2] == pytest.approx(want[2], rel=1e-6, abs=1e-9)
    # a replayed 3-step transition (o_0, a, R, o_3) with o_1, o_2 attached: the
    # discounted sum of the same three transition rewards
    replayed = SingleAgentEpisode(observations=[obs[0], obs[3]], actions=[0], rewards=[0.0],
                                  extra_model_outputs={"n_step": [3]}, len_lookback_buffer=0)
    replayed.custom_data[INTERMEDIATE_OBS] = [obs[1], obs[2]]
    piece(rl_module=None, batch={}, episodes=[replayed], shared_data={})
    assert replayed.get_rewards(0) == pytest.approx(float(want @ GAMMA ** np.arange(3)),
                                                    rel=1e-5)
    # a state reward (checkpoints from before transition rewards) scores o_{t+1} alone
    from cloudrl.alignment.learned_reward import reward_payload
    from cloudrl.alignment.reward_model import RewardModelConfig, RewardNetSpec, net_spec
    from models.reward_net import build_reward_ensemble

    spec = {**payload["spec"], "transition_features": None}
    assert spec == net_spec(RewardModelConfig(net=RewardNetSpec(
        **NET, transition_features=False), ensemble_size=2), {
        k: payload["spec"][k] for k in ("macro_dim", "n_servers", "server_dim", "k_slots",
                                        "job_dim")})
    torch.manual_seed(0)
    state_net = build_reward_ensemble(spec).eval()
    state_piece = LearnedRewardConnector(reward=reward_payload(state_net, spec, 0.3, 0.05),
                                         reward_scale=SCALE, target_std=TARGET_STD)
    ep3 = episode(obs)
    state_piece(rl_module=None, batch={}, episodes=[ep3], shared_data={})
    with torch.no_grad():
        nxt = {k: torch.as_tensor(np.stack([o[k] for o in obs[1:]]), dtype=torch.float32)
               for k in ("macro", "servers", "jobs")}
        raw = state_net(nxt).mean(0).double().numpy()
    np.testing.assert_allclose(ep3.get_rewards(), SCALE * TARGET_STD * (raw - 0.3) / 0.05,
                               rtol=1e-5, atol=1e-7)


def test_nstep_without_intermediate_observations_is_an_error(reward):
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from cloudrl.alignment.learned_reward import LearnedRewardConnector

    _, payload = reward
    ep, observations, _ = rollout("flat", 3)
    replayed = SingleAgentEpisode(observations=[observations[0], observations[3]],
                                  actions=[0], rewards=[0.0],
                                  extra_model_outputs={"n_step": [3]}, len_lookback_buffer=0)
    piece = LearnedRewardConnector(reward=payload)
    with pytest.raises(ValueError, match="LearnedRewardPrioritizedEpisodeReplayBuffer"):
        piece(rl_module=None, batch={}, episodes=[replayed], shared_data={})


# ----------------------------------------------------------------------------- anchors


def _state(algo) -> dict:
    return {k: v.detach().clone() for k, v in
            algo.learner_group._learner.module["default_policy"].state_dict().items()}


def _update(algo, episodes, **kw) -> tuple[dict, dict]:
    """The module's state after one update on ``episodes``, and the update's results.

    APPO's learner hands batches to its learner thread; the update that thread runs is
    called here directly, so it is done (and its metrics are ours) on return."""
    from ray.rllib.algorithms.impala.impala_learner import IMPALALearner
    from ray.rllib.core.learner.learner import Learner

    np.random.seed(0)
    torch.manual_seed(0)
    learner = algo.learner_group._learner
    if isinstance(learner, IMPALALearner):
        results = Learner.update(learner, episodes=copy.deepcopy(episodes), timesteps={},
                                 **kw)
    else:
        results = algo.learner_group.update(episodes=copy.deepcopy(episodes), **kw)[0]
    return _state(algo), results


def _same_start(a, b) -> None:
    """``b``'s module (and target networks) set to ``a``'s weights."""
    b.learner_group._learner.module["default_policy"].load_state_dict(_state(a))
    for algo in (a, b):
        module = algo.learner_group._learner.module["default_policy"]
        for target, online in getattr(module, "get_target_network_pairs", list)():
            target.load_state_dict(online.state_dict())


@pytest.mark.parametrize("algo_name", ["ppo", "appo", "bdq"])
def test_anchor_weight_zero_is_the_plain_update_bit_for_bit(algo_name, tmp_path):
    from cloudrl.algorithms.anchor import KL_KEY, MARGIN_KEY
    from cloudrl.algorithms.specs import load, spec_of
    from cloudrl.recording import record_episodes
    from cloudrl.training import build_algo_config

    anchored_cls = load(spec_of(algo_name).anchored_learner)
    interface = spec_of(algo_name).interface
    plain = build(algo_name, None)
    ref_dir = tmp_path / "bc"
    ref = copy.deepcopy(plain.learner_group._learner.module["default_policy"])
    torch.manual_seed(1)
    with torch.no_grad():  # a reference the start is not at: the KL is > 0 from step 1
        for p in ref.parameters():
            p.add_(0.5 * torch.randn_like(p))
    ref.save_to_path(str(ref_dir))
    record_episodes("power_aware", tmp_path / "demos", env_config=ENV, interface=interface,
                    episodes=1, max_steps=20)
    cfg = tiny_train_config(algo_name)
    algos = {}
    for coeff in (0.0, 1.0):
        anchor = {"coeff": coeff, "module": str(ref_dir), "demos": str(tmp_path / "demos"),
                  "batch": 16}
        algos[coeff] = build_algo_config(cfg, lambda c, a=anchor: c.learners(
            learner_class=anchored_cls, learner_config_dict={"anchor": a})).build_algo()
        assert isinstance(algos[coeff].learner_group._learner, anchored_cls)
    try:
        if algo_name in ("ppo", "appo"):
            episodes = plain.env_runner.sample(num_timesteps=100, random_actions=False)
            kw = {"minibatch_size": 50, "num_epochs": 1} if algo_name == "ppo" else {}
        else:
            buffer = plain.local_replay_buffer
            buffer.add(plain.env_runner.sample(num_timesteps=64, random_actions=True))
            episodes = buffer.sample(num_items=32, n_step=1, gamma=0.99, beta=0.4)
            kw = {}
        for a in algos.values():
            _same_start(plain, a)
        before = _state(plain)
        want, _ = _update(plain, episodes, **kw)
        got0, results0 = _update(algos[0.0], episodes, **kw)
        got1, results1 = _update(algos[1.0], episodes, **kw)
        assert any(not torch.equal(want[k], before[k]) for k in want)  # it learned
        for k in want:
            assert torch.equal(want[k], got0[k]), k  # weight 0: plain, bit for bit
        assert any(not torch.equal(want[k], got1[k]) for k in want)  # weight 1 differs
        key = MARGIN_KEY if algo_name == "bdq" else KL_KEY
        assert key not in results0["default_policy"]  # weight 0: nothing computed
        logged = float(results1["default_policy"][key])
        assert math.isfinite(logged) and logged > 0.0  # KL(pi_bc || pi), margin loss
    finally:
        plain.stop()
        for a in algos.values():
            a.stop()


def test_kl_anchor_is_zero_against_itself_and_positive_otherwise():
    from cloudrl.algorithms.anchor import masked_kl

    logits = torch.tensor([[1.0, 2.0, -3.4e38], [0.5, 0.5, 0.0]])
    assert torch.allclose(masked_kl(logits, logits), torch.zeros(2))
    other = torch.tensor([[2.0, 1.0, -3.4e38], [0.0, 0.5, 0.5]])
    kl = masked_kl(logits, other)
    p = torch.softmax(torch.tensor([1.0, 2.0]), 0)
    q = torch.softmax(torch.tensor([2.0, 1.0]), 0)
    assert torch.isclose(kl[0], (p * (p.log() - q.log())).sum())
    assert (kl > 0).all() and torch.isfinite(kl).all()


# ----------------------------------------------------------------------------- re-query


def test_requery_adds_teacher_pairs_and_changes_the_learner_reward(reward, tmp_path):
    from cloudrl.alignment.learned_reward import learner_reward_state
    from cloudrl.alignment.requery import Requery, RequeryConfig
    from cloudrl.alignment.teacher import TeacherConfig, make_teacher_pairs
    from cloudrl.data.pairs import read_pairs
    from cloudrl.recording import record_episodes

    model, payload = reward
    record_episodes("power_aware", tmp_path / "demos", env_config=ENV, episodes=1)
    make_teacher_pairs(str(tmp_path / "demos"), 12, 5, 0, tmp_path / "pairs")
    pairs = read_pairs(tmp_path / "pairs")
    rq = Requery(RequeryConfig(every=1, pairs=6, label_budget=9, epochs=2, lr=1e-2),
                 TeacherConfig(), copy.deepcopy(model), payload["spec"], pairs,
                 tmp_path / "requery")
    algo = build("ppo", payload, requery=rq)
    try:
        before = learner_reward_state(algo)[0]["reward"]["state_dict"]
        first = algo.train()["learned_reward"]
        assert first["new_pairs"] == 6 and first["labels_used"] == 6
        assert first["pairs_total"] == 12 + 6 and first["episodes"] >= 1
        assert len(read_pairs(tmp_path / "requery" / "pairs")) == 6
        after = learner_reward_state(algo)[0]
        assert after["version"] == 1
        assert any(not torch.equal(before[k], after["reward"]["state_dict"][k]) for k in before)
        second = algo.train()["learned_reward"]
        assert second["new_pairs"] == 3 and second["labels_used"] == 9  # budget spent
        assert "learned_reward" not in algo.train()  # no labels left: no re-query
        assert len(read_pairs(tmp_path / "requery" / "pairs")) == 9
    finally:
        algo.stop()


def test_requery_cuts_segments_across_sampled_chunks():
    from cloudrl.alignment.requery import collect_episodes, pop_episodes

    ep, _, _ = rollout("flat", 12)
    first, rest = ep.slice(slice(0, 5)), ep.slice(slice(5, 12))

    class Runner:
        pass

    runner = Runner()
    collect_episodes(env_runner=runner, samples=[first], max_episodes=4)
    collect_episodes(env_runner=runner, samples=[rest], max_episodes=4)
    (joined,) = pop_episodes(runner)
    assert joined.length == 12 and joined.macro.shape[0] == 13
    whole = __import__("cloudrl.data.segments", fromlist=["x"]).episode_data(ep)
    np.testing.assert_array_equal(joined.macro, whole.macro)
    np.testing.assert_array_equal(joined.violations, whole.violations)
    assert pop_episodes(runner) == []


def test_phase3_checkpoint_loads_in_cloudrl_evaluate(reward, tmp_path):
    from cloudrl.alignment.phase3 import Phase3Config, train_phase3
    from cloudrl.alignment.pipeline import evaluate_checkpoint
    from cloudrl.alignment.reward_model import _write_checkpoint
    from cloudrl.alignment.teacher import make_teacher_pairs
    from cloudrl.recording import record_episodes

    model, payload = reward
    record_episodes("power_aware", tmp_path / "demos", env_config=ENV, episodes=1)
    make_teacher_pairs(str(tmp_path / "demos"), 8, 5, 0, tmp_path / "pairs")
    (tmp_path / "rm").mkdir()
    _write_checkpoint(tmp_path / "rm", model, payload["spec"], [], {})
    cfg = Phase3Config(env_steps=100, reward_model=str(tmp_path / "rm"),
                       pairs=str(tmp_path / "pairs"), bc_module=None, hidden=16,
                       envs_per_runner=1, out=str(tmp_path / "policy"),
                       hparams={"train_batch_size_per_learner": 100, "minibatch_size": 50,
                                "num_epochs": 1})
    res = train_phase3(cfg, ENV)
    assert Path(res.checkpoint, "phase3.json").is_file()
    row = evaluate_checkpoint(res.checkpoint, ENV, n_seeds=2)
    assert row["episodes"] == 2 and np.isfinite(row["episode_reward_mean"])
