"""The hierarchical multi-agent env: turns, hand-back after k ticks or at the episode end,
rewards credited to the agent that acted, and exact reproduction of a sub-agent's episode."""

from __future__ import annotations

import numpy as np
import pytest

from cloudrl.algorithms.hierarchical.policy import HierarchicalPolicy
from cloudrl.algorithms.hierarchical.sub_agents import make_sub_agent
from cloudrl.algorithms.hierarchical.supervisors import FixedSupervisor, RuleSupervisor
from cloudrl.evaluate import run_episode
from cloudrl.heuristics import make_heuristic
from envs.cluster_env import ClusterSchedulingEnv
from envs.hierarchical_env import SUPERVISOR, HierarchicalClusterEnv
from envs.observation import MACRO_TAIL

ENV = {"n_servers": 6, "sim": {"episode_length": 25}}
SEED = 1_000_003


def external_env(k: int = 10, m: int = 2) -> HierarchicalClusterEnv:
    return HierarchicalClusterEnv({"env": ENV, "k": k, "sub_agents": [f"ext{i}" for i in
                                                                      range(m)]})


def test_only_the_active_agent_gets_observations_and_may_act() -> None:
    env = external_env()
    obs, _ = env.reset(seed=SEED)
    assert set(obs) == {SUPERVISOR}
    assert env.possible_agents == [SUPERVISOR, "sub_0", "sub_1"]
    with pytest.raises(ValueError, match="supervisor's turn"):
        env.step({"sub_0": 0})
    obs, rewards, *_ = env.step({SUPERVISOR: 1})
    assert set(obs) == {"sub_1"} and rewards == {}
    wait = env.base.wait_action
    for bad in ({"sub_0": wait}, {SUPERVISOR: 0}, {"sub_1": wait, SUPERVISOR: 0}):
        with pytest.raises(ValueError, match="sub_1's turn"):
            env.step(bad)
    obs, *_ = env.step({"sub_1": wait})
    assert set(obs) == {"sub_1"}


def test_supervisor_action_outside_its_space_is_refused() -> None:
    env = external_env()
    env.reset(seed=SEED)
    with pytest.raises(ValueError, match=r"supervisor action 2 outside Discrete\(2\)"):
        env.step({SUPERVISOR: 2})


