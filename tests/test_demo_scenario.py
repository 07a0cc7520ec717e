"""The demo's scenario part on the ``tiny`` scenario: a saved learned policy played live
against the tuned heuristic, the MPC and the oracle, the table's order, the verdict, the
picture, the MLflow run, and the demo's error paths."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from cloudrl.algorithms.distill.data import collect
from cloudrl.algorithms.distill.learner import fit
from cloudrl.algorithms.distill.policy import build_module, save_checkpoint
from cloudrl.cli import main
from cloudrl.mpc.forecast_mpc import ForecastMPC
from cloudrl.scenarios.demo import ORACLE, format_table, run_scenario_demo, verdict
from envs.scenario.catalog import load_scenario
from envs.scenario.sim import ScenarioSim

REFS = {"source": "test", "signal_aware": {"quantile": 0.4}, "mpc": {"max_util": 0.8}}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    demos = collect(ScenarioSim(load_scenario("tiny")), ForecastMPC(), [0])
    torch.manual_seed(0)
    module = build_module((16,))
    fit(module, demos.obs, demos.actions, epochs=3, batch_size=64, lr=3e-3,
        weight_decay=0.0, seed=0)
    path = tmp_path_factory.mktemp("ck") / "tiny"
    save_checkpoint(module, path, (16,), {"scenario": "tiny"})
    (path / "references.json").write_text(json.dumps(REFS))
    return path


@pytest.fixture(scope="module")
def played(checkpoint, tmp_path_factory):
    picture = tmp_path_factory.mktemp("demo") / "ep.png"
    return run_scenario_demo("tiny", str(checkpoint), n_seeds=2, workers=1, picture=picture)


def test_demo_plays_every_policy_on_the_same_seeds_and_sorts_the_online_ones(played):
    demo = played
    names = [r["policy"] for r in demo.rows]
    assert names[-1] == ORACLE and sorted(names[:-1]) == [
        "forecast MPC (tuned)", "heuristic (tuned)", "learned"]
    online = [r["cost_usd"] for r in demo.rows[:-1]]
    assert online == sorted(online)  # the learned row is first exactly when it is cheapest
    heur = next(r for r in demo.rows if r["policy"] == "heuristic (tuned)")
    learned = next(r for r in demo.rows if r["policy"] == "learned")
    assert "vs_heuristic_pct" not in heur
    d = learned["vs_heuristic_pct"]
    assert d[1] <= d[0] <= d[2]
    assert d[0] == pytest.approx(100 * (learned["cost_usd"] - heur["cost_usd"])
                                 / heur["cost_usd"])
    assert "decides" in learned["time"]
    assert Path(demo.picture).stat().st_size > 5000
    assert "references.json" in demo.notes[0] and "test" in demo.notes[0]
    text = format_table(demo)
    assert text.splitlines()[2].startswith(names[0])
    md = format_table(demo, markdown=True)
    assert md.count("\n") == len(demo.rows) + 1
    v = verdict(demo)
    assert "2 test seeds of tiny" in v and f"{d[0]:+.1f}%" in v


def test_verdict_says_plainly_when_the_learned_policy_loses(played):
    demo = copy.copy(played)
    demo.learned = {"vs_heuristic_pct": [3.0, 1.0, 5.0], "vs_mpc_pct": [4.0, 2.0, 6.0]}
    v = verdict(demo)
    assert "does not beat the tuned heuristic" in v
    assert "significantly more expensive than the forecast MPC" in v
    demo.learned = {"vs_heuristic_pct": [-3.0, -5.0, -1.0], "vs_mpc_pct": [-2.0, -3.0, -0.5]}
    v = verdict(demo)
    assert "beats the tuned heuristic" in v and "beats the forecast MPC" in v


def test_verdict_says_when_the_learned_policy_costs_less_than_the_oracle(played):
    from cloudrl.scenarios.demo import ORACLE

    demo = copy.copy(played)
    oracle = next(r for r in demo.rows if r["policy"] == ORACLE)["cost_usd"]
    rows = [dict(r) for r in demo.rows]
    for r in rows:
        if r["policy"] == "learned":
            r["cost_usd"] = oracle + 1.0
    demo.rows = rows
    assert "oracle" not in verdict(demo)
    for r in rows:
        if r["policy"] == "learned":
            r["cost_usd"] = oracle - 1.0
    v = verdict(demo)
    assert "costs less than the oracle" in v and "not a lower bound" in v


def test_demo_cli_scenario_part_logs_to_mlflow(checkpoint, tmp_path, capsys):
    from cloudrl import tracking

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rc = main(["demo", "--scenario", "tiny", "--checkpoint", str(checkpoint),
               "--scenario-seeds", "2", "--skip-training", "--tracking-uri", uri,
               "--scenario-img", str(tmp_path / "ep.png"), "--report-md",
               str(tmp_path / "demo.md")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "[1/2] tiny" in out and "vs heuristic" in out and "On 2 test seeds" in out
    client = tracking.make_client(uri)
    exp = client.get_experiment_by_name("cloudrl-demo")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.tags["scenario"] == "tiny"
    assert run.data.metrics["learned.cost_usd"] > 0
    assert "learned.vs_mpc_pct" in run.data.metrics
    page = (tmp_path / "demo.md").read_text()
    assert "tiny: the committed learned policy" in page and "| learned |" in page
    assert "](ep.png)" in page and "\n*tiny, one test episode: " in page  # the picture, captioned
    assert (tmp_path / "ep.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, needle", [
    (["--scenario", "no_such"], "no_such"),
    (["--checkpoint", "{tmp}/missing"], "missing"),
    (["--skip-scenario"], "nothing to run"),
])
def test_demo_bad_input_is_one_line_exit_2(argv, needle, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    extra = ["--skip-training"]
    rc = main(["demo", *argv, *extra, "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "m.db").exists()
