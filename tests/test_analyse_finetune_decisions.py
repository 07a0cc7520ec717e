"""experiments/analyses/analyse_finetune_decisions.py on the tiny scenario: the shares are
shares, a policy never disagrees with itself, the binned tables cover every decision, and
the played episode costs what ``cloudrl scenarios evaluate`` says for that checkpoint."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from cloudrl.algorithms.distill.policy import build_module, save_checkpoint
from cloudrl.protocol import seeds_for
from cloudrl.scenarios.runner import ControllerSpec, run_controllers
from envs.scenario.catalog import load_scenario

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "analyses" / \
    "analyse_finetune_decisions.py"


def _script():
    spec = importlib.util.spec_from_file_location("analyse_finetune_decisions", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune_decisions")
    paths = []
    for seed, name in ((0, "finetuned"), (1, "start")):
        torch.manual_seed(seed)
        paths.append(save_checkpoint(build_module((16,)), root / name, (16,),
                                     {"scenario": "tiny"}))
    cfg = load_scenario("tiny")
    seed = seeds_for("test", 1)[0]
    mod = _script()
    return {"mod": mod, "cfg": cfg, "seed": seed, "ft": paths[0], "start": paths[1],
            "res": mod.analyse(cfg, paths[0], paths[1], {}, [seed]),
            "same": mod.analyse(cfg, paths[0], paths[0], {}, [seed])}


def test_disagreement_shares_are_shares_and_zero_against_itself(tiny):
    d = tiny["res"]["disagreement"]
    for key, value in d.items():
        if not key.startswith("mean"):
            assert 0.0 <= value <= 1.0, key
    same = tiny["same"]["disagreement"]
    assert same["release_vs_start"] == same["ready_vs_start"] == same["either_vs_start"] == 0
    for group in tiny["same"]["same_obs"].values():
        for row in group:
            assert row["release_differs"] in (None, 0.0)
            assert row["ready_differs"] in (None, 0.0)


def test_binned_tables_cover_every_decision_and_every_tick(tiny):
    res = tiny["res"]
    n = res["decisions"]
    assert n == len(tiny["res"]["runs"][0]["finetuned"]["t"]) > 0
    costs = res["costs"]
    for group, rows in res["same_obs"].items():
        assert sum(r["decisions"] for r in rows) == n, group
        assert sum(r["share"] for r in rows) == pytest.approx(1.0)
        for p in ("finetuned", "start", "mpc"):
            assert sum(r["decisions"][p] for r in res["own"][group]) == n
            assert sum(r["grid_kwh"][p] for r in res["own"][group]) == \
                pytest.approx(costs[p]["grid_kwh"])
            assert sum(r["energy_usd"][p] + r["carbon_usd"][p] + r["sla_usd"][p]
                       for r in res["own"][group]) == pytest.approx(costs[p]["cost_usd"])
    assert sum(map(sum, res["release_crosstab"])) == n
    assert sum(map(sum, res["margin_crosstab"])) == n
    assert "| spike |" in tiny["mod"].report(res)


def test_played_costs_equal_the_scenario_evaluate_path(tiny):
    specs = [ControllerSpec("learned", {"checkpoint": str(tiny["ft"])}, "learned"),
             ControllerSpec("learned", {"checkpoint": str(tiny["start"])}, "start"),
             ControllerSpec("mpc", {}, "mpc")]
    ref = run_controllers(tiny["cfg"], specs, [tiny["seed"]], workers=1)
    got = tiny["res"]["per_seed_cost"]
    assert got["finetuned"] == [ref[0][0]["cost_usd"]]
    assert got["start"] == [ref[1][0]["cost_usd"]]
    assert got["mpc"] == [ref[2][0]["cost_usd"]]


@pytest.mark.parametrize("argv, field", [
    (["--scenario", "nope"], "--scenario"),
    (["--scenario", "tiny", "--n-seeds", "0"], "--n-seeds"),
    (["--scenario", "tiny", "--workers", "3"], "--workers"),
    (["--scenario", "tiny", "--checkpoint", "/nonexistent/ckpt"], "--checkpoint"),
    (["--scenario", "tiny", "--references", "/nonexistent/refs.json"], "--references"),
])
def test_bad_input_is_one_line_naming_the_field_and_exit_2(tiny, argv, field, monkeypatch,
                                                            capsys):
    if field == "--references":  # a checkpoint that loads, so the references are reached
        argv = [*argv, "--checkpoint", str(tiny["ft"]), "--start", str(tiny["start"])]
    monkeypatch.setattr("sys.argv", ["analyse_finetune_decisions.py", *argv])
    with pytest.raises(SystemExit) as exc:
        tiny["mod"].main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]