@pytest.mark.parametrize("k", [1, 4, 10])
def test_control_returns_after_k_ticks_or_at_the_episode_end(k: int) -> None:
    env = external_env(k)
    env.reset(seed=SEED)
    wait = env.base.wait_action
    spans, done = [], False
    while not done:
        obs, _, term, trunc, info = env.step({SUPERVISOR: 0})
        ticks = 0
        while SUPERVISOR not in obs:
            obs, _, term, trunc, info = env.step({"sub_0": wait})
            ticks += 1
        spans.append(ticks)
        assert info[SUPERVISOR]["ticks"] == ticks
        done = trunc["__all__"]
        assert not term["__all__"]
    # 25 ticks: full spans of k, then the remainder when the episode ends
    expected = [k] * (25 // k) + ([25 % k] if 25 % k else [])
    assert spans == expected
    # at the end both the supervisor and the active sub-agent get their final observation
    assert set(obs) == {SUPERVISOR, "sub_0"}


def test_rewards_are_credited_to_the_agent_that_acted() -> None:
    k = 4
    env = external_env(k)
    twin = ClusterSchedulingEnv(ENV)  # the same episode without the hierarchy
    env.reset(seed=SEED)
    twin_obs, _ = twin.reset(seed=SEED)
    rng = np.random.default_rng(0)
    done, pick = False, 0
    while not done:
        obs, rewards, _, trunc, _ = env.step({SUPERVISOR: pick})
        assert rewards == {}
        agent = f"sub_{pick}"
        span_sum = 0.0
        while True:
            action = int(rng.choice(np.flatnonzero(twin_obs["action_mask"] > 0)))
            obs, rewards, _, trunc, _ = env.step({agent: action})
            twin_obs, r, *_ = twin.step(action)
            assert rewards[agent] == r  # the sub-agent gets its tick's reward, nobody else
            span_sum += r
            np.testing.assert_array_equal(env.cluster_obs["servers"], twin_obs["servers"])
            if SUPERVISOR in obs:
                assert set(rewards) == {agent, SUPERVISOR}
                assert rewards[SUPERVISOR] == pytest.approx(span_sum, rel=1e-12)
                break
            assert set(rewards) == {agent}
        done = trunc["__all__"]
        pick = 1 - pick


def test_reward_scale_scales_every_reward() -> None:
    plain = HierarchicalClusterEnv({"env": ENV, "k": 5, "sub_agents": ["power_aware"],
                                    "sub_agent_factory": make_sub_agent})
    scaled = HierarchicalClusterEnv({"env": ENV, "k": 5, "sub_agents": ["power_aware"],
                                     "sub_agent_factory": make_sub_agent,
                                     "reward_scale": 0.01})
    plain.reset(seed=SEED)
    scaled.reset(seed=SEED)
    _, r1, *_ = plain.step({SUPERVISOR: 0})
    _, r2, *_ = scaled.step({SUPERVISOR: 0})
    assert r1[SUPERVISOR] < 0
    assert r2[SUPERVISOR] == pytest.approx(0.01 * r1[SUPERVISOR])


SUBS = ["power_aware", "sjf", "round_robin"]
BIG = {"n_servers": 10, "workload": "google_v2_like", "sim": {"episode_length": 120}}


@pytest.mark.parametrize("i", range(len(SUBS)))
def test_supervisor_always_picking_i_reproduces_sub_agent_i_exactly(i: int) -> None:
    alone = run_episode(make_heuristic(SUBS[i]), ClusterSchedulingEnv(BIG), SEED)
    # the multi-agent env with embedded sub-agents
    env = HierarchicalClusterEnv({"env": BIG, "k": 7, "sub_agents": SUBS,
                                  "sub_agent_factory": make_sub_agent})
    for _ in range(2):  # the second episode on the same env too (sub-agents are reset)
        env.reset(seed=SEED)
        total, energy, done = 0.0, 0.0, False
        while not done:
            _, rewards, _, trunc, info = env.step({SUPERVISOR: i})
            total += rewards[SUPERVISOR]
            energy += info[SUPERVISOR]["energy_kwh"]
            done = trunc["__all__"]
        assert total == pytest.approx(alone.episode_reward, rel=1e-12)
        assert energy == pytest.approx(alone.energy_kwh, rel=1e-12)
    assert alone.jobs_ended > 0 and alone.toggles + alone.jobs_ended > 0
    # the hierarchy as a Policy, through the evaluation protocol's episode runner
    policy = HierarchicalPolicy(FixedSupervisor(i), [make_heuristic(s) for s in SUBS], k=7)
    for _ in range(2):  # run_episode resets the policy: the same episode again
        via_policy = run_episode(policy, ClusterSchedulingEnv(BIG), SEED)
        assert via_policy.as_dict() | {"policy": ""} == alone.as_dict() | {"policy": ""}
    assert {d for _, d in policy.decisions} == {i} and policy.decided_by == SUBS[i]
    assert [t for t, _ in policy.decisions] == list(range(0, 120, 7))


def test_hierarchy_switching_sub_agents_matches_the_env_episode() -> None:
    """Policy and env follow the same schedule: same decisions, same return."""
    rule = RuleSupervisor(power=0, sla=1, load_threshold=0.3)
    policy = HierarchicalPolicy(rule, [make_heuristic(s) for s in SUBS[:2]], k=5)
    via_policy = run_episode(policy, ClusterSchedulingEnv(BIG), SEED)
    assert len({d for _, d in policy.decisions}) == 2  # it did switch
    env = HierarchicalClusterEnv({"env": BIG, "k": 5, "sub_agents": SUBS[:2],
                                  "sub_agent_factory": make_sub_agent})
    obs, _ = env.reset(seed=SEED)
    total, done, picks = 0.0, False, []
    while not done:
        picks.append(rule.choose(obs[SUPERVISOR]))
        obs, rewards, _, trunc, _ = env.step({SUPERVISOR: picks[-1]})
        total += rewards[SUPERVISOR]
        done = trunc["__all__"]
    assert picks == [d for _, d in policy.decisions]
    assert total == pytest.approx(via_policy.episode_reward, rel=1e-12)


def test_rule_supervisor_thresholds() -> None:
    macro = np.zeros(4 * 3 + len(MACRO_TAIL), dtype=np.float32)
    rule = RuleSupervisor(power=0, sla=1, load_threshold=0.5)
    assert rule.choose(macro) == 0
    macro[:3] = 0.6
    assert rule.choose(macro) == 1
    macro[:3] = 0.1
    macro[12 + MACRO_TAIL.index("violation_rate")] = 0.5
    assert rule.choose(macro) == 1


def test_bad_sub_agents_are_one_clear_error() -> None:
    with pytest.raises(ValueError, match="at least one sub-agent"):
        HierarchicalClusterEnv({"env": ENV, "sub_agents": []})
    with pytest.raises(ValueError, match="k must be >= 1"):
        HierarchicalClusterEnv({"env": ENV, "k": 0, "sub_agents": ["a"]})
    with pytest.raises(ValueError, match="'nope' is neither a heuristic"):
        HierarchicalClusterEnv({"env": ENV, "sub_agents": ["nope"],
                                "sub_agent_factory": make_sub_agent})


@pytest.mark.parametrize("signals", [{}, {"solar_kwp": 2.0, "solar_source": "synthetic"}])
def test_with_signals_the_supervisor_sees_the_whole_macro_row(signals: dict) -> None:
    """The supervisor's space follows the cluster env's macro row, signal columns included;
    its info sums the signal terms of its ticks like the other cluster terms."""
    cfg = {**ENV, "signals": signals, "signal_cost_weight": 1.0}
    base = ClusterSchedulingEnv(cfg)
    env = HierarchicalClusterEnv({"env": cfg, "k": 4, "sub_agents": ["power_aware", "ext"],
                                  "sub_agent_factory": make_sub_agent, "external": [1]})
    space = env.observation_spaces[SUPERVISOR]
    assert space == base.observation_space["macro"]
    assert space.shape[0] == 4 * env.base.sim.fleet.n_tiers + len(MACRO_TAIL) + base.n_signal
    assert base.n_signal > 0
    obs, _ = env.reset(seed=SEED)
    assert space.contains(obs[SUPERVISOR])
    assert env.observation_spaces["sub_1"].contains(env.cluster_obs)
    alone = run_episode(make_heuristic("power_aware"), base, SEED)
    usd = kwh = 0.0
    done = False
    while not done:
        obs, _, _, trunc, info = env.step({SUPERVISOR: 0})
        assert space.contains(obs[SUPERVISOR])
        usd += info[SUPERVISOR]["energy_usd"]
        kwh += info[SUPERVISOR]["energy_kwh"]
        assert set(info[SUPERVISOR]) >= {"energy_usd", "carbon_kg", "r_signal"}
        done = trunc["__all__"]
    assert kwh == pytest.approx(alone.energy_kwh, rel=1e-12)
    assert usd != 0.0
    # the external sub-agent gets the full cluster observation (macro with the signals)
    obs, _ = env.reset(seed=SEED)
    obs, *_ = env.step({SUPERVISOR: 1})
    assert env.observation_spaces["sub_1"].contains(obs["sub_1"])
    obs, *_ = env.step({"sub_1": env.base.wait_action})
    assert env.observation_spaces["sub_1"].contains(obs["sub_1"])


@pytest.mark.parametrize("spec", ["x" * 300, "a/" + "b" * 256 + "/c", "bad\0name"])
def test_a_sub_agent_path_the_os_refuses_is_one_clear_error(spec: str) -> None:
    """A spec the OS cannot even stat (a name over 255 bytes, a NUL byte) is no checkpoint:
    the same ValueError as any unknown spec, never an OSError."""
    from cloudrl.algorithms.hierarchical.hparams import check_spec, checkpoint_meta

    with pytest.raises(ValueError, match="is neither a heuristic"):
        check_spec(spec)
    assert checkpoint_meta(spec) is None
