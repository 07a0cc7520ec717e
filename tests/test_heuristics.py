"""Heuristic policies: feasibility on both interfaces, each rule's choice, power behaviour.

* Full short episodes of every heuristic x interface x workload (N = 15 and 50,
  train seeds): never an invalid action, every chosen (sub-)action allowed by
  the mask, no branching placement conflicts; RR/SJF/FFD never toggle.
* Hand-built observations: SJF takes the shortest placeable job, FFD the
  largest, both first fit; RR rotates; branching fills every slot without
  overfilling a server; a masked choice falls back to wait / defer.
* power_aware sleeps an idle server when load is low, wakes the most efficient
  fitting server when a job fits nowhere, does not re-wake what it just slept
  (hysteresis), never sleeps a tier whose only idle server just got a job; in
  driven episodes it wakes a mostly-asleep fleet and sleeps an idle one.
* power_aware uses less energy than FFD on the same train seeds at N = 50.
"""

from __future__ import annotations

import numpy as np
import pytest

from cloudrl.heuristics import (
    HEURISTICS,
    FirstFitDecreasing,
    PowerAwareConfig,
    PowerAwareConsolidation,
    RoundRobin,
    ShortestJobFirst,
    make_heuristic,
)
from cloudrl.policy import branch_layout
from envs.cluster_env import HOLD, SLEEP_ONE, WAKE_ONE, ClusterBranchingEnv, ClusterSchedulingEnv
from envs.observation import JOB_COLS, MACRO_TAIL, SERVER_COLS, J, S, macro_size

NAMES = ("round_robin", "sjf", "ffd", "power_aware")
WORKLOADS = ("poisson", "google_v2_like")
LEVELS = 4


def make_env(interface: str, n_servers: int, workload: str, length: int, **sim):
    env_cls = ClusterSchedulingEnv if interface == "flat" else ClusterBranchingEnv
    return env_cls({"n_servers": n_servers, "workload": workload,
                    "sim": {"episode_length": length, **sim}})


def assert_allowed(obs: dict, action, interface: str) -> None:
    mask = obs["action_mask"] > 0.5
    if interface == "flat":
        assert mask[int(action)], f"flat action {action} is masked"
        return
    k, n, t, _ = branch_layout(obs)
    offsets = np.concatenate([np.arange(k) * (n + 1), k * (n + 1) + np.arange(t) * 3,
                              [k * (n + 1) + 3 * t]])
    assert mask[offsets + np.asarray(action)].all(), f"branching action {action} is masked"


def run_episode(policy, env, seed: int) -> dict:
    obs, _ = env.reset(seed=seed)
    policy.reset()
    total, done = 0.0, False
    while not done:
        action = policy.act(obs)
        assert_allowed(obs, action, policy.interface)
        if policy.interface == "branching" and not policy.toggles_power:
            k, _, t, _ = branch_layout(obs)
            assert (np.asarray(action)[k:k + t] == HOLD).all()
        obs, reward, terminated, truncated, info = env.step(action)
        assert not info["invalid_action"]
        assert info.get("placement_conflicts", 0) == 0
        total += reward
        done = terminated or truncated
    return {"reward": total, "stats": env.sim.stats}


# --------------------------------------------------------------------------- episodes
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("interface", ["flat", "branching"])
@pytest.mark.parametrize("name", NAMES)
def test_full_episodes_are_feasible(name: str, interface: str, workload: str) -> None:
    for n_servers in (15, 50):
        env = make_env(interface, n_servers, workload, 200)
        policy = make_heuristic(name, interface)
        for seed in (0, 7):
            stats = run_episode(policy, env, seed)["stats"]
            assert stats.finished > 0
            if name != "power_aware":
                assert stats.toggles == 0


def test_power_aware_uses_less_energy_than_ffd() -> None:
    for workload in WORKLOADS:
        for interface in ("flat", "branching"):
            env = make_env(interface, 50, workload, 500)
            result = {}
            for name in ("ffd", "power_aware"):
                policy = make_heuristic(name, interface)
                runs = [run_episode(policy, env, seed) for seed in range(5)]
                result[name] = (np.mean([r["stats"].energy_j for r in runs]),
                                np.mean([r["reward"] for r in runs]),
                                np.mean([r["stats"].violation_rate for r in runs]))
            (e_ffd, r_ffd, v_ffd), (e_pa, r_pa, v_pa) = result["ffd"], result["power_aware"]
            assert e_pa < 0.9 * e_ffd, (workload, interface, result)
            assert r_pa > r_ffd, (workload, interface, result)
            assert v_pa <= v_ffd + 0.01, (workload, interface, result)


