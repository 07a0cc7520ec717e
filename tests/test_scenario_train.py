"""RLlib training on a named scenario (``cloudrl train --scenario``, ``cloudrl sweep
--scenario``) and the controller that plays its checkpoints in the scenario runner.

One module-scoped run trains PPO, DQN (flat Discrete(24) env), BDQ (branching
MultiDiscrete([6, 4]) env) and the gated DQN (a preset of the signal-aware rule per
decision) on the ``tiny`` scenario for a few hundred env steps each,
through the env wrapper that gives the project's masked RLModules their Dict observation;
the tests read the checkpoints back. The command-line errors need no Ray. The scenario
sweep (Ray Tune, MLflow) is ``slow``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloudrl import cli
from cloudrl.protocol import validation_seeds

ALGOS = ("ppo", "dqn", "bdq", "gated_dqn")
TINY_HPARAMS: dict[str, dict[str, Any]] = {
    "ppo": {"train_batch_size_per_learner": 160, "minibatch_size": 40, "num_epochs": 1},
    "dqn": {"train_batch_size_per_learner": 32, "num_steps_sampled_before_learning_starts": 100,
            "target_network_update_freq": 50},
    "bdq": {"train_batch_size_per_learner": 32, "num_steps_sampled_before_learning_starts": 100,
            "target_network_update_freq": 50},
    "gated_dqn": {"train_batch_size_per_learner": 32,
                  "num_steps_sampled_before_learning_starts": 100,
                  "target_network_update_freq": 50},
}
INTERFACE = {"ppo": "flat", "dqn": "flat", "bdq": "branching", "gated_dqn": "gated"}
SEEDS = list(validation_seeds(2))


def _small_iterations(config: Any) -> None:
    """Iterations of ~100 env steps (DQN's default samples at least 1,000 per iteration)."""
    config.reporting(min_sample_timesteps_per_iteration=100)


@pytest.fixture(scope="module")
def trained(ray_session: None, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, tuple[Path, list[dict[str, float]]]]:
    from cloudrl.training import TrainConfig, train

    root = tmp_path_factory.mktemp("scenario_train")
    out = {}
    for algo in ALGOS:
        cfg = TrainConfig(algo=algo, scenario="tiny", env_steps=200, hidden=16,
                          envs_per_runner=2, hparams=TINY_HPARAMS[algo],
                          checkpoint_dir=str(root / algo))
        out[algo] = train(cfg, configure=_small_iterations)
    return out


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, (code, err)
    return err


# -- the command line: errors before any work ---------------------------------------------
def test_an_unknown_scenario_is_one_line_listing_the_valid_ones(
        capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["train", "--scenario", "nope", "--algo", "dqn"],
                 ["sweep", "--scenario", "nope"]):
        err = _one_line_error(capsys, argv)
        assert "unknown scenario 'nope'" in err and "scarcity_spikes" in err and "tiny" in err


def test_scenario_with_a_cluster_workload_is_an_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_error(capsys, ["train", "--scenario", "tiny", "--workload", "poisson"])
    assert "--workload" in err
    err = _one_line_error(capsys, ["sweep", "--scenario", "tiny", "--workloads", "poisson"])
    assert "--workloads" in err


def test_algorithms_without_a_scenario_module_and_bad_heuristic_params_are_errors(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_error(capsys, ["train", "--scenario", "tiny", "--algo", "appo"])
    assert "ppo, dqn, bdq" in err
    err = _one_line_error(capsys, ["sweep", "--scenario", "tiny", "--algos", "ppo", "appo"])
    assert "appo" in err
    err = _one_line_error(capsys, ["train", "--scenario", "tiny", "--heuristic-params",
                                   '{"quantile": 0.5, "bogus": 1}'])
    assert "bogus" in err
    err = _one_line_error(capsys, ["train", "--workload", "poisson", "--sla-weight", "3"])
    assert "--sla-weight goes with --scenario" in err
    err = _one_line_error(capsys, ["train", "--scenario", "tiny", "--algo", "gated_dqn",
                                   "--sla-weight", "500"])
    assert "sla_weight" in err and "500" in err


def test_timesteps_is_the_env_step_budget() -> None:
    args = cli.build_parser().parse_args(["train", "--scenario", "tiny", "--timesteps", "300"])
    assert args.env_steps == 300 and args.scenario == "tiny"


# -- pieces -------------------------------------------------------------------------------
def test_the_masked_env_gives_the_modules_their_dict_and_draws_train_seeds() -> None:
    from envs.scenario.env import MaskedScenarioEnv, ScenarioEnv

    for interface, mask in (("flat", 24), ("branching", 10)):
        env = MaskedScenarioEnv({"scenario": "tiny", "interface": interface,
                                 "seed_pool": [3, 4]})
        obs, info = env.reset(seed=123)
        assert env.observation_space.contains(obs) and info["seed"] in (3, 4)
        assert obs["action_mask"].shape == (mask,) and obs["action_mask"].all()
        plain, _ = ScenarioEnv({"scenario": "tiny"}).reset(seed=info["seed"])
        np.testing.assert_array_equal(obs["macro"], plain)
        again, info2 = MaskedScenarioEnv({"scenario": "tiny", "interface": interface,
                                          "seed_pool": [3, 4]}).reset(seed=123)
        assert info2 == info  # the pool draw follows the reset seed


def test_train_config_on_a_scenario() -> None:
    from cloudrl.training import SCENARIO_REWARD_SCALE, TrainConfig, checkpoint_path

    cfg = TrainConfig(algo="bdq", scenario="tiny", run_seed=2)
    env = cfg.train_env_config()
    assert env["interface"] == "branching" and env["reward_scale"] == SCENARIO_REWARD_SCALE
    assert env["seed_pool"] == list(range(50))
    assert TrainConfig(algo="dqn", scenario="tiny", reward_scale=0.1).train_env_config()[
        "reward_scale"] == 0.1
    assert TrainConfig(algo="dqn", scenario="tiny").interface() == "flat"
    assert checkpoint_path(cfg).name == "bdq_tiny_s2"
    assert cfg.threads().learner == 1 and TrainConfig().threads().learner == "auto"
    assert TrainConfig(algo="dqn", scenario="tiny", torch_threads={"learner": 2}
                       ).threads().learner == 2
    gated = TrainConfig(algo="gated_dqn", scenario="tiny", scenario_heuristic={"quantile": 0.4})
    env = gated.train_env_config()
    assert gated.interface() == env["interface"] == "gated"
    assert env["controller_config"]["heuristic"] == {"quantile": 0.4}
    assert env["controller_config"]["presets"][0] == {}  # preset 0: the rule itself
    with pytest.raises(ValueError, match="hparams.presets"):
        TrainConfig(algo="gated_dqn", scenario="tiny", hparams={"presets": [{}]})
    with pytest.raises(ValueError, match="heuristic.bogus"):
        TrainConfig(algo="gated_dqn", scenario="tiny", scenario_heuristic={"bogus": 1})
    with pytest.raises(ValueError, match="goes with scenario"):
        TrainConfig(algo="gated_dqn", scenario_heuristic={"quantile": 0.4})
    assert "sla_weight" not in env  # at 1 the env config is what earlier runs wrote
    safe = gated.model_copy(update={"scenario_sla_weight": 3.0}).train_env_config()
    assert safe == {**env, "sla_weight": 3.0}
    with pytest.raises(ValueError, match="scenario_sla_weight"):
        TrainConfig(algo="gated_dqn", scenario="tiny", scenario_sla_weight=101)
    with pytest.raises(ValueError, match="goes with scenario"):
        TrainConfig(algo="dqn", scenario_sla_weight=2.0)


def test_heuristic_params_take_the_forms_the_scenario_commands_write(tmp_path: Path) -> None:
    from cloudrl.scenarios.rl_policy import heuristic_params

    knobs = {"quantile": 0.5, "window_hours": 12.0}
    assert heuristic_params(None, "tiny") == {}
    assert heuristic_params(json.dumps(knobs), "tiny") == knobs
    assert heuristic_params(json.dumps({"signal_aware": knobs, "mpc": {}}), "tiny") == knobs
    headroom = tmp_path / "headroom.json"
    headroom.write_text(json.dumps({"scenarios": [{"name": "tiny", "heuristic_params": knobs}]}))
    assert heuristic_params(str(headroom), "tiny") == knobs
    with pytest.raises(ValueError, match="no row for scenario"):
        heuristic_params(str(headroom), "mixed")


def test_a_cluster_checkpoint_is_refused_by_name(tmp_path: Path) -> None:
    from cloudrl.checkpoint_policy import META_FILE, MODULE_SUBDIR
    from cloudrl.scenarios.rl_policy import RLCheckpointError, load_rl_controller

    (tmp_path / MODULE_SUBDIR).mkdir(parents=True)
    (tmp_path / META_FILE).write_text(json.dumps({"algo": "dqn", "interface": "flat"}))
    with pytest.raises(RLCheckpointError, match="not on a scenario"):
        load_rl_controller(tmp_path)
    with pytest.raises(RLCheckpointError, match="not a cloudrl checkpoint"):
        load_rl_controller(tmp_path / "missing")


# -- trained on tiny ----------------------------------------------------------------------
def test_each_algorithm_trains_and_writes_a_scenario_checkpoint(
        trained: dict[str, tuple[Path, list[dict[str, float]]]]) -> None:
    from cloudrl.checkpoint_policy import is_checkpoint, read_meta

    for algo, (path, history) in trained.items():
        meta = read_meta(path)
        assert is_checkpoint(path) and meta["algo"] == algo and meta["scenario"] == "tiny"
        assert meta["interface"] == INTERFACE[algo]
        assert history[-1]["env_steps"] >= 200
        ended = [h for h in history if "cost_usd" in h]  # 80-decision episodes ended
        assert ended and all(h["cost_usd"] > 0 and h["energy_kwh"] > 0 for h in ended)


def test_the_rllib_controller_replays_a_checkpoint_deterministically(
        trained: dict[str, tuple[Path, list[dict[str, float]]]]) -> None:
    from cloudrl.checkpoint_policy import read_meta
    from cloudrl.scenarios.rl_policy import load_rl_controller
    from cloudrl.scenarios.runner import ControllerSpec, run_controllers
    from envs.scenario.catalog import load_scenario
    from envs.scenario.env import READY_MARGINS, MaskedScenarioEnv

    cfg = load_scenario("tiny")
    for algo, (path, _) in trained.items():
        spec = ControllerSpec("rllib", {"checkpoint": str(path)}, algo)
        first, again = (run_controllers(cfg, [spec], SEEDS, workers=1)[0] for _ in range(2))
        assert [m["cost_usd"] for m in first] == [m["cost_usd"] for m in again]
        assert all(m["decide_p50_ms"] > 0 for m in first)
        # the controller plays exactly the episode the env gives its greedy actions
        ctrl = load_rl_controller(path)
        env_config = read_meta(path)["env_config"]  # the gated env's controller too
        env = MaskedScenarioEnv({k: v for k, v in env_config.items()
                                 if k not in ("seed_pool", "reward_scale")})
        assert env.interface == ctrl.interface == INTERFACE[algo]
        obs, _ = env.reset(seed=SEEDS[0])
        done, cost = False, 0.0
        while not done:
            if ctrl.interface == "gated":  # the preset the module picks
                action = int(np.argmax(ctrl.scores(obs["macro"])))
            else:
                i, j = ctrl.action(obs["macro"])
                action = (i * len(READY_MARGINS) + j if ctrl.interface == "flat"
                          else np.array([i, j]))
            obs, reward, done, _, _ = env.step(action)
            cost -= reward
        assert cost == pytest.approx(first[0]["cost_usd"], rel=1e-9)


def test_the_comparison_table_pairs_checkpoints_with_the_heuristic(
        trained: dict[str, tuple[Path, list[dict[str, float]]]]) -> None:
    from cloudrl.scenarios.rl_policy import comparison_metrics, format_table

    res = cli.compare_with_heuristic("tiny", {a: p for a, (p, _) in trained.items()}, SEEDS,
                                     {"quantile": 0.4}, workers=1)
    assert list(res) == ["heuristic", *ALGOS] and all(len(r) == len(SEEDS) for r in res.values())
    table = format_table(res)
    for header in ("cost $", "kWh", "kgCO2", "SLA LC %", "SLA batch %", "dqn - heuristic"):
        assert header in table
    metrics = comparison_metrics(res, "bdq")
    cost = np.mean([m["cost_usd"] for m in res["bdq"]])
    assert metrics["val/cost_usd"] == pytest.approx(cost)
    assert metrics["val/heuristic_cost_usd"] == pytest.approx(
        np.mean([m["cost_usd"] for m in res["heuristic"]]))


def test_cloudrl_train_scenario_logs_to_mlflow_and_prints_the_validation_table(
        ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cloudrl import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # DQN samples 1,000 env steps per iteration; learning starts after them (a fast test)
    hparams = {**TINY_HPARAMS["dqn"], "num_steps_sampled_before_learning_starts": 1000}
    code = cli.main(["train", "--scenario", "tiny", "--algo", "dqn", "--timesteps", "100",
                     "--hparams", json.dumps(hparams), "--out",
                     str(tmp_path / "ck"), "--eval-seeds", "1", "--eval-workers", "1",
                     "--tracking-uri", uri, "--experiment", "test-scenario-train"])
    out = capsys.readouterr().out
    assert code == 0
    assert "tiny: greedy dqn vs the signal-aware heuristic (defaults) on 1 validation" in out
    assert "dqn - heuristic:" in out and f"checkpoint: {tmp_path / 'ck'}" in out
    client = tracking.make_client(uri)
    exp = client.get_experiment_by_name("test-scenario-train")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["scenario"] == "tiny"
    assert run.data.tags["checkpoint"] == str(tmp_path / "ck")
    assert {"val/cost_usd", "val/heuristic_cost_usd", "val/cost_diff_pct", "env_steps",
            "cost_usd"} <= set(run.data.metrics)


@pytest.mark.slow
def test_a_scenario_sweep_evaluates_trials_and_the_heuristic_on_the_same_seeds(
        ray_session: None, tmp_path: Path) -> None:
    from cloudrl import tracking
    from cloudrl.sweep import SweepConfig, run_sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = SweepConfig(scenario="tiny", algos=["dqn", "bdq"], run_seeds=[0], env_steps=200,
                      hidden=16, hparams={a: TINY_HPARAMS[a] for a in ("dqn", "bdq")},
                      reporting={"min_sample_timesteps_per_iteration": 100},
                      eval_seeds=2, eval_workers=1, experiment="test-scenario-sweep",
                      max_concurrent_trials=1, verbose=0, storage_path=str(tmp_path / "tune"),
                      tracking_uri=uri)
    out = run_sweep(cfg, evaluate_scenario=cli.compare_with_heuristic)
    assert not out["failed"] and len(out["learned"]) == 2 and len(out["heuristics"]) == 1
    client = tracking.make_client(uri)
    runs = client.search_runs([client.get_experiment_by_name(cfg.experiment).experiment_id])
    assert {r.data.tags["kind"] for r in runs} == {"learned", "heuristic"}
    assert all(r.data.tags["scenario"] == "tiny" for r in runs)
    for row in out["learned"] + out["heuristics"]:
        assert row["test/cost_usd_mean"] > 0
        logged = client.get_run(row["run_id"]).data.metrics
        assert logged["test/cost_usd_mean"] == pytest.approx(row["test/cost_usd_mean"])


def test_the_service_serves_a_gated_checkpoint_as_the_simulator_decides(
        trained: dict[str, tuple[Path, list[dict[str, float]]]]) -> None:
    """``learned:DIR`` of a ``cloudrl train --scenario`` checkpoint (the gated DQN): the
    service's path from a request body picks the preset and the controls the controller
    picks in the simulator, on every decision of an episode; another scenario's checkpoint
    is refused by name."""
    from cloudrl.scenarios.rl_policy import load_rl_controller
    from envs.scenario.catalog import load_scenario
    from envs.scenario.sim import ScenarioSim
    from serve_apps.scenario_config import ScenarioServing
    from serve_apps.scenario_service import ScenarioPolicyError, ScenarioService, load_controller
    from tests.support import served_episode

    path = str(trained["gated_dqn"][0])
    service = ScenarioService(ScenarioServing(name="tiny", policy=f"learned:{path}"))
    assert service.observed  # the observation needs the hour of the week
    sim = ScenarioSim(load_scenario("tiny"))
    sim.reset(SEEDS[1])
    in_sim = load_rl_controller(path)
    in_sim.reset(sim)

    def check(state, want, out) -> None:
        assert not out.fallback and out.reason is None, out
        assert out.release_util == pytest.approx(want[0], rel=1e-12, abs=1e-12)
        assert out.ready_cores == pytest.approx(want[1], rel=1e-12, abs=1e-9)
        assert out.decide_ms > 0 and out.controller_ms > 0

    assert served_episode(service, sim, in_sim.decide, check) == \
        sim.n_ticks // sim.cfg.decision_ticks
    with pytest.raises(ScenarioPolicyError, match="trained on scenario 'tiny'"):
        load_controller(f"learned:{path}", {}, "scarcity_spikes")


def test_a_gated_policy_with_a_margin_leaves_the_rule_only_for_a_clear_gain(
        trained: dict[str, tuple[Path, list[dict[str, float]]]], tmp_path: Path) -> None:
    """The margin: at 0 the plain argmax; beyond every Q-gap the rule itself, episode for
    episode; a checkpoint's own ``gate_margin`` is read unless one is given."""
    import shutil

    from cloudrl.checkpoint_policy import read_meta
    from cloudrl.scenarios.rl_policy import RLlibController, check_margin, load_rl_controller
    from cloudrl.scenarios.runner import ControllerSpec, run_controllers
    from envs.scenario.catalog import load_scenario

    ctrl = load_rl_controller(trained["gated_dqn"][0], margin=0.05)
    q = np.array([0.0, 0.1, 0.05])
    assert ctrl.choice(q) == 1 and ctrl.choice(q - [0.0, 0.06, 0.0]) == 0
    ctrl.margin = 0.0
    assert ctrl.choice(q - [0.0, 0.06, 0.0]) == 2  # the plain argmax
    for bad in (-0.1, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ValueError, match="margin"):
            check_margin(bad, "gated")
    with pytest.raises(ValueError, match="only a gated policy"):
        check_margin(0.1, "flat")
    with pytest.raises(ValueError, match="only a gated policy"):
        load_rl_controller(trained["dqn"][0], margin=0.1)

    path = trained["gated_dqn"][0]
    rule = read_meta(path)["env_config"]["controller_config"]["heuristic"]
    cfg = load_scenario("tiny")
    plain, stay, heur = run_controllers(cfg, [
        ControllerSpec("rllib", {"checkpoint": str(path)}, "plain"),
        ControllerSpec("rllib", {"checkpoint": str(path), "margin": 1e9}, "stay"),
        ControllerSpec("signal_aware", rule, "rule")], SEEDS, workers=1)
    assert [m["cost_usd"] for m in stay] == [m["cost_usd"] for m in heur]
    # the checkpoint's own margin
    copy = tmp_path / "with_margin"
    shutil.copytree(path, copy)
    meta = json.loads((copy / "cloudrl.json").read_text())
    (copy / "cloudrl.json").write_text(json.dumps({**meta, "gate_margin": 1e9}))
    assert load_rl_controller(copy).margin == 1e9
    assert load_rl_controller(copy, margin=0.0).margin == 0.0
    assert isinstance(ctrl, RLlibController) and len(plain) == len(SEEDS)


def test_the_margin_is_chosen_on_validation_seeds_and_travels_with_the_checkpoint(
        trained: dict[str, tuple[Path, list[dict[str, float]]]], tmp_path: Path) -> None:
    from cloudrl.checkpoint_policy import read_meta
    from cloudrl.scenarios.gate_margin import (
        RULE,
        choose_margin,
        chosen_earlier,
        format_choice,
        write_with_margin,
    )
    from cloudrl.scenarios.rl_policy import load_rl_controller
    from envs.scenario.catalog import load_scenario

    path = trained["gated_dqn"][0]
    rule = read_meta(path)["env_config"]["controller_config"]["heuristic"]
    choice = choose_margin(load_scenario("tiny"), path, rule, SEEDS, margins=(0.0, 1e3),
                           workers=1)
    by = {r["margin"]: r for r in choice.rows}
    assert set(by) == {RULE, 0.0, 1e3} and choice.seeds == SEEDS
    assert by[1e3]["cost_usd"] == by[RULE]["cost_usd"] and by[1e3]["keeps_sla"]
    keeping = [r for r in choice.rows if r["keeps_sla"]]
    assert by[choice.margin]["cost_usd"] == min(r["cost_usd"] for r in keeping)
    assert "validation seeds" in format_choice(choice)
    out = write_with_margin(path, tmp_path / "run0", choice)
    assert load_rl_controller(out).margin == choice.margin
    assert read_meta(path).get("gate_margin") is None  # the source is left as it was
    assert chosen_earlier(out, choice.key) == choice
    assert chosen_earlier(out, "another key") is None
    with pytest.raises(ValueError, match="margins"):
        choose_margin(load_scenario("tiny"), path, rule, SEEDS, margins=(-1.0,))


def _headline_family(tmp_path: Path, family: str, **knobs: Any) -> tuple[Any, Any, Path, Any]:
    """Run 0 of a headline family on ``tiny`` (rule: quantile 0.4) into ``tmp_path``: the
    config, the trainer, the run's directory and the spec it returned (an RLlib one)."""
    from cloudrl.scenarios.headline import ScenarioHeadlineConfig, available_families, tiny
    from envs.scenario.catalog import load_scenario

    cfg = tiny(ScenarioHeadlineConfig(out_dir=str(tmp_path), workers=1, **knobs))
    train = available_families({"quantile": 0.4})[family]
    out = tmp_path / "tiny" / family / "run0"
    spec = train(load_scenario("tiny"), cfg, {}, 0, out)
    assert spec.kind == "rllib" and spec.params["checkpoint"] == str(out.resolve())
    return cfg, train, out, spec


def test_the_headline_family_reuses_the_gated_run_and_its_margin(
        ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``gated_dqn_margin``: the ``gated_dqn`` run of the same out-dir (trained here, once),
    its margin picked on validation seeds and carried in its own copy; a second call
    reuses both."""
    from cloudrl.checkpoint_policy import read_meta
    from envs.scenario.catalog import load_scenario

    cfg, train, out, spec = _headline_family(tmp_path, "gated_dqn_margin")
    base = read_meta(tmp_path / "tiny" / "gated_dqn" / "run0")
    meta = read_meta(out)
    assert base.get("gate_margin") is None and meta["algo"] == base["algo"] == "gated_dqn"
    assert meta["env_config"]["controller_config"]["heuristic"] == {"quantile": 0.4}
    sel = meta["margin_selection"]
    assert meta["gate_margin"] == sel["margin"] in {r["margin"] for r in sel["rows"]}
    assert len(sel["seeds"]) == cfg.n_val_seeds
    capsys.readouterr()
    assert train(load_scenario("tiny"), cfg, {}, 0, out) == spec
    printed = capsys.readouterr().out
    assert "reusing" in printed and "margin was chosen earlier" in printed


@pytest.mark.parametrize("bad", [-1, "0.4", None, True])
def test_a_bad_gate_margin_in_a_checkpoint_is_one_line_naming_it(
        trained: dict[str, tuple[Path, list[dict[str, float]]]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], bad: Any) -> None:
    import shutil

    copy = tmp_path / "bad_margin"
    shutil.copytree(trained["gated_dqn"][0], copy)
    meta = json.loads((copy / "cloudrl.json").read_text())
    (copy / "cloudrl.json").write_text(json.dumps({**meta, "gate_margin": bad}))
    err = _one_line_error(capsys, ["scenarios", "evaluate", "--scenario", "tiny",
                                   "--checkpoint", str(copy), "--n-seeds", "1"])
    assert "gate_margin" in err and str(copy) in err


# -- evolution strategies on a Q-network checkpoint (``gated_dqn_margin_es``) ----------------
ES_TINY = dict(iterations=2, pairs=2, seeds_per_candidate=1, eval_every=1, n_val_seeds=1,
               workers=1, sigma=0.5)


def _module_state(path: Path) -> dict[str, np.ndarray]:
    import pickle

    from cloudrl.checkpoint_policy import MODULE_SUBDIR

    with (path / MODULE_SUBDIR / "module_state.pkl").open("rb") as f:
        return pickle.load(f)


def test_es_on_the_gated_q_head_writes_a_checkpoint_with_the_kept_weights(
        trained: dict[str, tuple[Path, list[dict[str, float]]]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The search moves only the Q head's last layer, writes the kept weights into the
    module state (online and target copies), keeps the margin, leaves the start as it was,
    and its checkpoint plays in ``scenarios evaluate``; a rerun is recognised only for the
    same config and start."""
    from dataclasses import replace

    from cloudrl.algorithms.es.config import ESConfig
    from cloudrl.checkpoint_policy import read_meta
    from cloudrl.scenarios import gated_es
    from cloudrl.scenarios.rl_policy import load_rl_controller
    from envs.scenario.catalog import load_scenario

    start = tmp_path / "start"
    import shutil

    shutil.copytree(trained["gated_dqn"][0], start)
    meta = read_meta(start)
    (start / "cloudrl.json").write_text(json.dumps({**meta, "gate_margin": 0.05}))
    before = _module_state(start)
    cfg = ESConfig(**ES_TINY, run_seed=1)
    scn = load_scenario("tiny")
    res = gated_es.train_to_dir(scn, start, cfg, tmp_path / "es", log=lambda _: None)
    out = tmp_path / "es"
    after = _module_state(out)
    assert _module_state(start).keys() == before.keys()
    assert all(np.array_equal(_module_state(start)[k], v) for k, v in before.items())
    moved = {k for k in before if not np.array_equal(before[k], after[k])}
    if res.kept_iteration > 0:
        assert moved == {"af.2.weight", "af.2.bias", "_target_af.2.weight",
                         "_target_af.2.bias"}
        assert np.array_equal(after["af.2.weight"], after["_target_af.2.weight"])
    else:
        assert moved == set()
    ctrl = load_rl_controller(out)
    assert ctrl.margin == 0.05
    kept = ctrl.module.state_dict()
    assert np.allclose(kept["af.2.weight"].numpy(), after["af.2.weight"])
    m = json.loads((out / "manifest.json").read_text())
    assert m["init_digest"] == gated_es.start_digest(start) and m["config"] == cfg.to_dict()
    assert m["episodes"] == res.episodes == 3 * 1 + 2 * 2 * 2 * 1
    assert read_meta(out)["es"] == cfg.to_dict()
    assert gated_es.trained(out, scn, cfg, start)
    assert not gated_es.trained(out, scn, replace(cfg, run_seed=2), start)
    (start / "cloudrl.json").write_text(json.dumps({**meta, "gate_margin": 0.1}))
    assert not gated_es.trained(out, scn, cfg, start)  # another margin: another start
    capsys.readouterr()
    assert cli.main(["scenarios", "evaluate", "--scenario", "tiny", "--policy",
                     "signal_aware", "--checkpoint", str(out), "--split", "validation",
                     "--n-seeds", "1", "--workers", "1"]) == 0
    assert "signal_aware" in capsys.readouterr().out


def test_es_under_a_constant_objective_keeps_the_gated_start(
        trained: dict[str, tuple[Path, list[dict[str, float]]]]) -> None:
    from cloudrl.algorithms.es.algorithm import es_finetune
    from cloudrl.algorithms.es.config import ESConfig
    from cloudrl.scenarios.rl_policy import load_rl_controller
    from envs.scenario.catalog import load_scenario

    path = str(trained["gated_dqn"][0])
    res = es_finetune(load_scenario("tiny"), path, ESConfig(**ES_TINY), log=lambda _: None,
                      objective=lambda m: 1.0, loader=load_rl_controller)
    start = load_rl_controller(path).module.state_dict()
    assert res.kept_iteration == 0
    assert all(np.array_equal(v.numpy(), start[k].numpy())
               for k, v in res.module.state_dict().items())


def test_es_cli_on_an_rllib_checkpoint_refuses_what_it_cannot_search(
        trained: dict[str, tuple[Path, list[dict[str, float]]]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """BDQ has branch heads, not one Q head: one line naming ``--params``; the start as
    ``--out``: one line; nothing written either time."""
    base = ["scenarios", "es", "--scenario", "tiny", "--iterations", "1"]
    err = _one_line_error(capsys, [*base, "--init-checkpoint", str(trained["bdq"][0]),
                                   "--out", str(tmp_path / "x")])
    assert "--params" in err and not (tmp_path / "x").exists()
    gated = str(trained["gated_dqn"][0])
    err = _one_line_error(capsys, [*base, "--init-checkpoint", gated, "--out", gated])
    assert "start itself" in err
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "mine.txt").write_text("keep me")
    err = _one_line_error(capsys, [*base, "--init-checkpoint", gated, "--out", str(keep)])
    assert "not a checkpoint" in err and (keep / "mine.txt").read_text() == "keep me"


def test_the_headline_family_fine_tunes_the_gated_run_with_its_margin(
        ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``gated_dqn_margin_es``: the ``gated_dqn_margin`` run of the same out-dir (its
    margin chosen), its Q head searched; a second call reuses all three steps."""
    from cloudrl.checkpoint_policy import read_meta
    from envs.scenario.catalog import load_scenario

    cfg, train, out, spec = _headline_family(tmp_path, "gated_dqn_margin_es", es_iterations=1)
    start = read_meta(tmp_path / "tiny" / "gated_dqn_margin" / "run0")
    meta = read_meta(out)
    assert meta["gate_margin"] == start["gate_margin"] and meta["es"]["iterations"] == 1
    assert meta["es"]["n_val_seeds"] == cfg.n_val_seeds
    capsys.readouterr()
    assert train(load_scenario("tiny"), cfg, {}, 0, out) == spec
    assert "same scenario, config and start" in capsys.readouterr().out
