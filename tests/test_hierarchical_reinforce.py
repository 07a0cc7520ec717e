"""The REINFORCE gate learns to avoid a bad sub-agent."""

from __future__ import annotations

import numpy as np

from cloudrl.algorithms.hierarchical.policy import HierarchicalPolicy
from cloudrl.algorithms.hierarchical.reinforce import ReinforceGate, train_reinforce_gate
from cloudrl.evaluate import run_episode
from cloudrl.heuristics import make_heuristic
from envs.cluster_env import ClusterSchedulingEnv

ENV = {"n_servers": 6, "sim": {"episode_length": 60}}


class Waiter:
    """Never places a job: its ticks pile up violations."""

    name = "waiter"

    def reset(self) -> None:
        pass

    def act(self, obs):
        return int(obs["action_mask"].shape[0] - 1)


def test_untrained_gate_is_uniform_and_greedy_is_deterministic() -> None:
    gate = ReinforceGate(5, 3)
    np.testing.assert_allclose(gate.probs(np.ones(5)), [1 / 3] * 3)
    assert gate.choose(np.ones(5)) == 0


def test_reinforce_gate_learns_to_pick_the_good_sub_agent() -> None:
    subs = [Waiter(), make_heuristic("power_aware")]
    gate, returns = train_reinforce_gate(ENV, subs, k=5, seeds=range(30))
    policy = HierarchicalPolicy(gate, subs, k=5)
    learned = run_episode(policy, ClusterSchedulingEnv(ENV), 1_000_000)
    picks = [i for _, i in policy.decisions]
    assert picks.count(1) / len(picks) >= 0.9, picks
    assert np.mean(returns[-5:]) > np.mean(returns[:5])
    alone = run_episode(make_heuristic("power_aware"), ClusterSchedulingEnv(ENV), 1_000_000)
    assert learned.episode_reward >= alone.episode_reward - 0.1 * abs(alone.episode_reward)
