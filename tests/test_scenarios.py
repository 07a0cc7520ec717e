"""Scenarios: job classes, power states, cost accounting, the fluid plan, MPC and oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.heuristics.signal_aware import SignalAwareDeferral
from cloudrl.mpc.fluid import FluidProblem, solve
from cloudrl.mpc.forecast_mpc import ForecastMPC
from cloudrl.mpc.oracle import ClairvoyantOracle
from envs.scenario.catalog import UnknownScenarioError, load_scenario, scenario_names
from envs.scenario.control import RunAtOnce, run_episode
from envs.scenario.sim import ACTIVE, BOOTING, OFF, RESUMING, SUSPENDED, ScenarioSim


@pytest.fixture(scope="module")
def tiny():
    return load_scenario("tiny")


def test_catalog_has_the_named_scenarios_and_refuses_unknown_names():
    names = scenario_names()
    for name in ("carbon_shift", "carbon_shift_de", "price_peak", "solar_site", "mixed",
                 "scarcity_spikes", "demand_response", "cold_standby", "scarcity_low_load"):
        assert name in names
        assert load_scenario(name).description
    with pytest.raises(UnknownScenarioError, match="valid: .*carbon_shift"):
        load_scenario("no_such_scenario")


def test_overrides_merge_and_bad_values_name_the_field():
    cfg = load_scenario("tiny", {"fleet": {"n_servers": 5}, "cost": {"pue": 1.5}})
    assert cfg.fleet.n_servers == 5 and cfg.cost.pue == 1.5
    assert cfg.classes[0].slack_min == 6.0  # the rest of the YAML kept
    with pytest.raises(ValueError, match="pue"):
        load_scenario("tiny", {"cost": {"pue": 0.5}})
    with pytest.raises(ValueError, match="load_share must sum to 1"):
        load_scenario("tiny", {"classes": [{"load_share": 0.9}, {"load_share": 0.9}]})


def _play(sim: ScenarioSim, release: float, ready: float, seed: int) -> None:
    sim.reset(seed)
    sim.set_controls(release, ready)
    while not sim.done:
        sim.tick()


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), release=st.floats(0.0, 1.2),
       ready_frac=st.floats(0.0, 1.0))
def test_every_job_ends_inside_the_episode_and_is_counted_once(tiny, seed, release, ready_frac):
    sim = ScenarioSim(tiny)
    _play(sim, release, ready_frac * sim.fleet_cores, seed)
    for c, stats in enumerate(sim.stats.classes):
        assert stats.arrived == int((sim.jobs.cls == c).sum())
        assert stats.finished + stats.dropped == stats.arrived
        assert 0 <= stats.late <= stats.finished
    assert not sim.pool and not sim.run_queue and sim.n_running.sum() == 0
    # SLA dollars are exactly the per-class penalties
    pen = tiny.cost.sla_usd
    expect = sum(s.violations * p for s, p in zip(sim.stats.classes, pen, strict=True))
    assert sim.stats.sla_usd == pytest.approx(expect)


def test_a_fleet_too_small_violates_latency_critical_work_and_says_which_class():
    cfg = load_scenario("tiny", {"utilization": 1.4, "fleet": {"n_servers": 3}})
    sim = ScenarioSim(cfg)
    _play(sim, 1.0, sim.fleet_cores, 3)
    lc, batch = sim.stats.classes
    assert lc.violations > 0 and lc.violation_rate > 0.05
    summary = sim.stats.summary()
    assert summary["violations_lc"] == lc.violations
    assert summary["sla_lc"] == pytest.approx(lc.violation_rate)


class _AuditedSim(ScenarioSim):
    """Records the power state and usage right after the power moves of every tick."""

    def _power_moves(self):
        before = self.state.copy()
        joules = super()._power_moves()
        self.audit.append((before, self.state.copy(), self.used.copy(), joules))
        return joules


@pytest.mark.parametrize("reserve", [0.0, 32.0])
def test_energy_is_the_integral_of_per_state_power_plus_every_transition(reserve):
    cfg = load_scenario("tiny", {"executor": {"off_after_min": 0.0,
                                              "lc_reserve_cores": reserve}})
    sim = _AuditedSim(cfg)
    sim.audit = []
    sim.reset(7)
    rng = np.random.default_rng(0)
    while not sim.done:  # random controls make the servers go through every state
        if sim.t % cfg.decision_ticks == 0:
            sim.set_controls(rng.uniform(0, 1), rng.uniform(0, 1) * sim.fleet_cores)
        sim.tick()
    fleet = sim.fleet
    largest = max(t.cpu_cores for t in cfg.fleet.tiers)
    pw = cfg.power
    kwh, seen = 0.0, set()
    for before, state, used, _ in sim.audit:
        seen.update(state.tolist())
        util = np.minimum(used / (fleet.cpu_cap * largest), 1.0)
        watts = np.select(
            [state == ACTIVE, state == SUSPENDED, state == OFF,
             (state == RESUMING) | (state == BOOTING)],
            [fleet.p_idle + (fleet.p_max - fleet.p_idle) * util ** fleet.exponent,
             pw.suspended_fraction * fleet.p_idle, pw.off_fraction * fleet.p_idle,
             fleet.p_idle])
        # transitions of this tick, counted from the states alone
        # (with no hold-off, a server can be suspended and switched off in one tick)
        went_to_sleep = (before == ACTIVE) & ((state == SUSPENDED) | (state == OFF))
        went_off = ((before == SUSPENDED) | (before == ACTIVE)) & (state == OFF)
        joules = (pw.suspend_seconds * fleet.p_idle[went_to_sleep].sum()
                  + pw.shutdown_seconds * fleet.p_idle[went_off].sum())
        kwh += (watts.sum() * cfg.cost.pue * cfg.tick_seconds + joules) / 3.6e6
    assert {ACTIVE, SUSPENDED, OFF, BOOTING} <= seen
    assert sim.stats.energy_kwh == pytest.approx(kwh, rel=1e-12)
    assert sim.stats.transition_kwh > 0


def _queue(sim: ScenarioSim, jobs: list[tuple[int, float]]) -> list[int]:
    """Put jobs of (class, cores) into the run queue (reusing the episode's first jobs)."""
    ids = list(range(len(jobs)))
    for j, (cls, cores) in zip(ids, jobs, strict=True):
        sim._cls[j], sim._cores[j] = cls, cores
    sim.run_queue = list(ids)
    sim.queued_cores = float(sum(c for _, c in jobs))
    return ids


@pytest.mark.parametrize("reserve", [0.0, 24.0])
def test_batch_work_leaves_the_last_roomy_large_server_to_latency_critical_jobs(reserve):
    """With ``executor.lc_reserve_cores``, a batch job does not take the only server of the
    largest tier that still has that many free cores; a latency-critical job does. With the
    reserve at 0, placement is the plain best fit."""
    cfg = load_scenario("tiny", {"executor": {"lc_reserve_cores": reserve}})
    sim = ScenarioSim(cfg)
    sim.reset(0)
    sim.state[:] = ACTIVE
    sim.used[:] = sim.cores  # every server full ...
    large = int(np.flatnonzero(sim.cores == sim.cores.max())[0])
    small = int(np.flatnonzero(sim.cores < sim.cores.max())[0])
    sim.used[large] = sim.cores[large] - 30.0  # ... but one large server with 30 free
    sim.used[small] = sim.cores[small] - 10.0  # and a smaller one with 10
    batch, lc = _queue(sim, [(1, 8.0), (0, 28.0)])
    sim.run_queue = [batch]
    sim._place()
    assert sim._server[batch] == (small if reserve else large)
    sim.run_queue = [lc]
    sim._place()
    assert sim._server[lc] == large if reserve else sim._server[lc] == -1  # 22 free left


def test_a_reserve_beyond_the_largest_server_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="lc_reserve_cores 65 is more than"):
        load_scenario("tiny", {"executor": {"lc_reserve_cores": 65}})


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), reserve=st.floats(1.0, 64.0))
def test_with_a_reserve_every_job_still_ends_and_is_counted_once(seed, reserve):
    cfg = load_scenario("tiny", {"executor": {"lc_reserve_cores": reserve}})
    sim = ScenarioSim(cfg)
    _play(sim, 1.0, 0.5 * sim.fleet_cores, seed)
    for c, stats in enumerate(sim.stats.classes):
        assert stats.arrived == int((sim.jobs.cls == c).sum())
        assert stats.finished + stats.dropped == stats.arrived
    assert not sim.pool and not sim.run_queue and sim.n_running.sum() == 0


