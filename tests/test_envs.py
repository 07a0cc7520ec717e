"""The gymnasium envs: API conformance, masks, invalid actions, branching semantics, reward.

Scenarios that need exact numbers replace the workload with a hand-written
job table (``FixedWorkload``) through ``envs.cluster_env.make_workload``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import FixedWorkload

import envs
from envs import cluster_env
from envs.cluster_env import HOLD, SLEEP_ONE, WAKE_ONE, ClusterBranchingEnv, ClusterSchedulingEnv
from envs.registration import BRANCHING_ID, FLAT_ID, register_rllib_envs
from envs.sim import ACTIVE, ASLEEP, WAKING
from envs.workloads import JobTable

SMALL = {"n_servers": 4, "sim": {"episode_length": 20, "queue_window": 3}}
ENV_CLASSES = [ClusterSchedulingEnv, ClusterBranchingEnv]
ONE_TIER = [{"name": "unit", "cpu_cores": 10, "mem_gib": 10, "p_idle_w": 100, "p_max_w": 200}]
TWO_TIERS = [
    {"name": "small", "cpu_cores": 8, "mem_gib": 16, "p_idle_w": 50, "p_max_w": 120},
    {"name": "big", "cpu_cores": 16, "mem_gib": 32, "p_idle_w": 90, "p_max_w": 250},
]


# --------------------------------------------------------------------------- helpers


def jobs(*rows: tuple[int, float, int, int]) -> JobTable:
    """Rows of (arrival, cpu, duration, deadline allowance); memory = cpu / 2."""
    a, c, d, dl = (np.array(col) for col in zip(*rows, strict=True))
    return JobTable(a.astype(np.int64), c.astype(float), c.astype(float) / 2,
                    d.astype(np.int64), dl.astype(np.int64))


def scenario(monkeypatch, env_cls, table: JobTable, n_servers: int, tiers=ONE_TIER,
             **sim):
    monkeypatch.setattr(cluster_env, "make_workload", lambda cfg, tick: FixedWorkload(table))
    sim_cfg = {"episode_length": 30, "warm_start": False, "wake_delay": 0, **sim}
    sim_cfg["fleet"] = {"n_servers": n_servers, "tiers": tiers, **sim_cfg.get("fleet", {})}
    env = env_cls({"sim": sim_cfg})
    env.reset(seed=0)
    return env


def branch_action(env: ClusterBranchingEnv, slots=(), tiers=(), level: int = 0) -> np.ndarray:
    """Slots default to defer (N), tiers to hold."""
    k, n = env.queue_window, env.n_servers
    a = np.array([n] * k + [HOLD] * env.n_tiers + [level], dtype=np.int64)
    a[: len(slots)] = slots
    a[k: k + len(tiers)] = tiers
    return a


def wait(env) -> int | np.ndarray:
    return env.wait_action if isinstance(env, ClusterSchedulingEnv) else branch_action(env)


def random_masked(env, rng: np.random.Generator):
    if isinstance(env, ClusterSchedulingEnv):
        return int(rng.choice(np.flatnonzero(env.action_mask)))
    return np.array([int(rng.choice(np.flatnonzero(m))) for m in env.branch_masks()])


def sim_state(env) -> tuple:
    s = env.sim
    return (s.t, s.power_state.tobytes(), s.used_cpu.tobytes(), s.used_mem.tobytes(),
            s.n_running.tobytes(), tuple(s.queue), s.stats)


def obs_bytes(obs) -> dict:
    return {k: v.tobytes() for k, v in obs.items()}


def expected_flat_mask(env: ClusterSchedulingEnv) -> np.ndarray:
    """The documented flat mask, recomputed from the simulator's arrays."""
    sim, k, n = env.sim, env.queue_window, env.n_servers
    place = np.zeros((k, n), dtype=bool)
    for slot, j in enumerate(sim.queue[:k]):
        place[slot] = ((sim.job_cpu[j] <= sim.fleet.cpu_cap - sim.used_cpu + 1e-9)
                       & (sim.job_mem[j] <= sim.fleet.mem_cap - sim.used_mem + 1e-9)
                       & (sim.power_state == ACTIVE))
    toggle = ((sim.power_state == ACTIVE) & (sim.n_running == 0)) | (sim.power_state == ASLEEP)
    return np.concatenate([place.ravel(), toggle, [True]])