# --------------------------------------------------------------------------- hand-built
def make_obs(servers: list[dict], jobs: list[dict], interface: str, k: int = 4) -> dict:
    """An observation in the env's layout. Server keys: cap, free, state ("active",
    "asleep", "waking"), running, tier, wpc. Job keys: cpu, mem, duration, slack."""
    n, t = len(servers), 1 + max(s.get("tier", 0) for s in servers)
    srv = np.zeros((n, len(SERVER_COLS) + t), dtype=np.float32)
    for i, s in enumerate(servers):
        state = s.get("state", "active")
        cap, free = s.get("cap", 1.0), s.get("free", s.get("cap", 1.0))
        srv[i, [S["cpu_cap"], S["mem_cap"]]] = cap
        srv[i, [S["cpu_free"], S["mem_free"]]] = free
        srv[i, S["cpu_util"]] = (cap - free) / cap
        srv[i, S["is_" + state]] = 1.0
        srv[i, S["n_running"]] = s.get("running", 0 if free >= cap else 1) / 10
        srv[i, S["watts_per_cpu"]] = s.get("wpc", 1.0)
        srv[i, len(SERVER_COLS) + s.get("tier", 0)] = 1.0
    rows = np.zeros((k, len(JOB_COLS)), dtype=np.float32)
    for i, job in enumerate(jobs):
        rows[i, J["present"]] = 1.0
        rows[i, J["cpu"]] = job["cpu"]
        rows[i, J["mem"]] = job.get("mem", job["cpu"])
        rows[i, J["duration"]] = job.get("duration", 0.3)
        rows[i, J["slack"]] = job.get("slack", 0.2)
    active = srv[:, S["is_active"]] > 0
    place = (rows[:, None, J["present"]] > 0) & active[None, :] & \
        (rows[:, None, J["cpu"]] <= srv[None, :, S["cpu_free"]]) & \
        (rows[:, None, J["mem"]] <= srv[None, :, S["mem_free"]])
    idle = active & (srv[:, S["n_running"]] == 0)
    asleep = srv[:, S["is_asleep"]] > 0
    if interface == "flat":
        mask = np.concatenate([place.ravel(), idle | asleep, [True]])
    else:
        onehot = srv[:, len(SERVER_COLS):].T > 0
        tiers = np.stack([(onehot & idle).any(1), np.ones(t, bool), (onehot & asleep).any(1)], 1)
        slots = np.concatenate([place, np.ones((k, 1), bool)], axis=1)
        mask = np.concatenate([slots.ravel(), tiers.ravel(), np.ones(LEVELS, bool)])
    macro = np.zeros(macro_size(t), dtype=np.float32)
    macro[4 * t + MACRO_TAIL.index("queue_cpu_demand")] = \
        sum(j["cpu"] for j in jobs) / srv[:, S["cpu_cap"]].sum()
    return {"macro": macro, "servers": srv, "jobs": rows, "action_mask": mask.astype(np.float32)}


def flat_place(action: int, n: int) -> tuple[int, int]:
    return divmod(int(action), n)


FOUR_SERVERS = [
    {"state": "asleep"},  # 0: feasible for nothing
    {"free": 0.1},  # 1: too small for the jobs below
    {"free": 0.5},  # 2: first fit for one job of 0.3
    {"free": 1.0},  # 3: room for anything
]
JOBS = [
    {"cpu": 0.15, "duration": 0.5},
    {"cpu": 1.5, "duration": 0.05},  # shortest and largest, but fits nowhere
    {"cpu": 0.3, "duration": 0.1},  # shortest placeable
    {"cpu": 0.4, "duration": 0.2},  # largest placeable
]


def test_sjf_places_the_shortest_placeable_job_first_fit() -> None:
    obs = make_obs(FOUR_SERVERS, JOBS, "flat")
    assert flat_place(ShortestJobFirst("flat").act(obs), 4) == (2, 2)
    action = ShortestJobFirst("branching").act(make_obs(FOUR_SERVERS, JOBS, "branching"))
    # duration order 2, 3, 0: job 2 leaves 0.2 on server 2, so job 3 goes to 3, job 0 to 2
    assert list(action[:4]) == [2, 4, 2, 3]
    assert action[-1] == LEVELS - 1


