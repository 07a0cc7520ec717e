"""Preferences steer the scenario policies: hidden utilities, label noise, the Bradley-Terry
reward model and the ``cloudrl scenarios steer`` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl import cli
from cloudrl.scenarios.runner import ControllerSpec
from cloudrl.scenarios.steering import (
    FEATURES,
    Comparisons,
    EpisodeCache,
    SteerConfig,
    features,
    green_wear,
    lc_guard,
    learn_reward,
    sample_comparisons,
    sla_first,
    steer_mpc_space,
    tune_search,
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
    with pytest.raises(ValueError, match="--learned-es-params 'last'"):
        SteerConfig(learned_es_params="last")


@pytest.mark.parametrize("argv", [
    ["--utility", "nope"],
    ["--utility", "lc_guard", "--comparisons", "1001"],
    ["--utility", "lc_guard", "--noise", "0.9"],
    ["--utility", "lc_guard", "--n-test-seeds", "0"],
    ["--utility", "lc_guard", "--comparisons", "many"],
    ["--utility", "lc_guard", "--learned-es-params", "last"],
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


def test_sla_first_weighs_sla_credits_ten_times_and_ignores_wear():
    m = _metrics(energy_usd=10.0, carbon_usd=2.0, sla_usd=3.0, cost_usd=15.0, transitions=999)
    assert sla_first(m) == pytest.approx(10.0 + 2.0 + 30.0)
    assert sla_first({**m, "transitions": 0.0}) == sla_first(m)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31))
def test_steer_mpc_space_adds_the_operator_weights_within_their_ranges(seed):
    p = steer_mpc_space(np.random.default_rng(seed))
    assert set(p) == {"max_util", "ready_hedge", "shortfall_factor", "carbon_weight"}
    assert 1.0 <= p["shortfall_factor"] <= 30.0 and 0.5 <= p["carbon_weight"] <= 8.0
    assert p == steer_mpc_space(np.random.default_rng(seed))


def test_mpc_carbon_weight_scales_only_the_carbon_part_of_the_planned_price(monkeypatch):
    """The plan prices a grid kWh at price + w * carbon * tariff: w=1 is the cost's own
    price (the default, unchanged), w=0 drops carbon, and the difference is linear in w."""
    import cloudrl.mpc.forecast_mpc as fm
    from envs.scenario.catalog import load_scenario
    from envs.scenario.sim import ScenarioSim

    seen = []
    real = fm.solve
    monkeypatch.setattr(fm, "solve", lambda p: seen.append(p) or real(p))
    scn = load_scenario("scarcity_spikes")
    grid = {}
    for w in (None, 0.0, 1.0, 3.0):
        sim = ScenarioSim(scn)
        sim.reset(3)
        mpc = fm.ForecastMPC(fm.MPCConfig() if w is None else fm.MPCConfig(carbon_weight=w))
        mpc.reset(sim)
        mpc.decide(sim)
        grid[w] = seen[-1].grid_usd_per_kwh
    np.testing.assert_array_equal(grid[None], grid[1.0])
    carbon = grid[1.0] - grid[0.0]
    assert carbon.min() > 0
    np.testing.assert_allclose(grid[3.0] - grid[0.0], 3 * carbon, rtol=1e-9)
    with pytest.raises(ValueError, match="carbon_weight"):
        fm.MPCConfig(carbon_weight=-1.0)


def test_tune_search_reports_each_run_seeds_learned_reward_and_replays_only_the_missing(
        ray_session, tmp_path):
    """One Tune trial per point; a cached episode is not replayed (its sentinel metrics come
    back), the rest are played and join the cache; every run seed's objective is its reward
    model's mean score of exactly those episodes."""
    from envs.scenario.catalog import load_scenario

    scn = load_scenario("tiny")
    specs = [ControllerSpec("signal_aware", {}), ControllerSpec("mpc", {"max_util": 0.7})]
    seeds = [100_001, 100_002]
    cache = EpisodeCache(tmp_path / "c.json")
    sentinel = {**_metrics(cost_usd=123.0, energy_usd=100.0, sla_usd=23.0), "jobs_lc": 1.0}
    cache.data[cache.key("tiny", specs[0], seeds[0])] = sentinel
    pool = np.random.default_rng(0).uniform(0, 10, (12, len(FEATURES)))
    u = pool[:, 0]
    models = {rs: learn_reward(pool, sample_comparisons(u, 60, 0.0, np.random.default_rng(rs)),
                               seed=rs)[0] for rs in (0, 5)}
    reps = tune_search(scn, specs, seeds, cache, models, "sla_first", workers=2)
    assert reps[0]["episodes"][0] == sentinel  # from the cache, not replayed
    assert reps[0]["episodes"][1]["cost_usd"] != 123.0
    for rep in reps:
        f = features(rep["episodes"])
        for rs, model in models.items():
            assert rep[f"learned_reward_run{rs}"] == pytest.approx(model.score(f).mean())
        assert rep["hidden_utility"] == pytest.approx(
            np.mean([sla_first(m) for m in rep["episodes"]]))
    reread = EpisodeCache(tmp_path / "c.json")
    assert reread.data[reread.key("tiny", specs[1], seeds[1])] == reps[1]["episodes"][1]


