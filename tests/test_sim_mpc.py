"""The sim-MPC (CEM over rollouts of the real scenario simulator) and the hindsight oracle.

Everything runs on the ``tiny`` scenario, shortened (a quarter day, batch slack of an hour)
so an episode is a few hundred ticks, with small search budgets.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloudrl.algorithms.distill.actions import FINE_READY_MARGINS, FINE_RELEASE_LEVELS
from cloudrl.mpc.oracle import ClairvoyantOracle
from cloudrl.mpc.sim_mpc import SimHindsightOracle, SimMPC, SimMPCConfig
from cloudrl.mpc.sim_mpc.future import blank_future
from cloudrl.mpc.sim_mpc.rollout import Scoring, snap, terminal_value
from envs.scenario.catalog import load_scenario
from envs.scenario.control import RunAtOnce, plan_view, release_and_ready, run_episode
from envs.scenario.jobs import ClassJobs
from envs.scenario.sim import ScenarioSim
from envs.signals import SignalSeries

SHORT = {"days": 0.25, "classes": [{}, {"slack_min": 60.0, "duration_min_mean": 30.0}]}
SMALL = dict(samples=2, horizon=4, block_periods=2, iterations=2, population=6, elites=2)


@pytest.fixture(scope="module")
def cfg():
    return load_scenario("tiny", SHORT)


def _advance(sim: ScenarioSim, seed: int, ticks: int, release: float = 1.0) -> ScenarioSim:
    """``sim`` reset to ``seed`` and played ``ticks`` ticks with every server ready."""
    sim.reset(seed)
    sim.set_controls(release, sim.fleet_cores)
    for _ in range(ticks):
        sim.tick()
    return sim


def _other_future(sim: ScenarioSim, seed: int) -> ClassJobs:
    """The jobs of episode ``seed`` that arrive at ``sim.t`` or later, made 3x as many by
    repeating them (a future quite unlike the realised one)."""
    other = ScenarioSim(sim.cfg)
    other.reset(seed)
    j = other.jobs
    pick = j.arrival >= sim.t
    cols = [np.repeat(getattr(j, f)[pick], 3) for f in ("arrival", "cls", "cores",
                                                        "duration", "deadline")]
    return ClassJobs(*cols)


def _other_signals(sim: ScenarioSim, factor: float) -> SignalSeries:
    """``sim``'s signals with every price after ``sim.t`` times ``factor``."""
    s = sim.signals
    price = np.array(s.price_usd_per_mwh)
    price[sim.t + 1:] *= factor
    return SignalSeries(price, s.carbon_g_per_kwh, s.solar_kw, s.tick_seconds, s.start)


def _plays(ctrl, sim: ScenarioSim, decisions: int) -> list[tuple[float, float]]:
    """The controls ``ctrl`` sets over ``decisions`` decisions played from ``sim``'s tick."""
    ctrl.reset(sim)
    out = []
    d = sim.cfg.decision_ticks
    for _ in range(decisions):
        out.append(ctrl.decide(sim))
        sim.set_controls(*out[-1])
        for _ in range(d):
            sim.tick()
    return out


# ---------------------------------------------------------------------- copies
def test_a_clone_ticks_like_the_original_and_leaves_it_alone(cfg):
    sim = _advance(ScenarioSim(cfg), 1_000_001, 45, release=0.3)
    before = sim.stats.summary()
    twin = sim.clone()
    for _ in range(60):
        twin.tick()
    assert sim.stats.summary() == before and sim.t == 45
    for _ in range(60):
        sim.tick()
    assert sim.stats.summary() == twin.stats.summary()
    np.testing.assert_array_equal(sim.state, twin.state)


def test_with_future_refuses_arrivals_before_now(cfg):
    sim = _advance(ScenarioSim(cfg), 1_000_002, 20)
    past = sim.jobs
    with pytest.raises(ValueError, match="future: arrivals before tick 20"):
        sim.with_future(ClassJobs(past.arrival[:3], past.cls[:3], past.cores[:3],
                                  past.duration[:3], past.deadline[:3]))