# --------------------------------------------------------------------------- API conformance
@pytest.mark.parametrize("env_cls", ENV_CLASSES)
def test_gymnasium_check_env_passes(env_cls):
    env = env_cls(SMALL)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    # the only acceptable complaints are about the unbounded feature boxes
    other = [str(w.message) for w in caught if "infinity" not in str(w.message)]
    assert other == []


@pytest.mark.parametrize(("env_id", "env_cls"), [(FLAT_ID, ClusterSchedulingEnv),
                                                 (BRANCHING_ID, ClusterBranchingEnv)])
def test_gym_make_with_registered_ids(env_id, env_cls):
    assert env_id in gym.registry and envs.FLAT_ID == FLAT_ID
    env = gym.make(env_id, config={"n_servers": 5, "sim": {"queue_window": 2,
                                                           "episode_length": 3}})
    assert isinstance(env.unwrapped, env_cls)
    k, n, t = 2, 5, 3  # three default tiers
    if env_cls is ClusterSchedulingEnv:
        assert env.action_space == gym.spaces.Discrete(k * n + n + 1)
    else:
        assert list(env.action_space.nvec) == [n + 1] * k + [3] * t + [4]
    obs, info = env.reset(seed=3)
    assert info["episode_seed"] == 3
    assert obs["servers"].shape[0] == n and obs["jobs"].shape[0] == k
    assert obs["action_mask"].shape == (int(np.sum(
        env.action_space.nvec if env_cls is ClusterBranchingEnv else env.action_space.n)),)
    truncated = [env.step(wait(env.unwrapped))[3] for _ in range(3)]
    assert truncated == [False, False, True]


@pytest.mark.parametrize("env_cls", ENV_CLASSES)
@pytest.mark.parametrize("workload", ["poisson", "google_v2_like"])
def test_observations_stay_in_space_and_carry_the_mask(env_cls, workload):
    env = env_cls({"workload": workload, "sim": {"episode_length": 150, "wake_delay": 2,
                                                 "fleet": {"initially_asleep": 0.3}}})
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=11)
    steps = 0
    truncated = False
    while not truncated:
        assert env.observation_space.contains(obs), {k: v for k, v in obs.items()
                                                     if not np.all(np.isfinite(v))}
        np.testing.assert_array_equal(obs["action_mask"], env.action_mask.astype(np.float32))
        obs, reward, terminated, truncated, info = env.step(random_masked(env, rng))
        assert np.isfinite(reward) and not terminated and not info["invalid_action"]
        steps += 1
    assert steps == 150
    assert env.sim.stats.finished > 0 and len(env.sim.stats.waits) > 0


@st.composite
def small_fleets(draw) -> dict:
    n_tiers = draw(st.integers(1, 3))
    tiers = []
    for i in range(n_tiers):
        p_idle = draw(st.floats(0.0, 200.0))
        tiers.append({"name": f"t{i}", "cpu_cores": draw(st.floats(1.0, 64.0)),
                      "mem_gib": draw(st.floats(1.0, 256.0)), "p_idle_w": p_idle,
                      "p_max_w": p_idle + draw(st.floats(1.0, 300.0)),
                      "share": draw(st.floats(0.2, 3.0))})
    return {"n_servers": draw(st.integers(1, 12)), "tiers": tiers,
            "initially_asleep": draw(st.floats(0.0, 1.0))}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet=small_fleets(), workload=st.sampled_from(["poisson", "google_v2_like"]),
       env_cls=st.sampled_from(ENV_CLASSES), seed=st.integers(0, 1000))
def test_observations_in_space_for_random_fleets(fleet, workload, env_cls, seed):
    env = env_cls({"workload": workload,
                   "sim": {"fleet": fleet, "episode_length": 15, "wake_delay": 1}})
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    for _ in range(15):
        assert env.observation_space.contains(obs)
        obs = env.step(random_masked(env, rng))[0]
    assert env.observation_space.contains(obs)


