"""Ray Tune sweep -> MLflow (real SQLite store) -> evaluation -> compare, on a tiny config.

One module-scoped sweep (masked PPO and DQN x 1 run seed x poisson, N=5,
50-tick episodes, 2 iterations of 64 env steps each, 2 test seeds) feeds the
tests that read it back with ``mlflow.search_runs`` and ``get_metric_history``.

Fault tolerance: one-trial PPO sweeps (3 iterations of 64 env steps, a
checkpoint after each) in which the test-only hook ``$CLOUDRL_SWEEP_TEST_FAULT``
SIGKILLs the trial's process (Tune restarts the trial from its checkpoint) or
the sweep's driver, a ``cloudrl sweep`` subprocess (``cloudrl sweep --resume``
continues it), once, during iteration 2, before that iteration is reported.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cloudrl import tracking
from cloudrl.config_loader import ConfigError
from cloudrl.metrics import METRICS
from cloudrl.protocol import test_seeds as held_out_seeds

STEPS_PER_ITER = 64
TINY: dict[str, Any] = dict(
    algos=["ppo", "dqn"], run_seeds=[0], workloads=["poisson"], n_servers=5, episode_length=50,
    env_steps=2 * STEPS_PER_ITER, hidden=16,
    hparams={
        "ppo": {"train_batch_size_per_learner": STEPS_PER_ITER, "minibatch_size": 32,
                "num_epochs": 1},
        "dqn": {"train_batch_size_per_learner": 32, "n_step": 1,
                "num_steps_sampled_before_learning_starts": 32,
                "target_network_update_freq": 32,
                "replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer",
                                         "capacity": 2000, "alpha": 0.6, "beta": 0.4}},
    },
    reporting={"min_sample_timesteps_per_iteration": STEPS_PER_ITER},
    env_runners={"rollout_fragment_length": 32, "num_envs_per_env_runner": 1},
    eval_seeds=2, eval_workers=1, experiment="test-sweep", max_concurrent_trials=2, verbose=0,
)
HEURISTIC_NAMES = {"round_robin", "sjf", "ffd", "power_aware"}
# One PPO trial, 3 iterations, a checkpoint after each; at most one restart.
ONE_TRIAL: dict[str, Any] = dict(
    TINY, algos=["ppo"], env_steps=3 * STEPS_PER_ITER, checkpoint_every=1, heuristics=[],
    max_concurrent_trials=1, max_failures=1, experiment="test-sweep-faults")


@pytest.fixture(scope="module")
def swept(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import mlflow

    from cloudrl.sweep import SweepConfig, run_sweep

    root = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    cfg = SweepConfig(**TINY, storage_path=str(root / "tune"), tracking_uri=uri)
    out = run_sweep(cfg)
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=[cfg.experiment])
    return {"cfg": cfg, "out": out, "uri": uri, "root": root, "runs": runs,
            "client": tracking.make_client(uri)}


def _kind(runs: Any, kind: str) -> Any:
    return runs[runs["tags.kind"] == kind]


def test_one_finished_run_per_trial_and_heuristic_with_tags(swept: dict[str, Any]) -> None:
    runs, out = swept["runs"], swept["out"]
    assert out["failed"] == []
    learned = _kind(runs, "learned")
    assert sorted(learned["tags.algo"]) == ["dqn", "ppo"]
    assert set(learned["tags.workload"]) == {"poisson"}
    assert set(learned["tags.run_seed"]) == {"0"}
    assert set(learned["tags.n_servers"]) == {"5"}
    assert set(learned["tags.sweep_id"]) == {out["sweep_id"]}
    heur = _kind(runs, "heuristic")
    assert set(heur["tags.policy"]) == HEURISTIC_NAMES and len(heur) == 4
    assert set(runs["status"]) == {"FINISHED"}
    assert len(runs) == 6


def test_training_metrics_are_logged_at_env_steps(swept: dict[str, Any]) -> None:
    from cloudrl.sweep_tracking import TRACKED_METRICS

    client = swept["client"]
    for run_id in _kind(swept["runs"], "learned")["run_id"]:
        hist = sorted(client.get_metric_history(run_id, "env_steps"), key=lambda m: m.step)
        # One point per training iteration, x = env steps sampled so far (not 1, 2, ...).
        assert [m.step for m in hist] == [STEPS_PER_ITER, 2 * STEPS_PER_ITER]
        assert [m.value for m in hist] == [float(m.step) for m in hist]
        ret = client.get_metric_history(run_id, "episode_return_mean")
        assert ret and {m.step for m in ret} <= {STEPS_PER_ITER, 2 * STEPS_PER_ITER}
        assert all(math.isfinite(m.value) and m.value < 0 for m in ret)
        keys = set(client.get_run(run_id).data.metrics)
        assert "training_iteration" not in keys
        assert keys - {k for k in keys if k.startswith("test/")} <= set(TRACKED_METRICS)


def test_every_run_has_test_metrics_and_episode_csv(swept: dict[str, Any]) -> None:
    from cloudrl.checkpoint_policy import is_checkpoint

    runs, client = swept["runs"], swept["client"]
    for m in METRICS:
        for stat in ("mean", "ci95"):
            assert runs[f"metrics.test/{m}_{stat}"].notna().all(), (m, stat)
    for _, run in runs.iterrows():
        csvs = [a.path for a in client.list_artifacts(run["run_id"], "eval")
                if a.path.endswith(".csv")]
        assert len(csvs) == 1
        local = client.download_artifacts(run["run_id"], csvs[0], str(swept["root"] / "dl"))
        with open(local) as f:
            rows = list(csv.DictReader(f))
        assert [int(r["seed"]) for r in rows] == list(held_out_seeds(2))
        mean = sum(float(r["sla_violation_rate"]) for r in rows) / len(rows)
        assert mean == pytest.approx(run["metrics.test/sla_violation_rate_mean"])
    for _, run in _kind(runs, "learned").iterrows():
        assert is_checkpoint(run["tags.checkpoint"])
        assert run["metrics.test/episode_reward_mean"] < 0


def test_heuristic_run_matches_a_direct_evaluation(swept: dict[str, Any]) -> None:
    from cloudrl.evaluate import EvalConfig, evaluate, summary_rows

    cfg = swept["cfg"]
    direct = summary_rows(evaluate(EvalConfig(env=cfg.env_config("poisson"),
                                              policies=["power_aware"], n_seeds=2, workers=1),
                                   progress=False))[0]
    heur = _kind(swept["runs"], "heuristic")
    logged = heur[heur["tags.policy"] == "power_aware"].iloc[0]
    for m in ("energy_kwh", "sla_violation_rate", "episode_reward"):
        assert logged[f"metrics.test/{m}_mean"] == pytest.approx(direct[f"{m}_mean"])
        assert logged[f"metrics.test/{m}_ci95"] == pytest.approx(direct[f"{m}_ci95"])


def test_compare_cli_writes_table_plots_and_logs_a_compare_run(
        swept: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    import mlflow

    from cloudrl.cli import main

    out = swept["root"] / "compare"
    rc = main(["compare", "--experiment", "test-sweep", "--tracking-uri", swept["uri"],
               "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    labels = HEURISTIC_NAMES | {"ppo (1 run seed)", "dqn (1 run seed)"}
    for label in labels:
        assert label in printed
    with (out / "comparison.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["policy"] for r in rows} == labels
    assert {r["kind"] for r in rows} == {"heuristic", "learned"}
    md = (out / "comparison.md").read_text()
    assert all(label in md for label in labels) and "| policy |" in md
    for png in ("pareto.png", "learning_curves.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    cmp = mlflow.search_runs(experiment_names=["test-sweep"],
                             filter_string="tags.kind = 'compare'")
    assert len(cmp) == 1
    logged = {a.path for a in swept["client"].list_artifacts(cmp["run_id"].iloc[0])}
    assert logged == {"comparison.csv", "comparison.md", "pareto.png", "learning_curves.png"}


# -- fault tolerance -------------------------------------------------------------------------

def _reported(exp_dir: str | Path) -> tuple[Any, list[dict[str, Any]]]:
    """The sweep's one Tune trial and every result it reported, all attempts, in order."""
    from ray import tune

    (trial,) = tune.ExperimentAnalysis(str(exp_dir)).trials
    lines = (Path(trial.local_path) / "result.json").read_text().splitlines()
    return trial, [json.loads(line) for line in lines]


