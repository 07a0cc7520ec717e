"""Distilling the forecast MPC into a learned scenario policy, on the ``tiny`` scenario:
the action mapping, behaviour cloning, checkpoints and the CLI's error paths."""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.algorithms.distill.actions import (
    RoundedController,
    action_controls,
    nearest_action,
)
from cloudrl.algorithms.distill.data import collect
from cloudrl.algorithms.distill.learner import evaluate_loss, fit
from cloudrl.algorithms.distill.policy import (
    LearnedController,
    build_module,
    load_checkpoint,
    load_controller,
    save_checkpoint,
)
from cloudrl.cli import main
from cloudrl.mpc.forecast_mpc import ForecastMPC
from envs.scenario.catalog import load_scenario
from envs.scenario.control import plan_view, run_episode
from envs.scenario.env import READY_MARGINS, RELEASE_LEVELS, ScenarioEnv
from envs.scenario.sim import ScenarioSim

ACTIONS = [(i, j) for i in range(len(RELEASE_LEVELS)) for j in range(len(READY_MARGINS))]


@cache
def _views():
    """Plan views of a tiny episode at a few decision points (run at once)."""
    sim = ScenarioSim(load_scenario("tiny"))
    sim.reset(3)
    views = []
    while not sim.done:
        if sim.t % (10 * sim.cfg.decision_ticks) == 0:
            views.append(plan_view(sim))
        sim.tick()
    return views


@cache
def _expert_demos():
    sim = ScenarioSim(load_scenario("tiny"))
    return collect(sim, ForecastMPC(), [0])


def test_every_action_round_trips_through_its_controls():
    for v in _views():
        for a in ACTIONS:
            ctrl = action_controls(v, a)
            back = nearest_action(v, *ctrl)
            assert back[0] == a[0]
            # margins whose ready cores coincide (clipped at the fleet) are the same action
            assert action_controls(v, back) == pytest.approx(ctrl)


@settings(max_examples=60, deadline=None)
@given(k=st.integers(0, 1000), release=st.floats(-0.5, 2.0), ready=st.floats(0.0, 500.0))
def test_nearest_action_has_no_strictly_nearer_action(k, release, ready):
    v = _views()[k % len(_views())]
    i, j = nearest_action(v, release, ready)
    r_best, c_best = action_controls(v, (i, j))
    for a in ACTIONS:
        r, c = action_controls(v, a)
        assert abs(r_best - release) <= abs(r - release) + 1e-12
        assert abs(c_best - ready) <= abs(c - ready) + 1e-9


def test_env_plays_the_same_controls_as_the_mapping():
    """The env's action (i, j) and :func:`action_controls` set identical controls."""
    env = ScenarioEnv({"scenario": "tiny"})
    env.reset(seed=1)
    v = plan_view(env.sim)
    env.step(np.array([4, 2]))
    assert (env.sim.release_util, env.sim.ready_cores) == pytest.approx(
        action_controls(v, (4, 2)))


def test_rounded_mpc_plays_only_env_actions():
    sim = ScenarioSim(load_scenario("tiny"))
    ctrl = RoundedController(ForecastMPC())
    sim.reset(2)
    ctrl.reset(sim)
    for _ in range(5):
        v = plan_view(sim)
        out = ctrl.decide(sim)
        assert any(action_controls(v, a) == pytest.approx(out) for a in ACTIONS)
        for _ in range(sim.cfg.decision_ticks):
            sim.tick()
    assert len(ctrl.solve_times) == 5


def test_short_bc_run_lowers_the_imitation_loss():
    demos = _expert_demos()
    assert len(demos) > 50 and demos.obs.shape[1] == 34
    torch.manual_seed(0)
    module = build_module((64, 64))
    before = evaluate_loss(module, demos.obs, demos.actions)
    fit(module, demos.obs, demos.actions, epochs=40, batch_size=64, lr=3e-3,
        weight_decay=0.0, seed=0)
    after = evaluate_loss(module, demos.obs, demos.actions)
    # untrained: ~ln 6 + ln 4 = 3.18 nats; fitted well below
    assert before > 3.0
    assert after < 0.7 * before


def test_checkpoint_plays_like_the_in_process_module(tmp_path):
    demos = _expert_demos()
    torch.manual_seed(1)
    module = build_module((32,))
    fit(module, demos.obs, demos.actions, epochs=5, batch_size=64, lr=3e-3,
        weight_decay=0.0, seed=1)
    save_checkpoint(module, tmp_path / "ck", (32,), {"scenario": "tiny"})
    size = sum(p.stat().st_size for p in (tmp_path / "ck").iterdir())
    assert size < 300_000
    sim = ScenarioSim(load_scenario("tiny"))
    threads = torch.get_num_threads()
    live = run_episode(sim, LearnedController(module), 500_001)
    loaded = run_episode(sim, load_controller(tmp_path / "ck"), 500_001)
    assert torch.get_num_threads() == threads  # the one-thread forward restores the setting
    assert loaded.metrics == live.metrics
    assert loaded.decisions == live.decisions > 0
    _, spec = load_checkpoint(tmp_path / "ck")
    assert spec["scenario"] == "tiny" and spec["model_config"]["hiddens"] == [32]


