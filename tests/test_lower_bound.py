"""The clairvoyant energy lower bound: sound against every heuristic, exact on hand-solved cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudrl.evaluate import make_env, run_episode
from cloudrl.heuristics import HEURISTICS, make_heuristic
from cloudrl.lower_bound import (
    J_PER_KWH,
    Envelope,
    episode_bound,
    gap_closed,
    make_sim,
    min_power,
    offered_load,
    required_work,
)
from envs.env_config import EnvConfig
from envs.fleet import Fleet
from envs.sim import ClusterSim
from envs.sim_config import FleetConfig, SimConfig, TierConfig
from envs.workloads.base import JobTable

# ---------------------------------------------------------------- hand-solved tiny instances


class _FixedJobs:
    """A workload that always produces the same job table (no warm start needed)."""

    name = "fixed"

    def __init__(self, jobs: JobTable) -> None:
        self.jobs = jobs

    def generate(self, horizon, rng, fleet):
        return self.jobs

    def stationary_sample(self, n, rng, fleet):
        return JobTable.empty()

    def offered_rate(self, fleet):
        return 0.0

    def mean_duration(self, fleet):
        return 1.0


def _tiny_sim(jobs: list[tuple[int, float, int, int]], ticks: int = 5) -> ClusterSim:
    """Two identical servers (capacity 1, P = 100 + 100 u W, asleep 5 W), instant wake;
    ``jobs``: (arrival, cpu, duration, deadline allowance)."""
    tier = TierConfig(name="only", cpu_cores=64, mem_gib=256, p_idle_w=100, p_max_w=200,
                      power_exponent=1.0)
    cfg = SimConfig(fleet=FleetConfig(n_servers=2, tiers=[tier]), episode_length=ticks,
                    standby_fraction=0.05, wake_delay=0, warm_start=False)
    a, c, d, dl = (np.array(col) for col in zip(*jobs, strict=True))
    table = JobTable(a.astype(np.int64), c.astype(float), c.astype(float) / 4,
                     d.astype(np.int64), dl.astype(np.int64))
    return ClusterSim(cfg, _FixedJobs(table))


def _run_schedule(sim: ClusterSim, plan: dict[int, list[tuple]]) -> float:
    """Energy (kWh) of the explicit schedule ``plan`` {tick: [("sleep"|"wake", server) or
    ("place", job id, server)]}; asserts every action is feasible and nothing is dropped
    or finishes late within the episode."""
    sim.reset(0)
    while not sim.done:
        for act in plan.get(sim.t, []):
            if act[0] == "place":
                assert sim.place(sim.queue.index(act[1]), act[2]), act
            else:
                assert sim.toggle(act[1]), act
        sim.advance()
    assert sim.stats.violations == 0
    return sim.stats.energy_j / J_PER_KWH


def _wh(kwh: float) -> float:
    return kwh * J_PER_KWH / 60.0  # one tick is 60 s: W·tick


@pytest.mark.parametrize(("jobs", "plan", "watt_ticks"), [
    # one full-server job, d=2, due at 4: sleep both, wake one at its latest start (tick 2)
    ([(0, 1.0, 2, 4)],
     {0: [("sleep", 0), ("sleep", 1)], 2: [("wake", 0), ("place", 0, 0)], 4: [("sleep", 0)]},
     10 + 10 + 205 + 205 + 10),
    # plus a second full-server job arriving at 1, d=1, due at 4: it runs in tick 3 alone
    ([(0, 1.0, 2, 4), (1, 1.0, 1, 3)],
     {0: [("sleep", 0), ("sleep", 1)], 2: [("wake", 0), ("place", 0, 0)],
      3: [("wake", 1), ("place", 1, 1)], 4: [("sleep", 0), ("sleep", 1)]},
     10 + 10 + 205 + 400 + 10),
    # d=4 due at 5 = T: started at tick 4 it would end after the episode (never counted late),
    # so only one tick of it must run
    ([(0, 1.0, 4, 5)],
     {0: [("sleep", 0), ("sleep", 1)], 4: [("wake", 0), ("place", 0, 0)]},
     10 * 4 + 205),
    # due after the episode ends: it can stay queued, nothing must run
    ([(0, 1.0, 2, 7)], {0: [("sleep", 0), ("sleep", 1)]}, 10 * 5),
])
def test_bound_equals_the_optimum_of_hand_solved_instances(jobs, plan, watt_ticks):
    sim = _tiny_sim(jobs)
    bound = episode_bound(None, 0, sim=sim)
    achieved = _run_schedule(_tiny_sim(jobs), plan)
    # the schedule reaches the bound, and the bound is a lower bound: both are the optimum
    assert _wh(achieved) == pytest.approx(watt_ticks, abs=1e-9)
    assert _wh(bound.energy_kwh) == pytest.approx(watt_ticks, rel=1e-9)
    assert bound.feasible


@pytest.mark.parametrize(("jobs", "bound_wt", "offered_wt"), [
    # F(L) = 10 + 195 L W on the tiny fleet (convex envelope of two 100 + 100 u servers
    # over a 5 W sleep); the offered reference runs every job from its arrival
    ([(0, 1.0, 2, 4)], 10 + 10 + 205 + 205 + 10, 205 + 205 + 10 + 10 + 10),
    ([(0, 1.0, 2, 4), (1, 1.0, 1, 3)], 10 + 10 + 205 + 400 + 10, 205 + 400 + 10 + 10 + 10),
    ([(0, 1.0, 4, 5)], 10 * 4 + 205, 205 * 4 + 10),   # the bound runs one tick of it
    ([(0, 1.0, 2, 7)], 10 * 5, 205 * 2 + 10 * 3),      # the bound runs none of it
])
def test_offered_reference_of_hand_solved_instances(jobs, bound_wt, offered_wt):
    bound = episode_bound(None, 0, sim=_tiny_sim(jobs))
    assert _wh(bound.energy_kwh) == pytest.approx(bound_wt, rel=1e-9)
    assert _wh(bound.offered_kwh) == pytest.approx(offered_wt, rel=1e-9)


@pytest.mark.parametrize("workload", ["poisson", "google_v2_like"])
def test_offered_reference_is_never_below_the_bound(workload):
    cfg = EnvConfig.model_validate({"n_servers": 50, "workload": workload,
                                    "sim": {"episode_length": 300}})
    sim = make_sim(cfg)
    for seed in (0, 7, 1_000_000):
        bound = episode_bound(cfg, seed, sim=sim)
        assert bound.energy_kwh <= bound.offered_kwh
        work = required_work(sim)  # sim is at this seed's reset
        offered = offered_load(sim)
        assert np.all(offered >= work.forced - 1e-9)  # why: the water level's constraints
        assert offered.sum() >= work.total - 1e-9


def test_required_work_of_the_tiny_instance():
    sim = _tiny_sim([(0, 1.0, 3, 4), (0, 1.0, 4, 8), (1, 0.5, 3, 10)], ticks=8)
    sim.reset(0)
    work = required_work(sim)
    # job 0: 3 ticks, and whether it starts at 0 or 1 it runs in ticks 1 and 2;
    # job 1 (due at T=8, d=4): started at 7 it ends after the episode, 1 tick;
    # job 2: due at 11 > T, may wait in the queue
    assert work.total == pytest.approx(3.0 + 1.0 + 0.0)
    np.testing.assert_allclose(work.forced, [0, 1.0, 1.0, 0, 0, 0, 0, 0])


# ---------------------------------------------------------------- the per-tick power bound


_tiers = st.builds(
    lambda cores, idle, extra, a: TierConfig(name="t", cpu_cores=cores, mem_gib=cores * 4,
                                             p_idle_w=idle, p_max_w=idle + extra,
                                             power_exponent=a),
    st.sampled_from([8, 16, 32, 64]), st.floats(0, 300), st.floats(1, 400),
    st.floats(0.3, 3.0))


def _actual_power(fleet: Fleet, standby: float, u: np.ndarray) -> np.ndarray:
    active = fleet.p_idle + (fleet.p_max - fleet.p_idle) * np.power(u, fleet.exponent)
    return np.where(u > 0, active, standby * fleet.p_idle)


@settings(max_examples=60, deadline=None)
@given(st.lists(_tiers, min_size=2, max_size=2), st.floats(0, 1), st.floats(0, 1))
def test_min_power_is_the_fractional_optimum_of_two_servers(tiers, standby, frac):
    named = [t.model_copy(update={"name": f"t{i}"}) for i, t in enumerate(tiers)]
    fleet = Fleet.from_config(FleetConfig(n_servers=2, tiers=named))
    env = Envelope.of(fleet, standby)
    load = frac * float(fleet.cpu_cap.sum())
    f = float(min_power(env, load))
    # every split of the load over the two servers draws at least F(L)
    x0 = np.linspace(max(0.0, load - fleet.cpu_cap[1]), min(fleet.cpu_cap[0], load), 2001)
    u = np.stack([x0 / fleet.cpu_cap[0], (load - x0) / fleet.cpu_cap[1]], axis=1).clip(0, 1)
    actual = _actual_power(fleet, standby, u).sum(axis=1)
    assert actual.min() >= f - 1e-6 * max(1.0, f)
    # and F(L) is the minimum of the convex envelope (up to the grid's resolution)
    envelope = env.power(u).sum(axis=1)
    step = (x0[-1] - x0[0]) / 2000 if len(x0) > 1 else 0.0
    lipschitz = float(np.max(np.maximum(env.slope, (env.span * env.exponent) / env.cap)))
    assert f <= envelope.min() + 1e-6 * max(1.0, f)
    assert envelope.min() - f <= lipschitz * step + 1e-6 * max(1.0, f)


@settings(max_examples=30, deadline=None)
@given(_tiers, st.floats(0, 1))
def test_envelope_is_convex_and_below_the_power_curve(tier, standby):
    fleet = Fleet.from_config(FleetConfig(n_servers=1, tiers=[tier]))
    env = Envelope.of(fleet, standby)
    u = np.linspace(0, 1, 1001)[:, None]
    h = env.power(u)[:, 0]
    g = _actual_power(fleet, standby, u)[:, 0]
    scale = max(1.0, float(fleet.p_max[0]))
    assert np.all(h <= g + 1e-9 * scale)
    assert np.all(np.diff(h, 2) >= -1e-7 * scale)
    assert h[0] == pytest.approx(standby * fleet.p_idle[0])


# ---------------------------------------------------------------- sound against heuristics


@pytest.mark.parametrize("workload", ["poisson", "google_v2_like"])
@pytest.mark.parametrize("interface", ["flat", "branching"])
def test_bound_is_below_every_heuristic_at_n50(workload, interface):
    cfg = EnvConfig.model_validate({"n_servers": 50, "workload": workload,
                                    "sim": {"episode_length": 200}})
    env = make_env(cfg, interface)
    for seed in (0, 1_000_000):
        bound = episode_bound(cfg, seed)
        assert bound.feasible and bound.energy_kwh > 0
        for name in HEURISTICS:
            used = run_episode(make_heuristic(name, interface), env, seed).energy_kwh
            assert bound.energy_kwh <= used, (name, seed, bound.energy_kwh, used)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 8), seed=st.integers(0, 2**20),
       workload=st.sampled_from(["poisson", "google_v2_like"]),
       interface=st.sampled_from(["flat", "branching"]),
       name=st.sampled_from(sorted(HEURISTICS)), asleep=st.sampled_from([0.0, 0.5]))
def test_bound_is_below_heuristics_on_small_fleets(n, seed, workload, interface, name, asleep):
    cfg = EnvConfig.model_validate({"n_servers": n, "workload": workload, "sim": {
        "episode_length": 80, "fleet": {"n_servers": n, "initially_asleep": asleep}}})
    bound = episode_bound(cfg, seed)
    used = run_episode(make_heuristic(name, interface), make_env(cfg, interface), seed)
    assert bound.floor_kwh <= bound.energy_kwh
    assert bound.floor_kwh <= used.energy_kwh + 1e-12  # holds for every policy
    if used.sla_violation_rate == 0:  # the bound proper: for violation-free episodes
        assert bound.energy_kwh <= used.energy_kwh + 1e-12


# ---------------------------------------------------------------- gap closed


def test_gap_closed():
    assert gap_closed(100.0, 120.0, 80.0) == pytest.approx(0.5)
    assert gap_closed(80.0, 120.0, 80.0) == pytest.approx(1.0)
    assert gap_closed(120.0, 120.0, 80.0) == 0.0
    assert gap_closed(130.0, 120.0, 80.0) == pytest.approx(-0.25)
    assert math.isnan(gap_closed(100.0, 80.0, 80.0))