def _one_learned_run(uri: str) -> tuple[Any, Any]:
    import mlflow

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=[ONE_TRIAL["experiment"]])
    assert len(runs) == 1 and runs["tags.kind"].iloc[0] == "learned"
    client = tracking.make_client(uri)
    return client, client.get_run(runs["run_id"].iloc[0])


def _assert_continued_from_the_checkpoint(client: Any, run: Any, results: list) -> None:
    # Iteration 2's first attempt died before reporting; the restart restored iteration 1's
    # checkpoint (64 env steps) and counted on. From scratch it would report 64 again.
    assert [int(r["env_steps"]) for r in results] == [64, 128, 192]
    assert [r["training_iteration"] for r in results] == [1, 2, 3]
    hist = sorted(client.get_metric_history(run.info.run_id, "env_steps"), key=lambda m: m.step)
    assert [m.step for m in hist] == [64, 128, 192]
    assert run.info.status == "FINISHED"
    assert "test/energy_kwh_mean" in run.data.metrics
    assert run.data.tags["checkpoint"].endswith("checkpoint_000002")


@pytest.mark.usefixtures("ray_session")
def test_a_killed_trial_restarts_from_its_checkpoint_in_the_same_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudrl.sweep import FAULT_ENV, SweepConfig, run_sweep

    marker = tmp_path / "fault_fired"
    monkeypatch.setenv(FAULT_ENV, f"trial:2:{marker}")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_sweep(SweepConfig(**ONE_TRIAL, storage_path=str(tmp_path / "tune"),
                                tracking_uri=uri))
    assert marker.exists()  # the fault fired
    assert out["failed"] == []
    (row,) = out["learned"]
    assert row["num_failures"] == 1 and row["env_steps"] == 192
    trial, results = _reported(out["experiment_dir"])
    assert trial.num_failures == 1 and trial.status == "TERMINATED"
    client, run = _one_learned_run(uri)
    assert run.info.run_id == row["run_id"] and run.data.tags["num_failures"] == "1"
    _assert_continued_from_the_checkpoint(client, run, results)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_resume_after_the_driver_died_continues_the_trial_and_its_mlflow_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import ray

    from cloudrl.cli import main
    from cloudrl.sweep import FAULT_ENV

    marker = tmp_path / "fault_fired"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = tmp_path / "sweep.yaml"  # JSON is YAML
    config.write_text(json.dumps({**ONE_TRIAL, "storage_path": str(tmp_path / "tune"),
                                  "tracking_uri": uri, "name": "died"}))
    # The driver: a `cloudrl sweep` process on this session's Ray, killed in iteration 2.
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
           FAULT_ENV: f"driver:2:{marker}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "cloudrl", "sweep", "--config", str(config)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert marker.exists()
    client, run = _one_learned_run(uri)
    assert run.info.status == "RUNNING"  # nobody ended it

    argv = ["sweep", "--resume", "died", "--storage-path", str(tmp_path / "tune")]
    assert main(argv) == 0
    assert "ppo  poisson" in capsys.readouterr().out
    trial, results = _reported(tmp_path / "tune" / "died")
    assert trial.num_failures == 0  # a dead driver is not a trial failure
    client, resumed = _one_learned_run(uri)
    assert resumed.info.run_id == run.info.run_id
    _assert_continued_from_the_checkpoint(client, resumed, results)

    # Resuming a finished sweep again opens no run and evaluates nothing again.
    assert main(argv) == 0
    client, again = _one_learned_run(uri)
    assert again.info.run_id == run.info.run_id
    assert len(client.get_metric_history(run.info.run_id, "test/energy_kwh_mean")) == 1


