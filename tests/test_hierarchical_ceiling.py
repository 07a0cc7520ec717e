"""The clairvoyant supervisor (the hierarchy's ceiling): copies are independent, one sub-agent
reproduces it exactly, and the rollout is never below its base sub-agent."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.algorithms.hierarchical.ceiling import clone_cluster, run_ceiling_episode
from cloudrl.algorithms.hierarchical.sub_agents import make_sub_agent
from cloudrl.algorithms.rollout import choose
from cloudrl.evaluate import make_env, run_episode
from envs.env_config import EnvConfig

SMALL = {"n_servers": 10, "workload": "google_v2_like", "sim": {"episode_length": 80}}


def _env(interface: str, workload: str = "google_v2_like"):
    return make_env(EnvConfig.model_validate({**SMALL, "workload": workload}), interface)


@pytest.mark.parametrize("interface", ["flat", "branching"])
def test_clone_is_independent(interface):
    env = _env(interface)
    policy = make_sub_agent("power_aware", interface)
    obs, _ = env.reset(seed=3)
    policy.reset()
    for _ in range(20):
        obs, *_ = env.step(policy.act(obs))
    before = (env.sim.t, env.sim.stats.energy_j, list(env.sim.queue), env.sim.dyn.copy(),
              list(policy._mean_job))
    twin, (twin_policy,) = clone_cluster(env, [policy])
    twin_obs = obs
    for _ in range(30):
        twin_obs, *_ = twin.step(twin_policy.act(twin_obs))
    assert twin.sim.t == before[0] + 30
    assert (env.sim.t, env.sim.stats.energy_j, list(env.sim.queue)) == before[:3]
    np.testing.assert_array_equal(env.sim.dyn, before[3])
    assert policy._mean_job == before[4]
    # the original goes on exactly as an uncloned run of the same seed
    for _ in range(30):
        obs, *_ = env.step(policy.act(obs))
    assert env.sim.stats.energy_j == pytest.approx(twin.sim.stats.energy_j, rel=0, abs=0)


@pytest.mark.parametrize("interface", ["flat", "branching"])
def test_single_sub_agent_is_that_sub_agent(interface):
    env = _env(interface)
    alone = run_episode(make_sub_agent("power_aware", interface), env, 5)
    ceiling = run_ceiling_episode(env, [make_sub_agent("power_aware", interface)], 5, k=7)
    assert ceiling.reward == alone.episode_reward
    assert ceiling.energy_kwh == pytest.approx(alone.energy_kwh, rel=1e-12)
    assert ceiling.choices == [0] * len(range(0, 80, 7))


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 10_000), interface=st.sampled_from(["flat", "branching"]),
       k=st.integers(5, 20))
def test_never_below_its_base(seed, interface, k):
    """One-step policy improvement with the true future, base played to the end."""
    env = _env(interface, "poisson" if seed % 2 else "google_v2_like")
    base = run_episode(make_sub_agent("sjf", interface), env, seed).episode_reward
    subs = [make_sub_agent(s, interface) for s in ("sjf", "power_aware")]
    ceiling = run_ceiling_episode(env, subs, seed, k, base=0)
    assert ceiling.reward >= base - 1e-9
    assert sum(ceiling.share(2)) == pytest.approx(1.0)


def test_sub_agents_that_differ_are_used():
    """power_aware over sjf saves energy on this seed: the ceiling picks it and gains."""
    env = _env("branching", "poisson")
    base = run_episode(make_sub_agent("sjf", "branching"), env, 1)
    subs = [make_sub_agent(s, "branching") for s in ("sjf", "power_aware")]
    ceiling = run_ceiling_episode(env, subs, 1, 10, base=0)
    assert ceiling.share(2)[1] > 0
    assert ceiling.reward > base.episode_reward


def test_pick_rules_by_hand():
    scores = np.array([[10.0, 12.0, 30.0], [10.0, 11.0, 5.0]])  # 2 futures, 3 sub-agents
    assert choose(scores, "mean", base=0) == 2  # means 10, 11.5, 17.5
    assert choose(scores, "consistent", base=0) == 1  # only 1 beats 0 in both futures
    assert choose(scores[:, [0, 2]], "consistent", base=0) == 0
    assert choose(np.array([[5.0, 5.0]]), "mean", base=1) == 1  # ties go to the base


def test_resampled_futures_are_reproducible_and_never_see_the_real_one():
    env = _env("branching", "poisson")

    def subs():
        return [make_sub_agent(s, "branching") for s in ("power_aware", "sjf")]

    a = run_ceiling_episode(env, subs(), 2, 10, futures="resampled", n_futures=2)
    b = run_ceiling_episode(env, subs(), 2, 10, futures="resampled", n_futures=2)
    true = run_ceiling_episode(env, subs(), 2, 10)
    assert (a.reward, a.choices) == (b.reward, b.choices)
    assert a.scores != true.scores  # the rollouts played other arrivals


@pytest.mark.parametrize("kwargs, field", [({"k": 0}, "k"), ({"k": 5, "base": 2}, "base"),
                                           ({"k": 5, "horizon": -1}, "horizon"),
                                           ({"k": 5, "futures": "psychic"}, "futures"),
                                           ({"k": 5, "n_futures": 0}, "n_futures"),
                                           ({"k": 5, "rule": "max"}, "rule")])
def test_bad_arguments_name_the_field(kwargs, field):
    env = _env("flat")
    subs = [make_sub_agent("sjf", "flat"), make_sub_agent("power_aware", "flat")]
    with pytest.raises(ValueError, match=field):
        run_ceiling_episode(env, subs, 0, **kwargs)