@pytest.mark.parametrize("env_cls", ENV_CLASSES)
def test_observation_is_finite_when_a_tier_has_no_server(env_cls):
    env = env_cls({"n_servers": 2})  # three default tiers, one of them empty
    assert np.count_nonzero(np.bincount(env.sim.fleet.tier, minlength=3) == 0) == 1
    obs, _ = env.reset(seed=0)
    assert np.all(np.isfinite(obs["macro"]))
    assert env.observation_space.contains(obs)


# --------------------------------------------------------------------------- masks
@pytest.mark.parametrize("workload", ["poisson", "google_v2_like"])
def test_flat_mask_is_fit_and_active_for_places_and_toggleable_for_toggles(workload):
    env = ClusterSchedulingEnv({"n_servers": 7, "workload": workload,
                                "sim": {"episode_length": 120, "queue_window": 5,
                                        "wake_delay": 2, "fleet": {"initially_asleep": 0.4}}})
    rng = np.random.default_rng(1)
    env.reset(seed=5)
    k, n = 5, 7
    seen = np.zeros(3, dtype=int)  # feasible places, infeasible places in filled slots, toggles
    for _ in range(120):
        mask = env.action_mask
        np.testing.assert_array_equal(mask, expected_flat_mask(env))
        assert mask.shape == (k * n + n + 1,) and mask[-1]
        filled = min(len(env.sim.queue), k)
        assert not mask[filled * n: k * n].any(), "empty slots must be masked"
        np.testing.assert_array_equal(env.sim.placement_mask().ravel(), mask[: k * n])
        np.testing.assert_array_equal(env.sim.toggle_mask(), mask[k * n: k * n + n])
        seen += [mask[: filled * n].sum(), (~mask[: filled * n]).sum(), mask[k * n:-1].sum()]
        env.step(random_masked(env, rng))
    assert np.all(seen > 0), seen


def test_branching_masks_per_slot_per_tier_and_priority():
    env = ClusterBranchingEnv({"n_servers": 9, "sim": {"episode_length": 80, "queue_window": 4,
                                                       "wake_delay": 3,
                                                       "fleet": {"initially_asleep": 0.5}}})
    rng = np.random.default_rng(2)
    env.reset(seed=8)
    sim, k, n = env.sim, 4, 9
    assert env.branch_sizes == [n + 1] * k + [3, 3, 3] + [4]
    for _ in range(80):
        masks = env.branch_masks()
        assert len(masks) == k + 3 + 1
        place = sim.placement_mask()
        for slot in range(k):
            np.testing.assert_array_equal(masks[slot][:n], place[slot])
            assert masks[slot][n], "defer is always allowed"
        for tier in range(3):
            in_tier = sim.fleet.tier == tier
            idle_active = in_tier & (sim.power_state == ACTIVE) & (sim.n_running == 0)
            asleep = in_tier & (sim.power_state == ASLEEP)
            np.testing.assert_array_equal(masks[k + tier],
                                          [idle_active.any(), True, asleep.any()])
        assert masks[-1].all()
        env.step(random_masked(env, rng))


# --------------------------------------------------------------------------- invalid actions
def _flat_invalid(env: ClusterSchedulingEnv, kind: str) -> int | None:
    sim, k, n = env.sim, env.queue_window, env.n_servers
    mask, filled = env.action_mask, min(len(sim.queue), env.queue_window)
    if kind == "place_no_fit":
        hits = [a for a in range(filled * n) if not mask[a] and sim.power_state[a % n] == ACTIVE]
    elif kind == "place_on_asleep":
        hits = [a for a in range(filled * n) if sim.power_state[a % n] == ASLEEP]
    elif kind == "place_empty_slot":
        hits = list(range(filled * n, k * n))
    elif kind == "toggle_busy":
        hits = [k * n + s for s in np.flatnonzero(sim.n_running > 0)]
    else:  # toggle_waking
        hits = [k * n + s for s in np.flatnonzero(sim.power_state == WAKING)]
    return hits[0] if hits else None