# -- config and tracking, no Ray ------------------------------------------------------------

def test_tracking_uri_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tracking.ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking.resolve_tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv(tracking.ENV_VAR, "http://mlflow:5000")
    assert tracking.resolve_tracking_uri() == "http://mlflow:5000"
    assert tracking.resolve_tracking_uri("sqlite:////x/y.db") == "sqlite:////x/y.db"
    assert tracking.resolve_tracking_uri("runs.db") == f"sqlite:///{tmp_path.resolve()}/runs.db"
    with pytest.raises(ConfigError, match="file store"):
        tracking.resolve_tracking_uri("mlruns")


def test_params_are_flattened_and_truncated() -> None:
    flat = tracking.flatten({"env": {"sim": {"alpha": 1}}, "hparams": {}, "lr": [1, 2]})
    assert flat == {"env.sim.alpha": 1, "hparams": {}, "lr": [1, 2]}
    assert len(tracking._param_value("x" * 10_000)) == tracking.MAX_PARAM_VALUE


def test_sweep_config_errors_name_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    from cloudrl.cli import main
    from cloudrl.config_loader import build_config
    from cloudrl.sweep import SweepConfig, check_algo_configs

    assert main(["sweep", "--n-servers", "0", "--eval-seeds", "51"]) == 2
    err = capsys.readouterr().err
    assert "n_servers" in err and "eval_seeds" in err
    with pytest.raises(ValueError, match="workload"):
        SweepConfig(workloads=["bursty"])
    with pytest.raises(ValueError, match="reporting"):
        SweepConfig(reporting={"min_sample_steps": 1})
    with pytest.raises(ConfigError, match=r"hparams\.ppo\.learning_rate"):
        build_config(SweepConfig, {"algos": ["ppo"], "hparams": {"ppo": {"learning_rate": 1}}})
    with pytest.raises(ConfigError, match=r"hparams\.a3c"):  # not a row of the algorithm table
        build_config(SweepConfig, {"hparams": {"a3c": {}}})
    # RLlib's own checks still run before Tune starts, naming the algorithm
    with pytest.raises(ConfigError, match=r"hparams\.ppo: .*minibatch"):
        check_algo_configs(SweepConfig(algos=["ppo"], hparams={
            "ppo": {"train_batch_size_per_learner": 64, "minibatch_size": 128}}))
    # Defaults are validated too: "all" expands to the four heuristics (it once did not).
    assert set(SweepConfig().heuristics) == HEURISTIC_NAMES
    cfg = SweepConfig(n_servers=7, episode_length=30, workload_options={"poisson": {"rate": 0.5}})
    env = cfg.env_config("poisson")
    assert (env.sim.fleet.n_servers, env.sim.episode_length, env.workload.rate) == (7, 30, 0.5)
    assert cfg.train_config("dqn", "poisson", 3).run_seed == 3