def test_learned_without_a_checkpoint_to_start_from_exits_2_before_anything_runs(
        tmp_path, capsys):
    code = cli.main(["scenarios", "steer", "--scenario", "tiny", "--utility", "sla_first",
                     "--learned", "--init-checkpoint", str(tmp_path / "none"),
                     "--cache", str(tmp_path / "c.json")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "none" in err
    assert not (tmp_path / "c.json").exists()


def test_steer_runs_on_tiny_with_the_learned_family(ray_session, tmp_path, capsys):
    import torch

    from cloudrl.algorithms.distill.policy import build_module, save_checkpoint

    torch.manual_seed(0)
    save_checkpoint(build_module((16,)), tmp_path / "start", (16,), {"scenario": "tiny"})
    out = tmp_path / "steer.json"
    code = cli.main(["scenarios", "steer", "--scenario", "tiny", "--utility", "green_wear",
                     "--comparisons", "40", "--pool-heuristic", "3", "--pool-mpc", "1",
                     "--pool-seeds", "1", "--tune-heuristic", "3", "--tune-mpc", "2",
                     "--tune-seeds", "1", "--n-test-seeds", "2", "--run-seed", "0",
                     "--workers", "1", "--cache", str(tmp_path / "cache.json"),
                     "--learned", "--init-checkpoint", str(tmp_path / "start"),
                     "--learned-out", str(tmp_path / "learned"), "--learned-expert-seeds",
                     "1", "--learned-rounds", "1", "--learned-round-seeds", "1",
                     "--learned-val-seeds", "1", "--json", str(out)])
    assert code == 0
    assert "gap closed" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    rows = {(r["family"], r["policy"]) for r in doc["rows"]}
    for fam in ("heuristic", "MPC", "learned"):
        assert {(fam, "default-tuned"), (fam, "hidden-tuned"), (fam, "steered (run 0)")} <= rows
    assert doc["reward_models"][0]["n_train"] == 32
    steered = doc["chosen"]["steered0/learned"]
    # the teacher: the steered point the learned reward scores higher on validation
    fams = {"signal_aware": doc["chosen"]["steered0/signal_aware"],
            "mpc": doc["chosen"]["steered0/mpc"]}
    assert steered["params"] == fams[steered["teacher"]]["params"]
    other = fams["mpc" if steered["teacher"] == "signal_aware" else "signal_aware"]
    assert fams[steered["teacher"]]["val_learned_reward"] >= other["val_learned_reward"]
    assert (tmp_path / "learned" / "tiny" / "green_wear" / "steered-run0" / "policy.pt").exists()
    assert doc["chosen"]["default/learned"]["checkpoint"] == str(tmp_path / "start")
    assert (tmp_path / "cache.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("es_params", ["head", "all"])
def test_steer_learned_by_evolution_strategies_on_the_learned_reward(ray_session, tmp_path,
                                                                    capsys, es_params):
    """--learned-method es: no teacher; each run seed's reward model scores the episodes
    of the search, the hidden-tuned reference searches on the hidden utility itself;
    --learned-es-params picks the weights searched, each in its own directory."""
    import torch

    from cloudrl.algorithms.distill.policy import build_module, save_checkpoint
    from cloudrl.protocol import validation_seeds
    from cloudrl.scenarios.runner import ControllerSpec, run_controllers
    from cloudrl.scenarios.steering import UTILITIES
    from envs.scenario.catalog import load_scenario

    torch.manual_seed(0)
    save_checkpoint(build_module((16,)), tmp_path / "start", (16,), {"scenario": "tiny"})
    out = tmp_path / "steer.json"
    code = cli.main(["scenarios", "steer", "--scenario", "tiny", "--utility", "sla_first",
                     "--comparisons", "40", "--pool-heuristic", "3", "--pool-mpc", "1",
                     "--pool-seeds", "1", "--tune-heuristic", "2", "--tune-mpc", "1",
                     "--tune-seeds", "1", "--n-test-seeds", "2", "--run-seed", "0",
                     "--workers", "1", "--cache", str(tmp_path / "cache.json"),
                     "--learned", "--learned-method", "es", "--learned-es-iterations", "1",
                     "--learned-es-params", es_params,
                     "--init-checkpoint", str(tmp_path / "start"),
                     "--learned-out", str(tmp_path / "learned"),
                     "--learned-val-seeds", "1", "--json", str(out)])
    assert code == 0
    assert "gap closed" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    rows = {(r["family"], r["policy"]) for r in doc["rows"]}
    assert {("learned", "default-tuned"), ("learned", "hidden-tuned"),
            ("learned", "steered (run 0)")} <= rows
    steered, hidden = doc["chosen"]["steered0/learned"], doc["chosen"]["hidden/learned"]
    assert steered["method"] == hidden["method"] == "es"
    assert steered["es_params"] == hidden["es_params"] == es_params
    assert steered["objective"] == "the learned reward"
    assert hidden["objective"] == "the hidden utility"
    root = tmp_path / "learned" / "tiny" / "sla_first" / ("es" if es_params == "head"
                                                           else "es-all")
    assert (root / "steered-run0" / "policy.pt").exists()
    for run in ("steered-run0", "hidden-run0"):
        manifest = json.loads((root / run / "manifest.json").read_text())
        assert manifest["config"]["params"] == es_params
    # the hidden reference's validation score is the hidden utility of its episodes
    start_val = hidden["history"][0]["val"]
    ms = run_controllers(load_scenario("tiny"), [ControllerSpec(
        "learned", {"checkpoint": str(tmp_path / "start")})], list(validation_seeds(1)), 1)[0]
    assert start_val == pytest.approx(UTILITIES["sla_first"](ms[0]))
