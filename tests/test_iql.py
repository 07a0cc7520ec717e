"""Implicit Q-learning (cloudrl/algorithms/iql): the expectile loss, the joint action
index, and that the extracted policy improves on the data where the values say so."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.algorithms.distill.policy import build_module
from cloudrl.algorithms.iql import IQLConfig, Transitions, train_iql
from cloudrl.algorithms.iql.learner import expectile_loss, joint_index
from envs.scenario.env import OBS_NAMES, READY_MARGINS, RELEASE_LEVELS


@given(st.lists(st.floats(-100, 100), min_size=1, max_size=20), st.floats(0.5, 0.99))
@settings(max_examples=50, deadline=None)
def test_expectile_loss_weights_positive_errors_by_tau(diffs, tau):
    d = torch.tensor(diffs, dtype=torch.float64)
    want = np.mean([(tau if x >= 0 else 1 - tau) * x * x for x in diffs])
    assert float(expectile_loss(d, tau)) == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_expectile_of_a_sample_moves_from_its_mean_towards_its_max():
    sample = torch.tensor([0.0, 1.0, 2.0, 10.0])
    fits = []
    for tau in (0.5, 0.8, 0.99):
        v = torch.zeros(1, requires_grad=True)
        opt = torch.optim.Adam([v], lr=0.05)
        for _ in range(3000):
            loss = expectile_loss(sample - v, tau)
            opt.zero_grad()
            loss.backward()
            opt.step()
        fits.append(float(v.detach()))
    assert fits[0] == pytest.approx(3.25, abs=0.05)  # the mean
    assert fits[0] < fits[1] < fits[2] < 10.0


@given(st.integers(0, len(RELEASE_LEVELS) - 1), st.integers(0, len(READY_MARGINS) - 1))
def test_joint_index_is_the_flat_env_action(i, j):
    got = joint_index(torch.tensor([[i, j]]), [len(RELEASE_LEVELS), len(READY_MARGINS)])
    assert int(got[0]) == i * len(READY_MARGINS) + j


def _chain(n: int, seed: int) -> Transitions:
    """Two-step episodes: the first decision's release level decides the second step's
    reward (level 2: +1 later, anything else: -1); the data picks level 2 only 20% of the
    time, so cloning it picks another level, and only a learned value finds level 2."""
    rng = np.random.default_rng(seed)
    d = len(OBS_NAMES)
    obs, nxt, acts, rew, done = [], [], [], [], []
    for _ in range(n):
        s0 = np.zeros(d, np.float32)
        s0[0] = rng.normal(0.0, 0.1)
        level = 2 if rng.random() < 0.2 else int(rng.choice([0, 1, 3]))
        s1 = s0.copy()
        s1[1] = 1.0 if level == 2 else -1.0
        s2 = s1.copy()
        s2[2] = 1.0
        obs += [s0, s1]
        nxt += [s1, s2]
        acts += [[level, 0], [0, 0]]
        rew += [0.0, 1.0 if level == 2 else -1.0]
        done += [0.0, 1.0]
    return Transitions(np.array(obs), np.array(acts, np.int64), np.array(rew),
                       np.array(nxt), np.array(done, np.float32))


def test_the_extracted_policy_takes_the_rarely_logged_action_the_values_favour():
    data = _chain(300, 0)
    first = data.obs[::2]
    module = build_module((32,))
    cfg = IQLConfig(hiddens=(32,), policy_hiddens=(32,), critic_steps=1500,
                    policy_steps=800, gamma=0.9, lr=3e-3)
    stats = train_iql(module, data, cfg, log=lambda _: None)
    greedy = module.greedy(torch.as_tensor(first))[:, 0].numpy()
    assert np.mean(greedy == 2) > 0.95
    # cloning alone (beta 0: every logged action weighs the same) takes the common ones
    clone = build_module((32,))
    train_iql(clone, data, IQLConfig(hiddens=(32,), policy_hiddens=(32,), critic_steps=1,
                                     policy_steps=800, beta=0.0, lr=3e-3), log=lambda _: None)
    assert np.mean(clone.greedy(torch.as_tensor(first))[:, 0].numpy() == 2) < 0.05
    assert stats["q_greedy_minus_data"] > 0


def test_support_extraction_picks_the_best_supported_action_and_never_an_unsupported_one():
    data = _chain(300, 1)
    first = data.obs[::2]
    module = build_module((32,))
    cfg = IQLConfig(hiddens=(32,), policy_hiddens=(32,), critic_steps=1500, policy_steps=800,
                    gamma=0.9, lr=3e-3, extract="support", support=0.3)
    stats = train_iql(module, data, cfg, log=lambda _: None)
    assert np.mean(module.greedy(torch.as_tensor(first))[:, 0].numpy() == 2) > 0.95
    assert stats["support_greedy_moved_share"] > 0.3  # the first steps of most episodes
    # level 2 is in the behaviour's support (20% of its first steps, the others 27% each);
    # at a support of 0.9 it is not, and the policy keeps to the behaviour's levels
    strict = build_module((32,))
    train_iql(strict, data, IQLConfig(hiddens=(32,), policy_hiddens=(32,), critic_steps=1500,
                                      policy_steps=800, gamma=0.9, lr=3e-3,
                                      extract="support", support=0.9), log=lambda _: None)
    assert np.mean(strict.greedy(torch.as_tensor(first))[:, 0].numpy() == 2) < 0.05


def test_support_greedy_masks_joint_actions_by_the_behaviour_models_probability():
    from cloudrl.algorithms.iql.learner import support_greedy

    class Fixed:  # branch probabilities (0.6, 0.4) x (0.5, 0.5, 0.0+)
        def branch_logits(self, x):
            return [torch.log(torch.tensor([[0.6, 0.4]])).repeat(len(x), 1),
                    torch.log(torch.tensor([[0.5, 0.5, 1e-6]])).repeat(len(x), 1)]

    q = torch.tensor([[0.0, 1.0, 9.0, 2.0, 3.0, 9.0]])  # joint (i, j) -> i * 3 + j
    labels, _ = support_greedy(Fixed(), torch.zeros(1, 4), q, [2, 3], 0.5)
    assert labels.tolist() == [[1, 1]]  # (1, 1): q 3, prob 0.2 >= 0.5 * 0.3; j=2 masked
    labels, _ = support_greedy(Fixed(), torch.zeros(1, 4), q, [2, 3], 0.9)
    assert labels.tolist() == [[0, 1]]  # only (0, 0) and (0, 1) have 0.3 >= 0.9 * 0.3


def test_the_paired_critic_sees_through_each_seeds_luck():
    """Seeds with a large shared offset on every return (a spike, a burst of jobs) and, per
    seed, four episodes: level 2 at the first step gains 1 later, others lose 1; the seed's
    luck is 10x that. Against the other episodes of its seed, the luck cancels."""
    rng = np.random.default_rng(3)
    d = len(OBS_NAMES)
    obs, acts, rew, paired = [], [], [], []
    for _ in range(150):
        luck = rng.normal(0.0, 10.0)
        state = np.zeros(d, np.float32)
        state[0] = rng.normal(0.0, 0.1)
        levels = [2 if rng.random() < 0.2 else int(rng.choice([0, 1, 3])) for _ in range(4)]
        g = np.array([luck + (1.0 if lv == 2 else -1.0) for lv in levels])
        for k, lv in enumerate(levels):
            obs.append(state)
            acts.append([lv, 0])
            rew.append(g[k])
            paired.append(g[k] - np.mean(np.delete(g, k)))
    n = len(obs)
    data = Transitions(np.array(obs), np.array(acts, np.int64), np.array(rew), np.array(obs),
                       np.ones(n, np.float32), paired_returns=np.array(paired))
    cfg = IQLConfig(hiddens=(32,), policy_hiddens=(32,), critic_steps=1500, policy_steps=800,
                    lr=3e-3, critic="paired", extract="support")
    module = build_module((32,))
    stats = train_iql(module, data, cfg, log=lambda _: None)
    assert np.mean(module.greedy(torch.as_tensor(np.array(obs)))[:, 0].numpy() == 2) > 0.95
    assert stats["paired_return_std"] < 0.5 * np.std(rew) / np.mean(np.abs(rew))
    with pytest.raises(ValueError, match="paired_returns"):
        train_iql(build_module((32,)), Transitions(*(getattr(data, k) for k in (
            "obs", "actions", "rewards", "next_obs", "dones"))), cfg, log=lambda _: None)


def test_bad_config_and_data_name_the_field():
    with pytest.raises(ValueError, match="critic"):
        IQLConfig(critic="td")
    with pytest.raises(ValueError, match="extract"):
        IQLConfig(extract="greedy")
    with pytest.raises(ValueError, match="expectile"):
        IQLConfig(expectile=1.0)
    with pytest.raises(ValueError, match="gamma"):
        IQLConfig(gamma=1.0)
    with pytest.raises(ValueError, match="horizon"):
        IQLConfig(horizon=8)  # the expectile critic bootstraps; no horizon
    with pytest.raises(ValueError, match="horizon"):
        IQLConfig(critic="paired", horizon=0)
    assert IQLConfig(critic="paired", horizon=8).horizon == 8
    with pytest.raises(ValueError, match="rewards"):
        Transitions(np.zeros((2, 3)), np.zeros((2, 2)), np.zeros(3), np.zeros((2, 3)),
                    np.zeros(2))