def test_max_failures_and_resume_errors_name_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cloudrl.cli import main
    from cloudrl.config_loader import load_config
    from cloudrl.sweep import SweepConfig

    assert main(["sweep", "--max-failures", "-2"]) == 2
    err = capsys.readouterr().err
    assert "max_failures" in err and "-2" in err
    with pytest.raises(ConfigError, match="max_failures"):
        load_config(SweepConfig, None, {"max_failures": "often"})
    assert SweepConfig().max_failures == 2 and SweepConfig(max_failures=-1).max_failures == -1
    # --resume takes the sweep's saved config, and needs a directory that has one.
    assert main(["sweep", "--resume", "x", "--algos", "ppo", "--max-failures", "3"]) == 2
    assert "drop --algos --max-failures" in capsys.readouterr().err
    assert main(["sweep", "--resume", str(tmp_path)]) == 2
    assert "not a cloudrl sweep directory" in capsys.readouterr().err


def test_comparison_rows_mark_branching_policies_and_default_old_runs_to_flat():
    import pandas as pd

    from cloudrl.compare import comparison_rows
    from cloudrl.metrics import METRICS

    def run(kind: str, policy: str, interface: str | None, energy: float) -> dict[str, Any]:
        row: dict[str, Any] = {"tags.workload": "poisson", "tags.n_servers": "50",
                               "tags.kind": kind, "tags.policy": policy,
                               "tags.interface": interface}
        for m in METRICS:
            row[f"metrics.test/{m}_mean"] = energy if m == "energy_kwh" else 0.0
            row[f"metrics.test/{m}_ci95"] = 0.1
        return row

    df = pd.DataFrame([run("heuristic", "ffd", None, 160.0),
                       run("heuristic", "ffd", "branching", 161.0),
                       run("heuristic", "power_aware", "flat", 120.0),
                       run("learned", "bdq", "branching", 130.0),
                       run("learned", "ppo", "flat", 150.0)])
    (rows,) = comparison_rows(df).values()
    assert [r["policy"] for r in rows] == [
        "ffd", "power_aware", "ffd [branching]", "bdq (1 run seed) [branching]",
        "ppo (1 run seed)"]
    assert [r["energy_kwh_mean"] for r in rows] == [160.0, 120.0, 161.0, 130.0, 150.0]


