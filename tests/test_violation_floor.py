"""The flat interface's violation floor: exact on hand cases, reached by a policy on a
hand-built burst, never above what any flat policy gets in the simulator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudrl.evaluate import make_env, run_episode
from cloudrl.heuristics import HEURISTICS, make_heuristic
from cloudrl.violation_floor import burst_floor, episode_floor, episode_floors
from envs.env_config import EnvConfig
from envs.sim import ClusterSim
from envs.sim_config import FleetConfig, SimConfig, TierConfig
from envs.workloads.base import JobTable
from tests.support import FixedWorkload


def test_hand_cases():
    # five at tick 0, queue of 2: two queued, three dropped on arrival
    assert burst_floor(np.zeros(5), horizon=10, queue_capacity=2) == 3
    # three at 0 and three at 1: one placement between them, so 6 - 2 - 1 = 3
    assert burst_floor(np.array([0, 0, 0, 1, 1, 1]), horizon=10, queue_capacity=2) == 3
    # two bursts far apart add up: (4 - 1) + (3 - 1)
    assert burst_floor(np.array([0] * 4 + [50] * 3), horizon=100, queue_capacity=1) == 5
    # one a tick never overflows a queue of one
    assert burst_floor(np.arange(20), horizon=20, queue_capacity=1) == 0
    # arrivals after the horizon or before 0 (pre-loaded) do not count
    assert burst_floor(np.array([-3, -3, -3, 11, 11, 11]), horizon=10, queue_capacity=0) == 0
    with pytest.raises(ValueError, match="queue_capacity"):
        burst_floor(np.zeros(3), horizon=5, queue_capacity=-1)


@given(st.lists(st.integers(0, 30), max_size=60), st.integers(0, 6))
@settings(max_examples=60, deadline=None)
def test_floor_is_monotone_in_the_queue(arrivals, q):
    """A larger queue never raises the floor; one more job never lowers it."""
    a = np.array(arrivals, dtype=np.int64)
    assert burst_floor(a, 30, q + 1) <= burst_floor(a, 30, q)
    assert burst_floor(np.append(a, 7), 30, q) >= burst_floor(a, 30, q)


def test_a_policy_reaches_the_floor_on_a_burst():
    """Six jobs at tick 0, queue of 2: the floor is 6 - 2 = 4, and placing one job a
    tick loses exactly those four (dropped on arrival)."""
    tier = TierConfig(name="only", cpu_cores=64, mem_gib=256, p_idle_w=100, p_max_w=200)
    cfg = SimConfig(fleet=FleetConfig(n_servers=1, tiers=[tier]), episode_length=10,
                    queue_capacity=2, queue_window=2, warm_start=False)
    n = 6  # six short jobs at tick 0, deadline allowance 50
    burst = JobTable(np.zeros(n, np.int64), np.full(n, 0.1), np.full(n, 0.1),
                     np.ones(n, np.int64), np.full(n, 50, np.int64))
    sim = ClusterSim(cfg, FixedWorkload(burst))
    floor = episode_floor(sim, 0)
    sim.reset(0)
    while not sim.done:
        if sim.queue:
            assert sim.place(0, 0)
        sim.advance()
    assert floor == 4 == sim.stats.violations


_SMALL = {"n_servers": 4, "sim": {"episode_length": 120, "queue_capacity": 6,
                                  "queue_window": 4}}


@pytest.mark.parametrize("workload", ["google_v2_like", "poisson"])
def test_the_small_configs_have_bursts(workload):
    """The soundness test below is not vacuous: the floor is positive on some seeds."""
    floors = episode_floors({**_SMALL, "workload": workload}, range(12))
    assert max(floors) > 0


@given(seed=st.integers(0, 10_000), workload=st.sampled_from(["google_v2_like", "poisson"]))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_flat_policy_gets_fewer_violations(seed, workload):
    """Every heuristic and a random valid policy on the flat interface: violations >= floor."""
    cfg = EnvConfig.model_validate({**_SMALL, "workload": workload})
    env = make_env(cfg, "flat")
    floor = episode_floor(env.sim, seed)
    for name in sorted(HEURISTICS):
        run_episode(make_heuristic(name, "flat"), env, seed)
        assert env.sim.stats.violations >= floor, name
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    done = False
    while not done:
        valid = np.flatnonzero(obs["action_mask"])
        obs, _, term, trunc, _ = env.step(int(rng.choice(valid)))
        done = term or trunc
    assert env.sim.stats.violations >= floor
