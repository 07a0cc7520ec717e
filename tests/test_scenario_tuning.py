"""Scenario tuning (``cloudrl.scenarios.tuning.tune``) runs its candidates as Ray Tune trials:
the same seeded points as a direct evaluation, the defaults first, the argmin of the mean
validation cost, the same result twice, with Ray started here or by the caller."""

from __future__ import annotations

import builtins
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from cloudrl.heuristics.signal_aware import SignalAwareConfig
from cloudrl.mpc.forecast_mpc import MPCConfig
from cloudrl.protocol import validation_seeds
from cloudrl.scenarios.runner import ControllerSpec, run_controllers
from cloudrl.scenarios.tuning import RUN_AT_ONCE_LIKE, evaluate_point, search_points, tune
from envs.scenario.catalog import load_scenario

RAY_TMP = "/tmp/ray_scenario_tuning_tests"  # short: Ray's socket paths must stay < 108 bytes


@pytest.fixture(scope="module")
def tiny():
    return load_scenario("tiny")


def test_search_points_are_seeded_and_start_with_the_defaults():
    points = search_points("signal_aware", 4, seed=3)
    assert len(points) == 5  # defaults, 3 random points, the run-at-once corner
    assert points[0] == asdict(SignalAwareConfig())
    assert points[-1] == RUN_AT_ONCE_LIKE
    assert points == search_points("signal_aware", 4, seed=3)
    assert points[1:4] != search_points("signal_aware", 4, seed=4)[1:4]
    mpc = search_points("mpc", 3, seed=0)
    assert len(mpc) == 3 and mpc[0] == {k: v for k, v in asdict(MPCConfig()).items()
                                        if k not in ("horizon_hours", "carbon_weight")}
    assert search_points("signal_aware", 1) == [asdict(SignalAwareConfig())]
    with pytest.raises(ValueError, match="signal_aware, deadline_aware, mpc, got 'oracle'"):
        search_points("oracle", 2)


@pytest.mark.slow  # ~15-20 s each: a Ray start of its own / a second search
def test_tune_starts_ray_if_none_runs_and_leaves_it_and_print_as_found(
        tiny, monkeypatch, capfd):
    import ray

    monkeypatch.setenv("RAY_TMPDIR", RAY_TMP)
    Path(RAY_TMP).mkdir(exist_ok=True)
    was_running, printer = ray.is_initialized(), builtins.print
    result = tune(tiny, "signal_aware", n_samples=1, n_seeds=1, workers=2)
    assert ray.is_initialized() == was_running  # shut down only if tune started it
    assert builtins.print is printer
    assert result.storage_path is None and result.mlflow_run_id is None  # nothing kept
    assert result.n_samples == 1 and result.params == asdict(SignalAwareConfig())
    assert result.mean_cost == result.default_cost > 0
    out, err = capfd.readouterr()
    assert out == "" and "Trial" not in err and "Configuration for experiment" not in err


def test_tune_picks_the_argmin_of_the_same_points_a_direct_evaluation_scores(
        tiny, ray_session, tmp_path):
    points = search_points("signal_aware", 3, seed=5)
    seeds = list(validation_seeds(2))
    direct = run_controllers(tiny, [ControllerSpec("signal_aware", p) for p in points], seeds,
                             workers=2)
    costs = [float(np.mean([m["cost_usd"] for m in r])) for r in direct]
    import ray

    result = tune(tiny, "signal_aware", n_samples=3, n_seeds=2, seed=5, workers=2,
                  storage_path=tmp_path / "tune")
    assert ray.is_initialized()  # the caller's Ray (ray_session) is used and left running
    # every trial's evaluation is deterministic: the very same costs as played directly
    assert result.trials == list(zip(points, costs, strict=True))
    assert result.params == points[int(np.argmin(costs))]
    assert result.mean_cost == min(costs) and result.default_cost == costs[0]
    assert result.n_samples == len(points) == 4 and result.n_seeds == 2
    assert evaluate_point(tiny, "signal_aware", points[0], seeds)["cost_usd"] == costs[0]
    # one Tune trial per point, created in point order: the defaults are the first trial
    exp = Path(result.storage_path)
    assert exp.parent == (tmp_path / "tune").resolve() and exp.is_dir()
    trials = sorted(p.name for p in exp.iterdir() if p.is_dir())
    assert len(trials) == len(points)
    for k, name in enumerate(trials):
        assert f"_{k:05d}_" in name and f"point={k}" in name


@pytest.mark.slow  # ~15-20 s each: a Ray start of its own / a second search
def test_the_same_arguments_give_the_same_result_and_log_nested_mlflow_runs(
        tiny, ray_session, tmp_path):
    from mlflow import MlflowClient

    points, seeds = search_points("mpc", 2, seed=1), list(validation_seeds(1))
    costs = [evaluate_point(tiny, "mpc", p, seeds)["cost_usd"] for p in points]
    first = tune(tiny, "mpc", n_samples=2, n_seeds=1, seed=1, workers=2)
    assert first.trials == list(zip(points, costs, strict=True))
    assert first.params == points[int(np.argmin(costs))] and first.mean_cost == min(costs)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    again = tune(tiny, "mpc", n_samples=2, n_seeds=1, seed=1, workers=1, tracking_uri=uri)
    assert (again.params, again.mean_cost, again.default_cost, again.trials) == (
        first.params, first.mean_cost, first.default_cost, first.trials)

    client = MlflowClient(uri)
    parent = client.get_run(again.mlflow_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["kind"] == "mpc" and parent.data.params["scenario"] == "tiny"
    assert parent.data.metrics["best/validation/cost_usd"] == again.mean_cost
    assert parent.data.metrics["default/validation/cost_usd"] == again.default_cost
    for key, value in again.params.items():
        assert float(parent.data.params[f"best.{key}"]) == value
    runs = client.search_runs([parent.info.experiment_id])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(points)
    for child in children:
        k = int(child.data.params["point"])
        assert float(child.data.params["max_util"]) == again.trials[k][0]["max_util"]
        assert child.data.metrics["validation/cost_usd"] == again.trials[k][1]
        assert "validation/energy_usd" in child.data.metrics


def test_a_failing_trial_is_an_error_naming_its_point(tiny, ray_session, tmp_path):
    from cloudrl.scenarios.tuning import _search

    bad = {"no_such_knob": 1.0}  # MPCConfig refuses it inside the trial
    with pytest.raises(RuntimeError, match=r"scenario tuning \(mpc\): point 0 .*no_such_knob"):
        _search(tiny, "mpc", [bad], [validation_seeds(1)[0]], 1, "failing", str(tmp_path),
                None)
