"""The deadline-aware rule (signal-aware deferral plus release by deadline) and the equal
action menus of the baselines' tuning."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.heuristics.deadline_aware import (
    DeadlineAwareConfig,
    DeadlineAwareDeferral,
    due_mask,
)
from cloudrl.heuristics.signal_aware import SignalAwareConfig, SignalAwareDeferral
from cloudrl.mpc.forecast_mpc import MPCConfig
from cloudrl.protocol import validation_seeds
from cloudrl.scenarios.runner import ControllerSpec, run_controllers
from cloudrl.scenarios.tuning import MENUS, search_points
from envs.scenario.catalog import load_scenario
from envs.scenario.control import plan_view
from envs.scenario.sim import ScenarioSim

BASE = {"quantile": 0.5, "window_hours": 12.0, "release_util": 0.8, "ready_margin": 0.3,
        "guard_hours": 2.0}


def _views(name: str, seed: int, every: int = 7):
    """Plan views along an episode the signal-aware rule plays."""
    sim = ScenarioSim(load_scenario(name))
    sim.reset(seed)
    rule = SignalAwareDeferral(SignalAwareConfig(**BASE))
    rule.reset(sim)
    d, out = sim.cfg.decision_ticks, []
    while not sim.done:
        if sim.t % d == 0:
            sim.set_controls(*rule.decide(sim))
            if (sim.t // d) % every == 0:
                out.append(plan_view(sim))
        sim.tick()
    return sim, out


def test_with_zero_guards_it_plays_as_the_signal_aware_rule():
    cfg = load_scenario("scarcity_spikes")
    seeds = list(validation_seeds(2))
    sig, dl = run_controllers(cfg, [ControllerSpec("signal_aware", BASE),
                                    ControllerSpec("deadline_aware",
                                                   {**BASE, "slack_k": 0.0, "wait_factor": 0.0})],
                              seeds, workers=1)
    assert [m["cost_usd"] for m in sig] == [m["cost_usd"] for m in dl]


def test_it_releases_at_least_what_the_rule_releases_and_covers_the_due_jobs():
    sim, views = _views("scarcity_spikes", int(validation_seeds(1)[0]))
    rule = SignalAwareDeferral(SignalAwareConfig(**BASE))
    guard = DeadlineAwareDeferral(DeadlineAwareConfig(**BASE, slack_k=1.5, wait_factor=1.0))
    rule.reset(sim)
    guard.reset(sim)
    n_due = 0
    for v in views:
        r_rel, r_ready = rule.decide_view(v)
        g_rel, g_ready = guard.decide_view(v)
        assert g_rel >= r_rel and g_ready == r_ready
        due = due_mask(v, 1.5, 1.0)
        if due.any():
            n_due += 1
            committed = float(v.running[:, 0].sum()) + float(sum(v.queued))
            assert g_rel * v.fleet_cores >= committed + v.pool_cores[due].sum() - 1e-9
    assert n_due > 0  # the episode had due work, so the guard was exercised


@settings(max_examples=30, deadline=None)
@given(k1=st.floats(0, 5), k2=st.floats(0, 5), w=st.floats(0, 5))
def test_a_larger_guard_makes_more_jobs_due(k1, k2, w):
    _, views = _views("tiny", 3, every=3)
    lo, hi = sorted((k1, k2))
    for v in views:
        assert not (due_mask(v, lo, w) & ~due_mask(v, hi, w)).any()
        assert not (due_mask(v, lo, 0.0) & ~due_mask(v, lo, w)).any()


def test_the_guard_cuts_batch_violations_on_a_scarce_market():
    """A generous guard misses fewer batch deadlines than the rule it extends."""
    cfg = load_scenario("scarcity_spikes")
    seeds = list(validation_seeds(4))
    sig, dl = run_controllers(cfg, [ControllerSpec("signal_aware", BASE),
                                    ControllerSpec("deadline_aware",
                                                   {**BASE, "slack_k": 2.0, "wait_factor": 2.0})],
                              seeds, workers=1)
    assert sum(m["sla_batch"] for m in dl) < sum(m["sla_batch"] for m in sig)


@pytest.mark.parametrize(("field", "value"), [("slack_k", -0.1), ("wait_factor", 21.0),
                                              ("ready_margin", -0.51)])
def test_bad_knobs_are_refused_naming_them(field, value):
    with pytest.raises(ValueError, match=field):
        DeadlineAwareConfig(**{field: value})


def test_every_controller_takes_the_learned_policys_lowest_margin():
    SignalAwareConfig(ready_margin=-0.5)
    DeadlineAwareConfig(ready_margin=-0.5)
    MPCConfig(ready_hedge=-0.5)
    with pytest.raises(ValueError, match="ready_hedge"):
        MPCConfig(ready_hedge=-0.6)


@pytest.mark.parametrize("kind", ["signal_aware", "deadline_aware", "mpc"])
def test_menus_bound_the_searched_margins(kind):
    key = "ready_hedge" if kind == "mpc" else "ready_margin"
    for menu, (lo, hi) in MENUS.items():
        points = search_points(kind, 200, seed=4, menu=menu)[1:]
        margins = np.array([p[key] for p in points if p.get("quantile") != 1.0])
        assert lo <= margins.min() and margins.max() <= hi
        if menu == "wide":
            assert margins.min() < 0  # the learned policy's negative margins are searched
    assert search_points(kind, 1) == search_points(kind, 1, menu="wide")  # the defaults


def test_the_narrow_menu_draws_the_historical_points():
    """Published tunings stay reproducible: the narrow menu draws what the search drew
    before menus existed (same generator calls, same order)."""
    rng = np.random.default_rng(7)
    old = [{"quantile": float(rng.uniform(0.05, 0.7)),
            "window_hours": float(rng.choice([3.0, 6.0, 12.0, 18.0, 24.0])),
            "release_util": float(rng.uniform(0.5, 1.0)),
            "ready_margin": float(rng.uniform(0.0, 0.6)),
            "guard_hours": float(rng.choice([0.0, 1.0, 2.0, 4.0]))} for _ in range(5)]
    assert search_points("signal_aware", 6, seed=7)[1:6] == old
    with pytest.raises(ValueError, match="menu"):
        search_points("signal_aware", 3, menu="huge")