def test_the_mlflow_side_takes_plain_values(tmp_path: Path) -> None:
    """The trial callback opens, finds again and fills runs from names, tags and params it
    was given: no SweepConfig, no call back into cloudrl.sweep."""
    import types

    from cloudrl.sweep_tracking import MlflowTrialCallback, TrialRun, logged_test_metrics

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    planned = {("ppo", "poisson", 0): TrialRun("ppo-poisson-n5-s0", {"algo": "ppo"},
                                               {"lr": 0.001})}
    callback = MlflowTrialCallback(uri, "plain", "sweep-1", ("algo", "workload", "run_seed"),
                                   planned)
    trial = types.SimpleNamespace(trial_id="t0", num_failures=0,
                                  config={"algo": "ppo", "workload": "poisson", "run_seed": 0})
    callback.on_trial_start(0, [], trial)
    callback.on_trial_result(0, [], trial, {"env_steps": 64, "episode_return_mean": -2.0,
                                            "not_tracked": 1.0})
    callback.on_trial_complete(0, [], trial)
    run = callback.client.get_run(callback.run_ids["t0"])
    assert run.info.run_name == "ppo-poisson-n5-s0" and run.info.status == "FINISHED"
    assert run.data.tags["algo"] == "ppo" and run.data.tags["trial_id"] == "t0"
    assert run.data.params["lr"] == "0.001"
    assert run.data.metrics == {"env_steps": 64.0, "episode_return_mean": -2.0}
    assert logged_test_metrics(run) is None  # not evaluated yet
    again = MlflowTrialCallback(uri, "plain", "sweep-1", ("algo", "workload", "run_seed"), {})
    assert again.run_id_for("t0") == run.info.run_id  # a resumed driver finds it by tag


def test_finishing_ends_runs_finished_or_failed(tmp_path) -> None:
    from cloudrl import tracking

    client = tracking.make_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = tracking.get_or_create_experiment(client, "finishing")
    ok = tracking.start_run(client, exp, "ok", {})
    with tracking.finishing(client, ok):
        tracking.log_metrics(client, ok, {"x": 1.0})
    bad = tracking.start_run(client, exp, "bad", {})
    with pytest.raises(RuntimeError, match="boom"), tracking.finishing(client, bad):
        raise RuntimeError("boom")
    assert client.get_run(ok).info.status == "FINISHED"
    assert client.get_run(bad).info.status == "FAILED"
