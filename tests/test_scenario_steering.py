"""Preferences steer the scenario policies: hidden utilities, label noise, the Bradley-Terry
reward model and the ``cloudrl scenarios steer`` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl import cli
from cloudrl.scenarios.steering import (
    FEATURES,
    Comparisons,
    SteerConfig,
    green_wear,
    lc_guard,
    learn_reward,
    sample_comparisons,
)


def _metrics(**kw: float) -> dict[str, float]:
    m = {f: 0.0 for f in FEATURES}
    m.update(kw)
    return m


def test_lc_guard_is_cost_plus_50_dollars_per_hundredth_point_above_threshold():
    below = _metrics(cost_usd=40.0, sla_lc=0.0002)
    assert lc_guard(below) == pytest.approx(40.0)
    at = _metrics(cost_usd=40.0, sla_lc=0.0003)
    assert lc_guard(at) == pytest.approx(40.0)
    above = _metrics(cost_usd=40.0, sla_lc=0.0008)  # 0.05 pp above: 5 steps of $50
    assert lc_guard(above) == pytest.approx(40.0 + 250.0)


def test_green_wear_weights_carbon_4x_and_charges_each_transition():
    m = _metrics(cost_usd=999.0, energy_usd=20.0, sla_usd=10.0, carbon_usd=5.0,
                 transitions=1000.0)
    assert green_wear(m) == pytest.approx(20.0 + 10.0 + 4 * 5.0 + 0.03 * 1000.0)


@settings(max_examples=40, deadline=None)
@given(cost=st.floats(0, 1e3), lc=st.floats(0, 0.01), extra=st.floats(0, 0.01))
def test_lc_guard_never_below_cost_and_monotone_in_the_violation_rate(cost, lc, extra):
    a = lc_guard(_metrics(cost_usd=cost, sla_lc=lc))
    b = lc_guard(_metrics(cost_usd=cost, sla_lc=lc + extra))
    assert cost <= a + 1e-9 and a <= b + 1e-9


def test_label_noise_flips_about_the_asked_share_and_only_those():
    rng = np.random.default_rng(0)
    u = rng.normal(size=200)
    comp = sample_comparisons(u, 1000, 0.1, np.random.default_rng(3))
    assert (comp.a != comp.b).all()
    assert 0.07 < comp.flipped.mean() < 0.13
    assert ((comp.label != comp.true_label) == comp.flipped).all()
    # the true label prefers the lower hidden cost
    assert (comp.true_label == (u[comp.a] < u[comp.b])).all()
    again = sample_comparisons(u, 1000, 0.1, np.random.default_rng(3))
    assert (again.label == comp.label).all()  # seeded
    clean = sample_comparisons(u, 300, 0.0, np.random.default_rng(1))
    assert not clean.flipped.any()


def test_reward_model_recovers_a_known_linear_utility_from_noisy_comparisons():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(150, len(FEATURES))) * rng.uniform(0.5, 20, len(FEATURES))
    w = rng.normal(size=len(FEATURES)) / feats.std(0)
    hidden_cost = feats @ w
    comp = sample_comparisons(hidden_cost, 1000, 0.1, np.random.default_rng(1))
    model, info = learn_reward(feats, comp, seed=0, steps=300)
    assert info["heldout_acc_true"] > 0.9
    assert 0.75 < info["heldout_acc_noisy"] < 0.97
    # the ordering over all episodes: score falls as the hidden cost rises
    score = model.score(feats)
    i, j = np.triu_indices(len(feats), 1)
    agree = np.mean(np.sign(score[i] - score[j]) == np.sign(hidden_cost[j] - hidden_cost[i]))
    assert agree > 0.9
    assert isinstance(comp, Comparisons)


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="utility"):
        SteerConfig(utility="cheap")
    with pytest.raises(ValueError, match="comparisons"):
        SteerConfig(n_comparisons=5000)
    with pytest.raises(ValueError, match="noise"):
        SteerConfig(noise=0.7)


@pytest.mark.parametrize("argv", [
    ["--utility", "nope"],
    ["--utility", "lc_guard", "--comparisons", "1001"],
    ["--utility", "lc_guard", "--noise", "0.9"],
    ["--utility", "lc_guard", "--n-test-seeds", "0"],
    ["--utility", "lc_guard", "--comparisons", "many"],
])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    try:
        code = cli.main(["scenarios", "steer", "--scenario", "tiny", *argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1


def test_unknown_scenario_exits_2(capsys):
    assert cli.main(["scenarios", "steer", "--scenario", "no_such", "--utility",
                     "lc_guard"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_steer_runs_on_tiny(tmp_path, capsys):
    out = tmp_path / "steer.json"
    code = cli.main(["scenarios", "steer", "--scenario", "tiny", "--utility", "green_wear",
                     "--comparisons", "40", "--pool-heuristic", "3", "--pool-mpc", "1",
                     "--pool-seeds", "1", "--tune-heuristic", "3", "--tune-mpc", "1",
                     "--tune-seeds", "1", "--n-test-seeds", "2", "--run-seed", "0",
                     "--workers", "1", "--cache", str(tmp_path / "cache.json"),
                     "--json", str(out)])
    assert code == 0
    assert "gap closed" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    policies = {r["policy"] for r in doc["rows"]}
    assert {"default-tuned", "hidden-tuned", "steered (run 0)"} <= policies
    assert doc["reward_models"][0]["n_train"] == 32
    assert (tmp_path / "cache.json").exists()