@pytest.mark.slow
def test_distill_cli_writes_a_checkpoint_that_evaluate_plays(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["scenarios", "distill", "--scenario", "tiny", "--run-seed", "1", "--out",
               str(out), "--expert-seeds", "1", "--dagger-rounds", "1", "--dagger-seeds", "1",
               "--val-seeds", "1"])
    assert rc == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seeds"]["expert_train"] == [0]
    assert len(manifest["seeds"]["dagger_train"]) == 1
    assert 1 <= manifest["seeds"]["dagger_train"][0] < 50
    assert manifest["seeds"]["validation"] == [500_000] and manifest["seeds"]["test"] == []
    assert manifest["best_round"] in (0, 1) and len(manifest["rounds"]) == 2
    assert manifest["wall_s"] > 0 and manifest["machine"]["cpus"] >= 1
    capsys.readouterr()
    rc = main(["scenarios", "evaluate", "--scenario", "tiny", "--policy", "signal_aware",
               "--checkpoint", str(out), "--split", "validation", "--n-seeds", "2",
               "--workers", "1", "--json", str(tmp_path / "ev.json")])
    assert rc == 0
    text = capsys.readouterr().out
    assert "learned - signal_aware" in text
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert len(ev["policies"]["learned"]["per_seed"]) == 2
    assert ev["comparisons"][0]["vs"] == "signal_aware"


