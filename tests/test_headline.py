"""cloudrl headline: config, paired statistics and goal, and the command end to end (tiny)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from cloudrl.cli import main
from cloudrl.config_loader import load_config
from cloudrl.headline.config import HeadlineConfig, resolved_hparams, tiny
from cloudrl.headline.report import (
    BOUND,
    OFFERED,
    REFERENCE,
    format_table,
    goal_verdict,
    paired,
    policy_rows,
)
from cloudrl.metrics import EpisodeMetrics

YAML = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "headline.yaml"


# ---------------------------------------------------------------- config


def test_shipped_config_is_valid_and_runs_the_headline_protocol():
    cfg = load_config(HeadlineConfig, YAML)
    assert cfg.workloads == ["poisson", "google_v2_like"]
    assert (cfg.n_servers, cfg.interface, cfg.test_seeds) == (50, "branching", 50)
    small = tiny(cfg)
    assert (small.n_servers, small.test_seeds, small.validation_seeds) == (5, 2, 2)
    assert small.train.algo == cfg.train.algo and small.train.env_steps < 5000


def test_tuned_marker_becomes_the_tuned_parameters():
    params = {"spare_floor": 1.5}
    assert resolved_hparams({"lr": 1e-3, "heuristic": "tuned"}, params) == {
        "lr": 1e-3, "heuristic": params}
    assert resolved_hparams({"a": {"heuristic": "tuned"}}, params) == {"a": {"heuristic":
                                                                            params}}
    assert resolved_hparams({"heuristic": "power_aware"}, params) == {"heuristic":
                                                                      "power_aware"}


@pytest.mark.parametrize(("yaml", "message"), [
    ("train: {algo: nope}", "train.algo"),
    ("train: {hparams: {lrr: 0.1}}", "train.hparams"),
    ("tune: {num_samples: 0}", "tune.num_samples"),
    ("workloads: [trace]", "workloads.0"),
    ("interface: flat", "acts on the branching interface, interface is flat"),
    ("baselines: [sjf, best]", "unknown heuristic 'best'"),
    ("n_server: 5", "n_server"),
])
def test_bad_field_is_one_line_exit_2(tmp_path, capsys, yaml, message):
    path = tmp_path / "h.yaml"
    path.write_text(yaml)
    assert main(["headline", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


# ---------------------------------------------------------------- report


def _eps(policy: str, energies, violations) -> list[EpisodeMetrics]:
    return [EpisodeMetrics(policy, 1_000_000 + i, e, v, 1.0, 0.0, 0.5, 3, -10 * e - 60 * v, 100,
                           0) for i, (e, v) in enumerate(zip(energies, violations, strict=True))]


def test_paired_difference_uses_per_seed_pairs():
    mean, ci = paired([10.0, 20.0, 30.0], [9.0, 19.0, 29.0])
    assert mean == pytest.approx(1.0) and ci == pytest.approx(0.0)  # unpaired CI would be wide
    with pytest.raises(ValueError, match="length"):
        paired([1.0], [1.0, 2.0])


def test_rows_judge_pareto_dominance_and_gap_closed():
    ref = _eps(REFERENCE, [100, 110, 120, 130], [0.0, 0.0, 0.001, 0.0])
    better = _eps("learned", [90, 99, 111, 118], [0.0, 0.0, 0.001, 0.0])  # ~10.5 kWh less
    worse_sla = _eps("greedy", [80, 85, 90, 95], [0.01, 0.02, 0.01, 0.03])
    bound = [60.0, 70.0, 80.0, 90.0]  # gap of the reference: 40 kWh
    rows = policy_rows({REFERENCE: ref, "learned": better, "greedy": worse_sla}, bound,
                       violation_margin_pp=0.05, gap_goal=0.3, learned="learned")
    by = {r["policy"]: r for r in rows}
    assert by["learned"]["energy_diff_mean"] == pytest.approx(-10.5)
    assert by["learned"]["energy_better"] and by["learned"]["violations_not_worse"]
    assert by["learned"]["pareto_dominates"]
    assert by["learned"]["gap_closed"] == pytest.approx(10.5 / 40)
    assert not by["learned"]["gap_goal_met"]  # 26% < 30%
    assert by["greedy"]["energy_better"] and not by["greedy"]["violations_not_worse"]
    assert by["greedy"]["gap_closed"] == pytest.approx(27.5 / 40)
    assert by[REFERENCE]["gap_closed"] == 0.0 and not by[REFERENCE]["energy_better"]
    assert by[BOUND]["energy_kwh_mean"] == pytest.approx(75.0)
    verdict = goal_verdict({"poisson": rows}, gap_goal=0.3)
    assert verdict["pareto_dominates"] == {"poisson": True} and not verdict["met"]
    assert not goal_verdict({"poisson": rows}, gap_goal=0.3)["gap_goal_met"]
    assert goal_verdict({"poisson": rows}, gap_goal=0.25)["met"]
    table = format_table(rows)
    assert "| learned (learned) | 104.50 ± " in table and "| 26% |" in table
    assert OFFERED not in by  # only with offered_kwh


def test_rows_report_the_gap_to_the_offered_work_reference():
    ref = _eps(REFERENCE, [100, 110, 120, 130], [0.0, 0.0, 0.001, 0.0])
    better = _eps("learned", [90, 99, 111, 118], [0.0, 0.0, 0.001, 0.0])  # 10.5 kWh less
    rows = policy_rows({REFERENCE: ref, "learned": better}, [60.0, 70.0, 80.0, 90.0],
                       violation_margin_pp=0.05, gap_goal=0.3, learned="learned",
                       offered_kwh=[90.0, 100.0, 110.0, 120.0])  # 10 kWh below the reference
    by = {r["policy"]: r for r in rows}
    assert by["learned"]["gap_closed_offered"] == pytest.approx(10.5 / 10)
    assert by["learned"]["gap_closed"] == pytest.approx(10.5 / 40)  # the goal's, unchanged
    assert by[OFFERED]["energy_kwh_mean"] == pytest.approx(105.0)
    assert by[OFFERED]["gap_closed"] == pytest.approx(10 / 40)
    assert by[BOUND]["gap_closed_offered"] == pytest.approx(40 / 10)
    assert goal_verdict({"poisson": rows}, gap_goal=0.3)["gap_closed"]["poisson"] == \
        pytest.approx(10.5 / 40)  # the verdict stays on the bound
    table = format_table(rows)
    assert "| 26% | 105% |" in table and f"| {OFFERED} |" in table


# ---------------------------------------------------------------- end to end


def test_headline_runs_end_to_end_at_tiny_size(ray_session, tmp_path, capsys):
    from mlflow import MlflowClient

    cfg_file = tmp_path / "headline.yaml"
    text = YAML.read_text().replace("workloads: [poisson, google_v2_like]",
                                    "workloads: [poisson]")
    assert "workloads: [poisson]\n" in text
    cfg_file.write_text(text)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "res"
    assert main(["headline", "--config", str(cfg_file), "--tiny", "--out-dir", str(out),
                 "--tracking-uri", uri]) == 0
    printed = capsys.readouterr().out
    assert "goal met: " in printed
    run_dir = next(out.glob("headline-tiny-*"))
    for name in ("table.md", "table.csv", "rows.json", "headline.json", "pareto.png",
                 "learning_curves.png", "config.json", "poisson/episodes.json",
                 "poisson/tuned_power_aware.json"):
        assert (run_dir / name).is_file(), name
    with (run_dir / "table.csv").open() as f:
        policies = [r["policy"] for r in csv.DictReader(f)]
    assert policies[:3] == ["round_robin", "power_aware", "power_aware_tuned"]
    algo = load_config(HeadlineConfig, cfg_file).train.algo
    assert policies[3].startswith(f"{algo}:") and policies[4] == "lower_bound"
    summary = json.loads((run_dir / "headline.json").read_text())
    sel = summary["workloads"]["poisson"]["selection"]
    assert [s["candidate"] for s in sel["scores"]] == ["iter_00001", "final"]
    assert sel["selected"]["candidate"] in ("iter_00001", "final")
    assert policies[3] == f"{algo}:{sel['selected']['candidate']}"
    episodes = json.loads((run_dir / "poisson" / "episodes.json").read_text())
    assert [e["seed"] for e in episodes["episodes"]["power_aware_tuned"]] == [1_000_000,
                                                                              1_000_001]
    assert [b["seed"] for b in episodes["bounds"]] == [1_000_000, 1_000_001]
    for eps in episodes["episodes"].values():  # the bound is below every zero-violation episode
        for e, b in zip(eps, episodes["bounds"], strict=True):
            assert e["sla_violation_rate"] > 0 or b["energy_kwh"] <= e["energy_kwh"]
    assert isinstance(summary["goal"]["met"], bool)
    assert not math.isnan(summary["workloads"]["poisson"]["rows"][0]["energy_kwh_mean"])
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("cloudrl-headline")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("phase") == "headline"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    wl = [r for r in runs if r.data.tags.get("phase") == "headline_workload"]
    assert [r.data.tags["mlflow.parentRunId"] for r in wl] == [parent[0].info.run_id]
    tune = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == wl[0].info.run_id]
    assert [r.data.tags["phase"] for r in tune] == ["tune_heuristic"]
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == tune[0].info.run_id]
    assert len(trials) == 2 and all("train/reward_mean" in r.data.metrics for r in trials)
    assert "test/power_aware_tuned/energy_kwh_mean" in wl[0].data.metrics
    assert "validation/reward_mean" in wl[0].data.metrics
    assert client.get_metric_history(wl[0].info.run_id, "train/env_steps")