def _branch_invalid(env: ClusterBranchingEnv, kind: str) -> np.ndarray | None:
    sim, k, n = env.sim, env.queue_window, env.n_servers
    filled = min(len(sim.queue), k)
    place = sim.placement_mask()
    if kind == "place_no_fit":
        hits = np.argwhere(~place[:filled])
        if not len(hits):
            return None
        slot, server = (int(x) for x in hits[0])
        return branch_action(env, slots=[n] * slot + [server])
    if kind == "place_empty_slot":
        return branch_action(env, slots=[n] * filled + [0]) if filled < k else None
    state, idle = sim.power_state, sim.n_running == 0
    for tier in range(env.n_tiers):
        in_tier = sim.fleet.tier == tier
        if kind == "sleep_none_idle" and not (in_tier & (state == ACTIVE) & idle).any():
            return branch_action(env, tiers=[HOLD] * tier + [SLEEP_ONE])
        if kind == "wake_none_asleep" and not (in_tier & (state == ASLEEP)).any():
            return branch_action(env, tiers=[HOLD] * tier + [WAKE_ONE])
    return None


@pytest.mark.parametrize(("env_cls", "kind"), [
    (ClusterSchedulingEnv, "place_no_fit"), (ClusterSchedulingEnv, "place_on_asleep"),
    (ClusterSchedulingEnv, "place_empty_slot"), (ClusterSchedulingEnv, "toggle_busy"),
    (ClusterSchedulingEnv, "toggle_waking"),
    (ClusterBranchingEnv, "place_no_fit"), (ClusterBranchingEnv, "place_empty_slot"),
    (ClusterBranchingEnv, "sleep_none_idle"), (ClusterBranchingEnv, "wake_none_asleep"),
])
def test_masked_action_changes_nothing_and_costs_exactly_the_penalty(env_cls, kind):
    config = {"n_servers": 6, "sim": {
        "episode_length": 60, "queue_window": 6, "wake_delay": 4, "invalid_action_penalty": 2.5,
        "fleet": {"initially_asleep": 0.5}}}
    invalid_env, wait_env = env_cls(config), env_cls(config)
    obs_a, _ = invalid_env.reset(seed=4)
    obs_b, _ = wait_env.reset(seed=4)
    finder = _flat_invalid if env_cls is ClusterSchedulingEnv else _branch_invalid
    for t in range(60):
        if kind == "toggle_waking" and t == 0:  # wake a server in both copies first
            asleep = int(np.flatnonzero(invalid_env.sim.power_state == ASLEEP)[0])
            action = invalid_env.queue_window * invalid_env.n_servers + asleep
            for env in (invalid_env, wait_env):
                assert not env.step(action)[4]["invalid_action"]
            continue
        bad = finder(invalid_env, kind)
        if bad is not None:
            break
        obs_a, obs_b = invalid_env.step(wait(invalid_env))[0], wait_env.step(wait(wait_env))[0]
    else:
        pytest.fail(f"no {kind} action came up")
    mask = invalid_env.action_mask
    if env_cls is ClusterSchedulingEnv:
        assert not mask[bad]
    else:
        assert not all(m[v] for m, v in zip(invalid_env.branch_masks(), bad, strict=True))
    assert obs_bytes(obs_a) == obs_bytes(obs_b) and sim_state(invalid_env) == sim_state(wait_env)

    obs_a, r_a, term_a, trunc_a, info_a = invalid_env.step(bad)
    obs_b, r_b, term_b, trunc_b, info_b = wait_env.step(wait(wait_env))
    assert sim_state(invalid_env) == sim_state(wait_env)
    assert obs_bytes(obs_a) == obs_bytes(obs_b)
    assert info_a["invalid_action"] is True and info_b["invalid_action"] is False
    assert info_a["r_invalid"] == -2.5 and info_b["r_invalid"] == 0.0
    assert r_b - r_a == pytest.approx(2.5, abs=1e-12)
    same = {key: v for key, v in info_a.items() if key not in ("invalid_action", "r_invalid")}
    assert same == {key: info_b[key] for key in same}
    assert (term_a, trunc_a) == (term_b, trunc_b)


@pytest.mark.parametrize("bad", [-1, 4 * 3 + 4 + 1, 10_000, 2.5, np.float32(1.0), "3", None,
                                 [1, 2]])