@pytest.mark.parametrize("argv, needle", [
    (["scenarios", "distill", "--scenario", "nowhere", "--out", "{tmp}/x"], "nowhere"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--checkpoint", "{tmp}/missing"],
     "missing"),
    (["scenarios", "distill", "--scenario", "tiny", "--out", "{tmp}/x", "--mpc-params",
      '{"max_util": 7}'], "max_util"),
    (["scenarios", "distill", "--scenario", "tiny", "--out", "{tmp}/x", "--expert-seeds",
      "0"], "n_expert_seeds"),
    (["scenarios", "distill", "--scenario", "tiny", "--out", "{tmp}/x", "--init-checkpoint",
      "{tmp}/nostart"], "nostart"),
    (["scenarios", "distill", "--scenario", "tiny", "--out", "{tmp}/x", "--n-servers", "0"],
     "--n-servers 0"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and needle in err
    assert not (tmp_path / "x").exists()


def test_checkpoint_without_weights_is_an_error(tmp_path, capsys):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "policy.json").write_text("{}")
    rc = main(["scenarios", "evaluate", "--scenario", "tiny", "--checkpoint",
               str(tmp_path / "ck")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "policy.pt" in err


def test_a_fine_tune_starts_from_its_checkpoint_and_keeps_it_when_nothing_beats_it(tmp_path):
    """init_checkpoint: the start competes as round -1; under a constant objective every
    round ties and the earliest, the start itself, is kept (weights unchanged)."""
    from cloudrl.algorithms.distill.algorithm import distill
    from cloudrl.algorithms.distill.config import DistillConfig

    torch.manual_seed(0)
    start = build_module((16,))
    save_checkpoint(start, tmp_path / "start", (16,), {"scenario": "tiny"})
    cfg = DistillConfig(hiddens=(16,), init_checkpoint=str(tmp_path / "start"),
                        n_expert_seeds=1, dagger_rounds=1, dagger_seeds_per_round=1,
                        n_val_seeds=1, bc_epochs=2, round_epochs=1)
    seen = []

    def objective(m):
        seen.append(m)
        return 0.0

    res = distill(load_scenario("tiny"), cfg, log=lambda _: None, objective=objective)
    assert [r["round"] for r in res.rounds] == [-1, 0, 1]
    assert res.best_round == -1 and len(seen) == 3 and "transitions" in seen[0]
    kept = res.module.state_dict()
    for k, v in start.state_dict().items():
        assert torch.equal(kept[k], v)
    # a real objective moves it: the cost keeps a trained round whenever one is cheaper
    res2 = distill(load_scenario("tiny"), cfg, log=lambda _: None)
    costs = [r["val_cost"] for r in res2.rounds]
    assert res2.best_round == res2.rounds[int(np.argmin(costs))]["round"]


def test_a_fine_tune_refuses_other_hidden_sizes(tmp_path):
    from cloudrl.algorithms.distill.algorithm import distill
    from cloudrl.algorithms.distill.config import DistillConfig

    save_checkpoint(build_module((16,)), tmp_path / "start", (16,), {"scenario": "tiny"})
    cfg = DistillConfig(hiddens=(32,), init_checkpoint=str(tmp_path / "start"),
                        n_expert_seeds=1, dagger_rounds=0, n_val_seeds=1, bc_epochs=1)
    with pytest.raises(ValueError, match="hidden sizes"):
        distill(load_scenario("tiny"), cfg, log=lambda _: None)


def test_the_teacher_is_the_mpc_or_the_signal_aware_rule_never_both():
    from cloudrl.algorithms.distill.algorithm import expert_meta, teacher
    from cloudrl.algorithms.distill.config import DistillConfig
    from cloudrl.heuristics.signal_aware import SignalAwareDeferral

    assert isinstance(teacher(DistillConfig()), ForecastMPC)
    rule = DistillConfig(heuristic_params={"quantile": 0.4})
    assert isinstance(teacher(rule), SignalAwareDeferral)
    assert teacher(rule).config.quantile == 0.4
    tiny = load_scenario("tiny")
    assert expert_meta(tiny, rule) != expert_meta(tiny, DistillConfig())  # no shared cache
    with pytest.raises(ValueError, match="one teacher"):
        DistillConfig(heuristic_params={"quantile": 0.4}, mpc_params={"max_util": 0.7})


@pytest.mark.parametrize("grids", ["release", "ready", "both"])
def test_a_policy_on_its_own_grids_round_trips_and_serves_as_it_plays(tmp_path, grids):
    """A checkpoint on finer grids: their sizes as action branches, the grids in policy.json,
    the loaded controller playing exactly as the in-process one with only grid releases,
    and the served path deciding the same controls from the view."""
    from cloudrl.algorithms.distill.actions import FINE_READY_MARGINS, FINE_RELEASE_LEVELS
    from cloudrl.algorithms.distill.policy import load_served_controller, observed_view

    rel = FINE_RELEASE_LEVELS if grids in ("release", "both") else RELEASE_LEVELS
    rdy = FINE_READY_MARGINS if grids in ("ready", "both") else READY_MARGINS
    torch.manual_seed(3)
    module = build_module((16,), len(rel), len(rdy))
    save_checkpoint(module, tmp_path / "fine", (16,), {"scenario": "tiny"}, rel, rdy)
    spec = json.loads((tmp_path / "fine" / "policy.json").read_text())
    assert spec["action_nvec"] == [len(rel), len(rdy)]
    assert spec.get("release_levels", list(RELEASE_LEVELS)) == list(rel)
    assert spec.get("ready_margins", list(READY_MARGINS)) == list(rdy)
    assert ("release_levels" in spec) == (grids != "ready")  # the env's grid: not written
    sim = ScenarioSim(load_scenario("tiny"))
    live = run_episode(sim, LearnedController(module, release_levels=rel, ready_margins=rdy), 7)
    loaded = load_controller(tmp_path / "fine")
    assert (loaded.release_levels, loaded.ready_margins) == (rel, rdy)
    assert run_episode(sim, loaded, 7).metrics == live.metrics
    served = load_served_controller(tmp_path / "fine")
    served.reset(ScenarioSim(load_scenario("tiny")))
    sim.reset(8)
    loaded.reset(sim)
    while not sim.done:
        if sim.t % sim.cfg.decision_ticks == 0:
            want = loaded.decide(sim)
            assert want[0] in rel
            assert served.decide_view(observed_view(sim)) == want
            sim.set_controls(*want)
        sim.tick()
    with pytest.raises(ValueError, match="release and ready actions"):
        LearnedController(module, release_levels=(0.0, 1.0))  # grids of other sizes


@settings(max_examples=40, deadline=None)
@given(k=st.integers(0, 1000), release=st.floats(-0.5, 2.0), ready=st.floats(0.0, 500.0))
def test_nearest_action_on_the_fine_grid_has_no_strictly_nearer_action(k, release, ready):
    from cloudrl.algorithms.distill.actions import FINE_RELEASE_LEVELS

    v = _views()[k % len(_views())]
    i, j = nearest_action(v, release, ready, FINE_RELEASE_LEVELS)
    r_best, c_best = action_controls(v, (i, j), FINE_RELEASE_LEVELS)
    for a in range(len(FINE_RELEASE_LEVELS)):
        for b in range(len(READY_MARGINS)):
            r, c = action_controls(v, (a, b), FINE_RELEASE_LEVELS)
            assert abs(r_best - release) <= abs(r - release) + 1e-12
            assert abs(c_best - ready) <= abs(c - ready) + 1e-9


def test_release_levels_must_be_an_increasing_grid():
    from cloudrl.algorithms.distill.config import DistillConfig

    for bad in ((0.5,), (0.3, 0.3), (0.0, 2.0), (0.6, 0.2)):
        with pytest.raises(ValueError, match="release_levels"):
            DistillConfig(release_levels=bad)
    assert DistillConfig(release_levels=(0, 1)).levels == (0.0, 1.0)
    for bad in ((0.5,), (0.3, 0.3), (-2.0, 0.0), (1.0, 0.5)):
        with pytest.raises(ValueError, match="ready_margins"):
            DistillConfig(ready_margins=bad)
    assert DistillConfig(ready_margins=(-0.5, 1)).margins == (-0.5, 1.0)
    assert DistillConfig().margins == READY_MARGINS


def test_a_fine_tune_keeps_its_starts_grids_and_refuses_others(tmp_path, capsys):
    """fine_tune_fields reads the start's hidden sizes and grids; asking the CLI for another
    grid than the start's is one line and exit 2 before anything is trained."""
    from cloudrl.algorithms.distill.actions import FINE_READY_MARGINS
    from cloudrl.algorithms.distill.policy import fine_tune_fields

    save_checkpoint(build_module((16,), n_ready=len(FINE_READY_MARGINS)), tmp_path / "start",
                    (16,), {"scenario": "tiny"}, ready_margins=FINE_READY_MARGINS)
    fields = fine_tune_fields(tmp_path / "start")
    assert fields == {"init_checkpoint": str(tmp_path / "start"), "hiddens": (16,),
                      "release_levels": None, "ready_margins": FINE_READY_MARGINS}
    rc = main(["scenarios", "distill", "--scenario", "tiny", "--out", str(tmp_path / "x"),
               "--init-checkpoint", str(tmp_path / "start"), "--fine-release"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--fine-release" in err
    assert not (tmp_path / "x").exists()


def test_the_sim_mpc_teacher_is_imitated_on_its_own_menu():
    """With ``sim_mpc_params`` the teacher is the plant-true sim-MPC; on the fine grids (its
    own menu) the rounded teacher plays exactly the sim-MPC's episode, and a bad knob or
    two teachers are refused."""
    from cloudrl.algorithms.distill.actions import FINE_READY_MARGINS, FINE_RELEASE_LEVELS
    from cloudrl.algorithms.distill.algorithm import teacher
    from cloudrl.algorithms.distill.config import DistillConfig
    from cloudrl.algorithms.distill.data import collect
    from cloudrl.mpc.sim_mpc import SimMPC, SimMPCConfig
    from envs.scenario.catalog import load_scenario
    from envs.scenario.control import run_episode
    from envs.scenario.sim import ScenarioSim

    knobs = {"samples": 1, "horizon": 4, "block_periods": 2, "iterations": 1,
             "population": 4, "elites": 2, "replan_periods": 2}
    cfg = DistillConfig(sim_mpc_params=knobs, release_levels=FINE_RELEASE_LEVELS,
                        ready_margins=FINE_READY_MARGINS)
    t = teacher(cfg)
    assert isinstance(t, SimMPC) and t.config.horizon == 4
    sim = ScenarioSim(load_scenario("tiny"))
    demos = collect(sim, t, [3], release_levels=cfg.levels, ready_margins=cfg.margins)
    direct = run_episode(ScenarioSim(load_scenario("tiny")),
                         SimMPC(SimMPCConfig(**knobs)), 3).metrics["cost_usd"]
    assert demos.episode_costs[3] == pytest.approx(direct, rel=1e-9)
    assert len(demos) > 0
    with pytest.raises(ValueError, match="population"):
        DistillConfig(sim_mpc_params={**knobs, "elites": 9})
    with pytest.raises(ValueError, match="one teacher"):
        DistillConfig(sim_mpc_params=knobs, heuristic_params={})


@pytest.mark.parametrize("args, needle", [
    (["--sim-mpc-params", "{}"], "--sim-mpc-params needs --teacher sim_mpc"),
    (["--teacher", "sim_mpc", "--sim-mpc-params", '{"samples": 0}'], "samples"),
    (["--teacher", "sim_mpc", "--sim-mpc-params", "{oops"], "distill"),
])
def test_bad_sim_mpc_teacher_flags_are_one_line_and_exit_2(tmp_path, args, needle):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "cloudrl", "scenarios", "distill", "--scenario",
                          "tiny", "--out", str(tmp_path / "ck"), *args], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and needle in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ck").exists()