def test_cost_terms_add_up_and_grid_carbon_follows_the_signal(tiny):
    sim = ScenarioSim(tiny)
    res = run_episode(sim, RunAtOnce(), 11)
    m = res.metrics
    assert m["cost_usd"] == pytest.approx(m["energy_usd"] + m["carbon_usd"] + m["sla_usd"])
    assert m["grid_kwh"] == pytest.approx(m["energy_kwh"])  # no solar in tiny
    mean_c = m["carbon_kg"] / m["grid_kwh"] * 1000.0
    c = sim.signals.carbon_g_per_kwh[:sim.n_ticks]
    assert c.min() <= mean_c <= c.max()
    assert m["carbon_usd"] == pytest.approx(m["carbon_kg"] / 1000 * tiny.cost.carbon_usd_per_tonne)


def test_solar_offsets_the_grid_and_surplus_is_curtailed_or_exported():
    base = {"signals": {"solar_kwp": 40.0, "solar_source": "synthetic"}}
    sim = ScenarioSim(load_scenario("tiny", base))
    no_export = run_episode(sim, RunAtOnce(), 5).metrics
    assert no_export["grid_kwh"] < no_export["energy_kwh"]
    sold = load_scenario("tiny", {"signals": {**base["signals"],
                                              "export_price_usd_per_mwh": 30.0}})
    exported = run_episode(ScenarioSim(sold), RunAtOnce(), 5).metrics
    assert exported["export_kwh"] > 0
    assert exported["energy_usd"] == pytest.approx(
        no_export["energy_usd"] - exported["export_kwh"] * 30.0 / 1000.0, rel=1e-9)