def test_flat_out_of_space_action_raises_naming_the_value(bad):
    env = ClusterSchedulingEnv(SMALL)
    env.reset(seed=0)
    before = sim_state(env)
    with pytest.raises(ValueError, match=re.escape(str(bad).strip("[]"))):
        env.step(bad)
    assert sim_state(env) == before
    assert not env.step(env.wait_action)[4]["invalid_action"]  # the env still works


def test_flat_accepts_integer_like_actions():
    env = ClusterSchedulingEnv(SMALL)
    env.reset(seed=0)
    for a in (env.wait_action, np.int64(env.wait_action), np.array(env.wait_action)):
        assert env.step(a)[4]["invalid_action"] is False
    assert env.sim.t == 3


def test_branching_out_of_space_actions_raise_naming_the_value():
    env = ClusterBranchingEnv(SMALL)  # K=3, N=4, T=3, L=4 -> 3 + 3 + 1 = 7 branches
    env.reset(seed=0)
    before = sim_state(env)
    ok = branch_action(env)
    cases = [
        (ok[:-1], r"7 integers.*\(6,\)"),
        (np.concatenate([ok, [0]]), r"\(8,\)"),
        (ok.reshape(1, -1), r"\(1, 7\)"),
        (ok.astype(float), "float64"),
        (5, r"\(\)"),
    ]
    for branch, value, size in [(0, 5, 5), (2, -1, 5), (3, 3, 3), (5, 7, 3), (6, 4, 4)]:
        a = ok.copy()
        a[branch] = value
        cases.append((a, rf"branch {branch} = {value} outside \[0, {size}\)"))
    for action, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            env.step(action)
    assert sim_state(env) == before


# --------------------------------------------------------------------------- semantics
def test_flat_place_and_toggle_actions_do_what_they_say(monkeypatch):
    table = jobs((0, 0.5, 10, 20), (0, 0.25, 10, 20))
    env = scenario(monkeypatch, ClusterSchedulingEnv, table, n_servers=3, queue_window=2,
                   wake_delay=2)
    sim, k, n = env.sim, 2, 3
    assert sim.queue == [0, 1]
    info = env.step(1 * n + 2)[4]  # slot 1 (job 1) on server 2
    assert not info["invalid_action"]
    assert sim.queue == [0] and sim.n_running.tolist() == [0, 0, 1]
    assert sim.used_cpu[2] == pytest.approx(0.25)
    info = env.step(k * n + 0)[4]  # sleep server 0
    assert info["toggles"] == 1 and sim.power_state.tolist() == [ASLEEP, ACTIVE, ACTIVE]
    assert env.step(0 * n + 0)[4]["invalid_action"]  # job 0 on the sleeping server 0
    env.step(k * n + 0)  # wake it: two ticks
    assert sim.power_state[0] == WAKING and sim.t == 4  # woken at tick 3
    env.step(env.wait_action)
    assert sim.power_state[0] == ACTIVE and sim.t == 5  # 3 + wake_delay
    env.step(0)
    assert sim.queue == [] and sim.n_running.tolist() == [1, 0, 1]


def test_branching_places_several_slots_and_counts_conflicts(monkeypatch):
    table = jobs((0, 0.6, 10, 20), (0, 0.6, 10, 20), (0, 0.3, 10, 20), (0, 0.2, 10, 20))
    env = scenario(monkeypatch, ClusterBranchingEnv, table, n_servers=3, queue_window=3)
    sim = env.sim
    assert sim.queue == [0, 1, 2, 3] and sim.window() == [0, 1, 2]
    # job 0 and job 1 both fit server 0 alone, not together: job 1 is deferred
    obs, reward, _, _, info = env.step(branch_action(env, slots=[0, 0, 1]))
    assert not info["invalid_action"] and info["placement_conflicts"] == 1
    assert sim.queue == [1, 3]
    np.testing.assert_allclose(sim.used_cpu, [0.6, 0.3, 0.0])
    assert obs["jobs"][:2, 1].tolist() == pytest.approx([0.6, 0.2])  # cpu of slots 0, 1
    info = env.step(branch_action(env, slots=[2, 1]))[4]
    assert info["placement_conflicts"] == 0 and sim.queue == []
    np.testing.assert_allclose(sim.used_cpu, [0.6, 0.5, 0.6])
    assert sim.n_running.tolist() == [1, 2, 1]
    assert sim.stats.waits == [0, 0, 1, 1]
    info = env.step(branch_action(env))[4]  # all defer, all hold
    assert info["placement_conflicts"] == 0 and not info["invalid_action"]


