"""cloudrl tune-heuristic: tuned power_aware parameters, their JSON, their evaluation row."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from cloudrl.cli import main
from cloudrl.config_loader import ConfigError, load_config
from cloudrl.evaluate import EvalConfig, make_env, resolve_policy, run_episode
from cloudrl.headline.tuning import (
    TunedHeuristic,
    TuneHeuristicConfig,
    default_point,
    load_tuned,
    tune_heuristic,
)
from cloudrl.heuristics.power_aware import PowerAwareConfig, PowerAwareConsolidation
from envs.env_config import EnvConfig

TUNED = {"spare_floor": 2.5, "spare_frac": 0.15, "lead_ticks": 0.0, "hysteresis": 0.0,
         "tier_weight": 0.001, "job_order": "fifo", "priority_level": 0}
SMALL_ENV = {"n_servers": 6, "sim": {"episode_length": 60}}


def _write(tmp_path, params=TUNED, **extra):
    path = tmp_path / "tuned.json"
    path.write_text(TunedHeuristic(params=params, **extra).model_dump_json())
    return path


def test_params_round_trip_through_json_and_eval_config(tmp_path):
    loaded = load_tuned(_write(tmp_path, train={"reward_mean": float("nan")}))
    assert loaded.config() == PowerAwareConfig(**TUNED)
    assert loaded.name == "power_aware_tuned"
    assert loaded.params == asdict(PowerAwareConfig(**TUNED))  # full set, defaults filled in
    # through a YAML config of cloudrl evaluate, into the policy the workers build
    cfg_file = tmp_path / "eval.yaml"
    cfg_file.write_text(json.dumps({"interface": "branching",
                                    "policies": ["power_aware", "power_aware_tuned"],
                                    "heuristic_params": {"power_aware": loaded.params}}))
    cfg = load_config(EvalConfig, cfg_file)
    tuned = resolve_policy("power_aware_tuned", cfg.interface, cfg.env, cfg.heuristic_params)
    assert isinstance(tuned, PowerAwareConsolidation)
    assert tuned.config == PowerAwareConfig(**TUNED) and tuned.name == "power_aware_tuned"
    untuned = resolve_policy("power_aware", cfg.interface, cfg.env, cfg.heuristic_params)
    assert untuned.config == PowerAwareConfig() and untuned.name == "power_aware"


def test_evaluate_runs_the_tuned_heuristic_as_its_own_row(tmp_path):
    path = _write(tmp_path)
    code = main(["evaluate", "--n-servers", "6", "--episode-length", "60", "--interface",
                 "branching", "--policy", "power_aware", "--heuristic-params", str(path),
                 "--n-seeds", "2", "--workers", "1", "--quiet", "--out", str(tmp_path / "ev")])
    assert code == 0
    out = json.loads((tmp_path / "ev.json").read_text())
    rows = {r["policy"]: r for r in out["summary"]}
    assert set(rows) == {"power_aware", "power_aware_tuned"}
    env = make_env(EnvConfig.model_validate(SMALL_ENV), "branching")
    direct = [run_episode(PowerAwareConsolidation("branching", **TUNED), env, s).energy_kwh
              for s in (1_000_000, 1_000_001)]
    assert rows["power_aware_tuned"]["energy_kwh_mean"] == pytest.approx(sum(direct) / 2)
    assert rows["power_aware_tuned"]["energy_kwh_mean"] != rows["power_aware"]["energy_kwh_mean"]


@pytest.mark.parametrize(("content", "message"), [
    ('{"params": {"spare_flor": 1}}', "params: Value error, unknown power_aware parameter "
                                      "'spare_flor'"),
    ('{"params": {"hysteresis": -1}}', "params: Value error, PowerAwareConfig.hysteresis "
                                       "must be >= 0"),
    ('{"params": {}, "heuristic": "ffd"}', "heuristic: Input should be 'power_aware'"),
    ('{"params": ', "not valid JSON"),
    (None, "No such file or directory"),
])
def test_bad_params_file_is_one_line_naming_it(tmp_path, capsys, content, message):
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    assert main(["evaluate", "--heuristic-params", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--heuristic-params {path}" in err and message in err


def test_tuned_row_without_params_names_the_field():
    with pytest.raises(ValueError, match="needs heuristic_params.power_aware"):
        EvalConfig(policies=["power_aware_tuned"])
    with pytest.raises(ValueError, match="heuristic_params.power_aware: unknown power_aware"):
        EvalConfig(heuristic_params={"power_aware": {"nope": 1}})


def test_load_tuned_error_is_a_config_error(tmp_path):
    path = tmp_path / "b.json"
    path.write_text('{"params": {"job_order": "random"}}')
    with pytest.raises(ConfigError, match="params: Value error, PowerAwareConfig.job_order"):
        load_tuned(path)


def test_tune_heuristic_sweeps_on_train_seeds_and_logs_to_mlflow(ray_session, tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = TuneHeuristicConfig(env=EnvConfig.model_validate(SMALL_ENV), num_samples=3,
                              n_seeds=2, confirm_seeds=2, tracking_uri=uri,
                              storage_path=str(tmp_path / "tune"))
    out = tmp_path / "tuned.json"
    tuned = tune_heuristic(cfg, out)
    assert load_tuned(out) == tuned
    # the default parameters are one of the trials, so tuning never loses on train seeds
    assert tuned.default_train and tuned.train["reward_mean"] >= tuned.default_train[
        "reward_mean"]
    env = make_env(cfg.env, "branching")
    rewards = [run_episode(PowerAwareConsolidation("branching", config=tuned.config()), env,
                           s).episode_reward for s in (0, 1)]  # the train seeds
    assert tuned.train["reward_mean"] == pytest.approx(sum(rewards) / 2)
    # a point other than the defaults is kept only if it also wins on the validation seeds
    if tuned.source == "search":
        assert tuned.validation["reward_mean"] > tuned.default_validation["reward_mean"]
    else:
        assert tuned.config() == PowerAwareConfig()
        assert tuned.train == tuned.default_train
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("cloudrl-tune-heuristic")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == tuned.mlflow_run_id]
    assert [r.info.run_id for r in parent] == [tuned.mlflow_run_id]
    assert len(children) == 3
    assert all("train/reward_mean" in r.data.metrics for r in children)
    assert any(all(r.data.params[k] == str(v) for k, v in default_point("branching").items())
               for r in children)
    best = max(r.data.metrics["train/reward_mean"] for r in children)
    assert best >= tuned.train["reward_mean"]
    if tuned.source == "search":
        assert best == pytest.approx(tuned.train["reward_mean"])
    assert parent[0].data.params["source"] == tuned.source


def test_confirmation_keeps_the_defaults_unless_the_best_wins_on_validation_seeds():
    from cloudrl.headline.tuning import confirm_on_validation
    from cloudrl.protocol import validation_seeds

    env_cfg = EnvConfig.model_validate(SMALL_ENV)
    env = make_env(env_cfg, "branching")
    # never sleeping a server: more energy, so it loses to the defaults on the held-out seeds
    check = confirm_on_validation({"spare_floor": 100.0}, env_cfg, "branching", 3)
    assert not check.keep_best
    for params, scores in (({"spare_floor": 100.0}, check.best), ({}, check.default)):
        policy = PowerAwareConsolidation("branching", config=PowerAwareConfig(**params))
        rewards = [run_episode(policy, env, s).episode_reward for s in validation_seeds(3)]
        assert scores["reward_mean"] == pytest.approx(sum(rewards) / 3)
    assert check.best["energy_kwh_mean"] > check.default["energy_kwh_mean"]
    # a tie is not a win: the defaults against themselves stay the defaults
    assert not confirm_on_validation({}, env_cfg, "branching", 2).keep_best


def test_old_tuned_files_without_the_confirmation_fields_still_load(tmp_path):
    path = tmp_path / "old.json"
    data = json.loads(TunedHeuristic(params=TUNED).model_dump_json())
    for key in ("source", "validation", "default_validation"):
        data.pop(key)
    path.write_text(json.dumps(data))
    assert load_tuned(path).source == "search"


def test_tune_output_path_is_where_headline_reuse_looks():
    from cloudrl.headline.tuning import matches, tuned_path

    cfg = TuneHeuristicConfig(env=EnvConfig.model_validate({"n_servers": 50}))
    assert cfg.default_out() == tuned_path("results/headline", "poisson", 50, "branching", 1000)
    assert str(cfg.default_out()) == \
        "results/headline/tune_poisson_n50_branching/tuned_power_aware.json"
    assert tuned_path("r", "poisson", 5, "flat", 100).parent.name == "tune_poisson_n5_flat_l100"
    tuned = TunedHeuristic(params={}, workload="poisson", n_servers=50, episode_length=1000,
                           interface="branching")
    assert matches(tuned, cfg.env, "branching")
    assert not matches(tuned, cfg.env, "flat")
    assert not matches(tuned, EnvConfig.model_validate({"n_servers": 5}), "branching")