# ---------------------------------------------------------------------- no peeking
def test_blank_future_holds_no_arrival_or_signal_after_now(cfg):
    sim = _advance(ScenarioSim(cfg), 1_000_003, 35)
    root = blank_future(sim)
    assert root.t == sim.t == 35
    assert len(root.jobs) == sim._next and (root.jobs.arrival < sim.t).all()
    assert np.isnan(root.signals.price_usd_per_mwh[sim.t + 1:]).all()
    assert np.isnan(root.signals.carbon_g_per_kwh[sim.t + 1:]).all()
    np.testing.assert_array_equal(root.signals.price_usd_per_mwh[:sim.t + 1],
                                  sim.signals.price_usd_per_mwh[:sim.t + 1])
    assert root.stats.cost_usd == sim.stats.cost_usd


def test_sampled_futures_depend_on_the_forecasts_not_on_the_realised_future(cfg):
    sim = _advance(ScenarioSim(cfg), 1_000_004, 40)
    v = plan_view(sim)
    twin = sim.with_future(_other_future(sim, 1_000_011), _other_signals(sim, 4.0))
    ctrl = SimMPC(SimMPCConfig(**SMALL))
    mine, theirs = ctrl.futures(sim, v), ctrl.futures(twin, v)
    for a, b in zip(mine, theirs, strict=True):
        np.testing.assert_array_equal(a.jobs.arrival, b.jobs.arrival)
        np.testing.assert_array_equal(a.jobs.cores, b.jobs.cores)
        np.testing.assert_array_equal(a.signals.price_usd_per_mwh, b.signals.price_usd_per_mwh)
    # and the samples are not the truth: other arrivals, other prices
    real = sim.jobs.arrival[sim.jobs.arrival >= sim.t]
    assert not np.array_equal(mine[0].jobs.arrival[sim._next:], real)
    h = slice(sim.t + 1, sim.t + 1 + ctrl.config.horizon * cfg.decision_ticks)
    assert not np.allclose(mine[0].signals.price_usd_per_mwh[h], sim.signals.price_usd_per_mwh[h])


def test_changing_future_arrivals_changes_the_hindsight_decision_not_the_sim_mpc(cfg):
    sim = _advance(ScenarioSim(cfg), 1_000_005, 30)
    twin = sim.with_future(_other_future(sim, 1_000_012))
    mpc = SimMPC(SimMPCConfig(**SMALL))
    assert _plays(mpc, sim.clone(), 1) == _plays(mpc, twin.clone(), 1)
    oracle = SimHindsightOracle(warm_oracle=False, **{**SMALL, "samples": 1})
    assert _plays(oracle, sim.clone(), 1) != _plays(oracle, twin.clone(), 1)


# ---------------------------------------------------------------------- the search
def test_same_seed_same_decisions_other_seed_other_plans(cfg):
    sim = _advance(ScenarioSim(cfg), 1_000_006, 25)
    a = SimMPC(SimMPCConfig(**SMALL, seed=3))
    b = SimMPC(SimMPCConfig(**SMALL, seed=3))
    c = SimMPC(SimMPCConfig(**SMALL, seed=4))
    assert _plays(a, sim.clone(), 3) == _plays(b, sim.clone(), 3)
    _plays(c, sim.clone(), 3)
    assert [p.tolist() for _, p, _ in a.plans] == [p.tolist() for _, p, _ in b.plans]
    assert [s for *_, s in a.plans] != [s for *_, s in c.plans]  # other sampled futures


def test_every_decision_is_a_menu_point(cfg):
    sim = ScenarioSim(cfg)
    sim.reset(1_000_007)
    ctrl = SimMPC(SimMPCConfig(**SMALL, replan_periods=2))
    ctrl.reset(sim)
    d = cfg.decision_ticks
    for _ in range(8):
        v = plan_view(sim)
        release, ready = ctrl.decide(sim)
        menu = {release_and_ready(v, r, m) for r in FINE_RELEASE_LEVELS
                for m in FINE_READY_MARGINS}
        assert (release, ready) in menu
        assert 0.0 <= release <= 1.0
        sim.set_controls(release, ready)
        for _ in range(d):
            sim.tick()
    assert len(ctrl.solve_times) == 4  # one re-plan every second decision