def test_branching_sleep_one_and_wake_one_act_on_one_server_of_the_tier(monkeypatch):
    table = jobs((5, 0.1, 3, 10))
    env = scenario(monkeypatch, ClusterBranchingEnv, table, n_servers=6, tiers=TWO_TIERS,
                   wake_delay=2, toggle_penalty=0.75)
    sim = env.sim
    tier = sim.fleet.tier.copy()
    assert np.bincount(tier).tolist() == [3, 3]
    masks = env.branch_masks()  # 8 slot branches, then the two tier branches
    assert masks[8].tolist() == [True, True, False] == masks[9].tolist()  # nothing asleep

    def states(t):
        return sim.power_state[tier == t].tolist()

    _, reward, _, _, info = env.step(branch_action(env, tiers=[SLEEP_ONE, SLEEP_ONE]))
    assert sorted(states(0)) == sorted(states(1)) == [ACTIVE, ACTIVE, ASLEEP]
    assert info["toggles"] == 2 and info["r_toggle"] == pytest.approx(-1.5)
    assert info["placement_conflicts"] == 0
    info = env.step(branch_action(env, tiers=[WAKE_ONE, SLEEP_ONE]))[4]
    assert sorted(states(0)) == [ACTIVE, ACTIVE, WAKING]
    assert sorted(states(1)) == [ACTIVE, ASLEEP, ASLEEP]
    assert info["toggles"] == 2
    # the waking server of tier 0 is neither asleep (to wake) nor idle-active (to sleep)
    assert env.branch_masks()[8].tolist() == [True, True, False]
    env.step(branch_action(env))
    assert states(0) == [ACTIVE] * 3 and sim.t == 3  # woken at tick 1, wake_delay 2


def test_branching_sleep_of_a_server_taken_by_a_placement_is_a_conflict(monkeypatch):
    env = scenario(monkeypatch, ClusterBranchingEnv, jobs((0, 0.3, 5, 10)), n_servers=1,
                   queue_window=1)
    assert env.branch_masks()[1].tolist() == [True, True, False]  # the only server is idle
    info = env.step(branch_action(env, slots=[0], tiers=[SLEEP_ONE]))[4]
    assert not info["invalid_action"]
    assert info["placement_conflicts"] == 1 and info["toggles"] == 0
    assert env.sim.power_state[0] == ACTIVE and env.sim.n_running[0] == 1


def test_priority_level_reorders_the_queue(monkeypatch):
    # (arrival, cpu, duration, allowance) -> latest starts 55, 8, 27, 5 and 7
    table = jobs((0, 0.1, 5, 60), (1, 0.2, 5, 12), (2, 0.3, 5, 30), (3, 0.4, 5, 7),
                 (5, 0.5, 1, 3))
    env = scenario(monkeypatch, ClusterBranchingEnv, table, n_servers=2, queue_window=4,
                   priority_levels=3, fleet={"initially_asleep": 1.0})
    sim = env.sim
    for _ in range(3):
        env.step(branch_action(env, level=0))
    assert sim.queue == [0, 1, 2, 3] and sim.t == 3
    obs = env.step(branch_action(env, level=2))[0]  # least slack first
    assert sim.queue == [3, 1, 2, 0]
    assert obs["jobs"][:, 1].tolist() == pytest.approx([0.4, 0.2, 0.3, 0.1])
    assert np.all(np.diff(obs["jobs"][:, 5]) > 0), "slack column must ascend"
    env.step(branch_action(env, level=2))  # t = 5: the new arrival goes where its slack says
    assert sim.queue == [3, 4, 1, 2, 0]
    env.step(branch_action(env, level=0))  # FIFO again
    assert sim.queue == [0, 1, 2, 3, 4]
    env.step(branch_action(env, level=1))  # halfway: key = (arrival + latest start) / 2
    assert sim.queue == [3, 1, 4, 2, 0]
    assert sim.stats.dropped == 0 and sim.running_jobs == 0