def test_ffd_places_the_largest_placeable_job_first_fit() -> None:
    obs = make_obs(FOUR_SERVERS, JOBS, "flat")
    assert flat_place(FirstFitDecreasing("flat").act(obs), 4) == (3, 2)
    action = FirstFitDecreasing("branching").act(make_obs(FOUR_SERVERS, JOBS, "branching"))
    # size order 3 (0.4), 2 (0.3), 0 (0.15): 3 -> server 2 (0.1 left), 2 -> 3, 0 -> 3
    assert list(action[:4]) == [3, 4, 3, 2]
    assert list(action[4:]) == [HOLD, 0]


def test_round_robin_rotates_over_feasible_servers() -> None:
    servers = [{}, {"state": "asleep"}, {}, {}]
    policy = RoundRobin("flat")
    obs = make_obs(servers, [{"cpu": 0.1}, {"cpu": 0.1}], "flat")
    assert [flat_place(policy.act(obs), 4) for _ in range(4)] == [(0, 0), (0, 2), (0, 3), (0, 0)]
    policy.reset()
    assert flat_place(policy.act(obs), 4) == (0, 0)
    # flat RR serves only the head of the queue: a blocked head means wait
    blocked = make_obs(servers, [{"cpu": 2.0}, {"cpu": 0.1}], "flat")
    assert policy.act(blocked) == 4 * 4 + 4
    branching = RoundRobin("branching").act(make_obs(servers, [{"cpu": 0.6}] * 4, "branching"))
    assert list(branching[:4]) == [0, 2, 3, 4]  # one 0.6 job per server, the fourth deferred


def test_masked_choice_falls_back_to_wait_and_defer() -> None:
    class Broken(FirstFitDecreasing):
        def _choose_server(self, view, slot, feasible, plan) -> int:
            return 0  # asleep: masked

    obs = make_obs(FOUR_SERVERS, JOBS, "flat")
    assert Broken("flat").act(obs) == 4 * 4 + 4
    action = Broken("branching").act(make_obs(FOUR_SERVERS, JOBS, "branching"))
    assert list(action[:4]) == [4] * 4


def test_power_aware_sleeps_the_least_efficient_idle_server_at_low_load() -> None:
    servers = [{"tier": 0, "wpc": 0.7, "free": 0.5}, {"tier": 0, "wpc": 0.7},
               {"tier": 1, "wpc": 1.0, "cap": 0.25}, {"tier": 1, "wpc": 1.0, "cap": 0.25}]
    flat = PowerAwareConsolidation("flat").act(make_obs(servers, [], "flat"))
    assert flat == 4 * 4 + 3  # toggle the highest-index server of the least efficient tier
    # spare 2.0, low water 0.5, hysteresis 1.0: room for one small server only
    action = PowerAwareConsolidation("branching").act(make_obs(servers, [], "branching"))
    assert list(action[4:6]) == [HOLD, SLEEP_ONE]
    # without hysteresis 2.0 - 0.25 - 1.0 >= 0.5: one sleep in each tier
    eager = PowerAwareConsolidation("branching", hysteresis=0.0)
    assert list(eager.act(make_obs(servers, [], "branching"))[4:6]) == [SLEEP_ONE, SLEEP_ONE]


def test_power_aware_hysteresis_does_not_wake_what_it_slept() -> None:
    # spare 1.5; sleeping the 0.5 server leaves 1.0 = low 0.5 + hysteresis 0.5: it sleeps,
    # and the state after it (spare 1.0 >= low) wakes nothing
    cfg = PowerAwareConfig(spare_floor=0.5, hysteresis=0.5, lead_ticks=0.0)
    busy = {"free": 0.0, "running": 3}
    before = [busy, {"free": 1.0}, {"cap": 0.5, "tier": 1, "wpc": 1.0}]
    assert PowerAwareConsolidation("flat", cfg).act(make_obs(before, [], "flat")) == 3 * 4 + 2
    after = [busy, {"free": 1.0}, {"cap": 0.5, "tier": 1, "wpc": 1.0, "state": "asleep"}]
    assert PowerAwareConsolidation("flat", cfg).act(make_obs(after, [], "flat")) == 3 * 4 + 3
    # and with a little less spare it neither sleeps nor wakes
    tight = [busy, {"free": 0.9, "running": 1}, {"cap": 0.5, "tier": 1, "wpc": 1.0}]
    assert PowerAwareConsolidation("flat", cfg).act(make_obs(tight, [], "flat")) == 3 * 4 + 3