def test_same_seed_same_episode_bit_for_bit(tiny):
    a = run_episode(ScenarioSim(tiny), SignalAwareDeferral(), 123).metrics
    b = run_episode(ScenarioSim(tiny), SignalAwareDeferral(), 123).metrics
    c = run_episode(ScenarioSim(tiny), SignalAwareDeferral(), 124).metrics
    assert a == b and a != c


def test_fluid_plan_runs_work_in_the_cheapest_period_it_may():
    # 3 periods, grid cost 3, 1, 2 $/kWh; 10 core-ticks available at once, due by the end
    plan = solve(FluidProblem(
        grid_usd_per_kwh=np.array([3.0, 1.0, 2.0]), export_usd_per_kwh=0.0,
        base_kwh=np.zeros(3), solar_kwh=np.zeros(3), room=np.array([10.0, 6.0, 10.0]),
        due=np.array([0.0, 0.0, 10.0]), avail=np.array([10.0, 10.0, 10.0]),
        kwh_per_core_tick=1.0, shortfall_usd_per_core_tick=100.0))
    assert plan.work == pytest.approx([0.0, 6.0, 4.0], abs=1e-7)
    assert plan.cost_usd == pytest.approx(6 * 1.0 + 4 * 2.0)
    # free solar in the dear period takes what it covers
    plan = solve(FluidProblem(
        grid_usd_per_kwh=np.array([3.0, 1.0]), export_usd_per_kwh=0.0,
        base_kwh=np.zeros(2), solar_kwh=np.array([4.0, 0.0]), room=np.array([10.0, 10.0]),
        due=np.array([0.0, 10.0]), avail=np.array([10.0, 10.0]),
        kwh_per_core_tick=1.0, shortfall_usd_per_core_tick=100.0))
    assert plan.work == pytest.approx([4.0, 6.0], abs=1e-7)


class _Recorder:
    """Wraps a controller and keeps the controls it chose."""

    def __init__(self, inner):
        self.inner, self.name, self.clairvoyant = inner, inner.name, inner.clairvoyant
        self.controls: list[tuple[float, float]] = []

    def reset(self, sim):
        self.inner.reset(sim)

    def decide(self, sim):
        out = self.inner.decide(sim)
        self.controls.append(out)
        return out


class _Replay:
    name, clairvoyant = "replay", False

    def __init__(self, controls):
        self.controls = list(controls)

    def reset(self, sim):
        self.i = 0

    def decide(self, sim):
        self.i += 1
        return self.controls[self.i - 1]


def test_the_oracle_schedule_replays_to_its_reported_cost(tiny):
    rec = _Recorder(ClairvoyantOracle())
    reported = run_episode(ScenarioSim(tiny), rec, 42).metrics
    replayed = run_episode(ScenarioSim(tiny), _Replay(rec.controls), 42).metrics
    assert replayed == reported
    assert rec.inner.plan is not None and rec.inner.plan.solve_s >= 0


def test_mpc_and_heuristic_are_online_and_beat_running_at_once_on_a_priced_grid():
    cfg = load_scenario("tiny", {"signals": {"price_daily_amplitude": 3.0,
                                             "forecast_error": 0.0}, "days": 1.0})
    sim = ScenarioSim(cfg)
    at_once = np.mean([run_episode(sim, RunAtOnce(), s).metrics["energy_usd"]
                       for s in (1, 2)])
    mpc = ForecastMPC()
    assert not mpc.clairvoyant and ClairvoyantOracle.clairvoyant
    planned = np.mean([run_episode(sim, mpc, s).metrics["energy_usd"] for s in (1, 2)])
    assert mpc.solve_times and planned < at_once


def test_every_catalog_scenario_is_in_the_docs_table():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs/concepts/scenarios.md").read_text()
    for name in scenario_names():
        assert f"| `{name}` |" in doc, name


def test_hindsight_mpc_plans_on_the_true_signals(tiny):
    from cloudrl.mpc.hindsight import hindsight_view
    from envs.scenario.control import plan_view

    sim = ScenarioSim(tiny)
    sim.reset(3)
    for _ in range(5):
        sim.tick()
    v, h = plan_view(sim), hindsight_view(sim)
    n = len(h.price_fc)
    truth = sim.signals.price_usd_per_mwh[sim.t + 1:sim.t + 1 + n]
    assert np.allclose(h.price_fc[:len(truth)], truth)
    assert not np.allclose(v.price_fc[:len(truth)], truth)  # tiny's forecasts have error
    assert np.array_equal(h.load_fc, v.load_fc)  # arrivals stay forecast