def test_back_to_fifo_restores_arrival_order_within_a_tick(monkeypatch):
    table = jobs((0, 0.1, 5, 50), (0, 0.2, 5, 10), (0, 0.3, 5, 30))
    env = scenario(monkeypatch, ClusterBranchingEnv, table, n_servers=1, queue_window=3,
                   priority_levels=2, fleet={"initially_asleep": 1.0})
    env.step(branch_action(env, level=1))
    assert env.sim.queue == [1, 2, 0]
    env.step(branch_action(env, level=0))
    assert env.sim.queue == [0, 1, 2]


# --------------------------------------------------------------------------- reward, episode
@pytest.mark.parametrize("env_cls", ENV_CLASSES)
def test_reward_is_the_documented_sum_and_info_carries_each_term(env_cls):
    config = {"n_servers": 5, "sim": {
        "episode_length": 80, "alpha": 3.0, "beta": 7.0, "toggle_penalty": 0.5,
        "invalid_action_penalty": 2.0, "queue_capacity": 10, "queue_window": 3,
        "wake_delay": 1, "tick_seconds": 30.0}, "workload": {"kind": "poisson", "rate": 2.0}}
    env = env_cls(config)
    rng = np.random.default_rng(4)
    env.reset(seed=2)
    sim = env.sim
    peak_w = float(sim.fleet.p_max.sum())
    seen = {"invalid": 0, "toggles": 0, "violations": 0}
    for _ in range(80):
        st_before = (sim.stats.toggles, sim.stats.violations, sim.stats.energy_j)
        action = env.action_space.sample() if rng.random() < 0.3 else random_masked(env, rng)
        _, reward, _, _, info = env.step(action)
        penalty = 2.0 if info["invalid_action"] else 0.0
        expected = -(3.0 * info["energy_norm"] + 7.0 * info["violations"]
                     + 0.5 * info["toggles"]) - penalty
        assert reward == pytest.approx(expected, rel=1e-12, abs=1e-12)
        assert info["r_energy"] == pytest.approx(-3.0 * info["energy_norm"])
        assert info["r_sla"] == -7.0 * info["violations"]
        assert info["r_toggle"] == -0.5 * info["toggles"]
        assert info["r_invalid"] == -penalty
        assert reward == pytest.approx(info["r_energy"] + info["r_sla"] + info["r_toggle"]
                                       + info["r_invalid"], rel=1e-12, abs=1e-12)
        assert info["violations"] == info["late"] + info["dropped"]
        assert info["energy_kwh"] * 3.6e6 == pytest.approx(info["energy_norm"] * peak_w * 30.0)
        assert info["toggles"] == sim.stats.toggles - st_before[0]
        assert info["violations"] == sim.stats.violations - st_before[1]
        assert info["energy_kwh"] * 3.6e6 == pytest.approx(sim.stats.energy_j - st_before[2])
        seen["invalid"] += info["invalid_action"]
        seen["toggles"] += info["toggles"]
        seen["violations"] += info["violations"]
    assert all(v > 0 for v in seen.values()), seen


@pytest.mark.parametrize("env_cls", ENV_CLASSES)
def test_truncation_exactly_at_episode_length(env_cls):
    env = env_cls({"n_servers": 3, "sim": {"episode_length": 7}})
    for seed in (0, 1):
        env.reset(seed=seed)
        flags = [env.step(wait(env))[2:4] for _ in range(7)]
        assert flags == [(False, False)] * 6 + [(False, True)]
        assert env.sim.t == 7 and env.sim.done


@pytest.mark.parametrize("env_cls", ENV_CLASSES)
def test_reset_without_seed_draws_from_the_seed_pool(env_cls):
    pool = (3, 11, 42)
    env = env_cls({"n_servers": 3, "seed_pool": list(pool), "sim": {"episode_length": 5}})
    env.reset(seed=0)
    drawn = [env.reset()[1]["episode_seed"] for _ in range(40)]
    assert set(drawn) <= set(pool) and len(set(drawn)) > 1
    twin = env_cls({"n_servers": 3, "seed_pool": list(pool), "sim": {"episode_length": 5}})
    twin.reset(seed=0)
    assert [twin.reset()[1]["episode_seed"] for _ in range(40)] == drawn
    # the pool episode is the seed's episode; an explicit seed overrides the pool
    obs, info = env.reset()
    assert obs_bytes(twin.reset(seed=info["episode_seed"])[0]) == obs_bytes(obs)
    assert env.reset(seed=5)[1]["episode_seed"] == 5
    no_pool = env_cls({"n_servers": 3})
    seeds = {no_pool.reset()[1]["episode_seed"] for _ in range(5)}
    assert all(0 <= s < 2**31 - 1 for s in seeds) and len(seeds) > 1