def test_power_aware_wakes_a_fitting_efficient_server_when_a_job_fits_nowhere() -> None:
    servers = [{"free": 0.05, "running": 2},
               {"state": "asleep", "cap": 0.25, "tier": 1, "wpc": 0.5},  # efficient, too small
               {"state": "asleep", "cap": 1.0, "tier": 0, "wpc": 0.8},
               {"state": "asleep", "cap": 1.0, "tier": 0, "wpc": 0.8}]
    jobs = [{"cpu": 0.4}]
    cfg = PowerAwareConfig(spare_floor=0.0, lead_ticks=0.0)
    flat = PowerAwareConsolidation("flat", cfg).act(make_obs(servers, jobs, "flat"))
    assert flat == 4 * 4 + 2
    action = PowerAwareConsolidation("branching", cfg).act(make_obs(servers, jobs, "branching"))
    assert list(action[:4]) == [4] * 4
    assert list(action[4:6]) == [WAKE_ONE, HOLD]
    # a waking server that can take the job: no second wake
    servers[2]["state"] = "waking"
    assert PowerAwareConsolidation("flat", cfg).act(make_obs(servers, jobs, "flat")) == 4 * 4 + 4


def test_power_aware_never_sleeps_a_tier_whose_idle_server_just_got_a_job() -> None:
    servers = [{"tier": 0, "wpc": 1.0}] + [{"tier": 1, "wpc": 0.5, "free": 0.3}] * 6
    cfg = PowerAwareConfig(spare_floor=0.0, hysteresis=0.0, lead_ticks=0.0)
    obs = make_obs(servers, [{"cpu": 0.5}], "branching")
    idle_obs = make_obs(servers, [], "branching")
    assert PowerAwareConsolidation("branching", cfg).act(idle_obs)[4] == SLEEP_ONE
    action = PowerAwareConsolidation("branching", cfg).act(obs)
    assert action[0] == 0  # the only server with room
    assert list(action[4:6]) == [HOLD, HOLD]


def test_power_aware_wakes_a_sleeping_fleet_and_sleeps_an_idle_one() -> None:
    env = make_env("branching", 15, "poisson", 60, fleet={"initially_asleep": 0.8})
    policy = make_heuristic("power_aware", "branching")
    stats = run_episode(policy, env, 3)["stats"]
    assert env.sim.power_state.tolist().count(1) < 12  # woke servers (1 = asleep)
    assert stats.toggles > 0
    env = make_env("flat", 15, {"kind": "poisson", "load": 0.1}, 60)
    stats = run_episode(make_heuristic("power_aware", "flat"), env, 3)["stats"]
    assert env.sim.power_state.tolist().count(1) >= 3
    assert stats.violation_rate == 0.0


# --------------------------------------------------------------------------- registry
def test_registry_and_make_heuristic() -> None:
    assert set(HEURISTICS) == set(NAMES)
    for name, cls in HEURISTICS.items():
        for interface in ("flat", "branching"):
            policy = make_heuristic(name, interface)
            assert isinstance(policy, cls)
            assert (policy.name, policy.interface) == (name, interface)
    tuned = make_heuristic("power_aware", "flat", spare_floor=2.0)
    assert tuned.config.spare_floor == 2.0
    with pytest.raises(ValueError, match=r"'lifo'.*ffd, power_aware, round_robin, sjf"):
        make_heuristic("lifo", "flat")
    with pytest.raises(ValueError, match="interface"):
        make_heuristic("ffd", "hierarchical")
    with pytest.raises(ValueError, match="hysteresis"):
        PowerAwareConfig(hysteresis=-1.0)
    with pytest.raises(ValueError, match="K\\*N\\+N\\+1"):
        FirstFitDecreasing("flat").act(make_obs(FOUR_SERVERS, JOBS, "branching"))