def test_the_menu_is_the_learned_policys():
    from cloudrl.mpc.sim_mpc import rollout

    assert rollout.FINE_RELEASE_LEVELS == FINE_RELEASE_LEVELS
    assert rollout.FINE_READY_MARGINS == FINE_READY_MARGINS


@given(st.lists(st.tuples(st.floats(-3, 3), st.floats(-3, 3)), min_size=1, max_size=6))
def test_snap_lands_on_the_menu(points):
    out = snap(np.clip(np.array(points), [0.0, -0.5], [1.0, 1.0]))
    assert set(out[:, 0].tolist()) <= set(FINE_RELEASE_LEVELS)
    assert set(out[:, 1].tolist()) <= set(FINE_READY_MARGINS)


def test_terminal_value_charges_the_held_work(cfg):
    """Holding every batch job (release 0) leaves work the terminal value charges at no
    less than the cheapest grid price of the remaining window, and no more than the dearest."""
    sim = _advance(ScenarioSim(cfg), 1_000_008, 30, release=0.0)
    cores, duration, _ = sim.pool_work()
    assert len(cores) > 0
    scoring = Scoring.for_sim(sim, 0.5)
    empty = _advance(ScenarioSim(cfg), 1_000_008, 0)
    value = terminal_value(sim, scoring)
    usd = (sim.signals.price_usd_per_mwh[sim.t:] / 1000.0
           + sim.signals.carbon_g_per_kwh[sim.t:] * cfg.cost.carbon_usd_per_tonne / 1e6)
    held = float((cores * duration).sum()) * scoring.kwh_per_core_tick
    running = sim.running_profile(len(usd)).sum() * scoring.kwh_per_core_tick
    lo = held * usd.min()
    hi = (held + running + sim.queued_cores * 100) * usd.max()
    assert lo <= value <= hi
    assert terminal_value(empty, scoring) == 0.0


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="samples"):
        SimMPCConfig(samples=0)
    with pytest.raises(ValueError, match="elites"):
        SimMPCConfig(population=4, elites=5)
    with pytest.raises(ValueError, match="terminal_quantile"):
        SimMPCConfig(terminal_quantile=1.5)


# ---------------------------------------------------------------------- parallel path
def test_ray_actors_and_in_process_give_the_same_decisions(cfg):
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        sim = _advance(ScenarioSim(cfg), 1_000_009, 20)
        local = SimMPC(SimMPCConfig(**SMALL, workers=1))
        remote = SimMPC(SimMPCConfig(**SMALL, workers=2))
        try:
            assert _plays(local, sim.clone(), 3) == _plays(remote, sim.clone(), 3)
            assert [s for *_, s in local.plans] == [s for *_, s in remote.plans]
        finally:
            remote.close()
    finally:
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------- against the oracle
@pytest.mark.parametrize("seed", [1_000_021, 1_000_022])
def test_hindsight_oracle_costs_no_more_than_the_fluid_oracle(cfg, seed):
    sim = ScenarioSim(cfg)
    fluid = run_episode(sim, ClairvoyantOracle(), seed).metrics["cost_usd"]
    hind = run_episode(sim, SimHindsightOracle(**{**SMALL, "samples": 1,
                                                  "replan_periods": 2}), seed)
    assert hind.metrics["cost_usd"] <= fluid + 1e-9
    assert hind.metrics["jobs_batch"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1_000_030, 1_000_036))
def test_hindsight_oracle_below_fluid_oracle_on_full_tiny_episodes(seed):
    cfg = load_scenario("tiny")
    sim = ScenarioSim(cfg)
    fluid = run_episode(sim, ClairvoyantOracle(), seed).metrics["cost_usd"]
    hind = run_episode(sim, SimHindsightOracle(replan_periods=2), seed).metrics["cost_usd"]
    run_at_once = run_episode(sim, RunAtOnce(), seed).metrics["cost_usd"]
    assert hind <= fluid + 1e-9 < run_at_once + 1e-9