def test_rllib_registration_creates_both_envs_from_a_config_dict():
    from ray.rllib.env.env_context import EnvContext
    from ray.tune.registry import ENV_CREATOR, _global_registry

    register_rllib_envs()
    for env_id, env_cls in ((FLAT_ID, ClusterSchedulingEnv), (BRANCHING_ID, ClusterBranchingEnv)):
        creator = _global_registry.get(ENV_CREATOR, env_id)
        env = creator({"n_servers": 3, "workload": "google_v2_like"})
        assert isinstance(env, env_cls) and env.n_servers == 3
        assert env.config.workload.kind == "google_v2_like"
        env = creator(EnvContext({"n_servers": 5, "sim": {"queue_window": 2}}, worker_index=1))
        assert isinstance(env, env_cls) and (env.n_servers, env.queue_window) == (5, 2)


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter; its stdout (stderr in the failure message)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_import_envs_alone_lets_stock_rllib_build_and_sample_the_env():
    out = run_python("""
        import sys
        import envs
        assert "ray.tune" not in sys.modules  # registration waits for RLlib's registry
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec
        from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
        from models.masked_ppo import MaskedPPOTorchRLModule

        config = (
            PPOConfig()
            .environment("cloudrl/ClusterScheduling-v0", env_config={
                "n_servers": 3, "sim": {"episode_length": 5}, "reward_scale": 0.5})
            .env_runners(num_env_runners=0)
            .rl_module(rl_module_spec=RLModuleSpec(
                module_class=MaskedPPOTorchRLModule,
                model_config={"encoder": {"hidden": 8}, "head_hiddens": [8]})))
        runner = SingleAgentEnvRunner(config=config)
        episodes = runner.sample(num_timesteps=12, random_actions=True)
        env = runner.env.unwrapped.envs[0]
        print(type(env.unwrapped).__name__, env.unwrapped.n_servers, env.get_wrapper_attr("scale"),
              sum(len(e) for e in episodes))
        print(any(m == "cloudrl" or m.startswith("cloudrl.") for m in sys.modules))
    """)
    assert out.split() == ["ClusterSchedulingEnv", "3", "0.5", "12", "False"]


def test_import_cloudrl_registers_the_rllib_env_names():
    out = run_python("""
        import sys
        import cloudrl
        assert "ray" not in sys.modules
        from ray.tune.registry import ENV_CREATOR, _global_registry
        creator = _global_registry.get(ENV_CREATOR, "cloudrl/ClusterBranching-v0")
        print(type(creator({"n_servers": 2})).__name__,
              _global_registry.contains(ENV_CREATOR, "cloudrl/ClusterScheduling-v0"))
    """)
    assert out.split() == ["ClusterBranchingEnv", "True"]


def test_rllib_names_are_registered_at_once_when_the_registry_is_already_loaded():
    from ray.tune.registry import ENV_CREATOR, _global_registry

    from envs.registration import register_rllib_envs_when_loaded

    for env_id in (FLAT_ID, BRANCHING_ID):
        _global_registry.unregister(ENV_CREATOR, env_id)
        assert not _global_registry.contains(ENV_CREATOR, env_id)
    register_rllib_envs_when_loaded()
    assert all(_global_registry.contains(ENV_CREATOR, i) for i in (FLAT_ID, BRANCHING_ID))


def test_env_config_rejects_bad_values_at_construction():
    with pytest.raises(ValueError, match="queue_windw"):
        ClusterSchedulingEnv({"sim": {"queue_windw": 3}})
    with pytest.raises(ValueError, match="n_servers"):
        ClusterBranchingEnv({"n_servers": 0})
