"""The analysis of which control an offline model search changed
(experiments/analyses/analyse_offline_branches.py), on the tiny scenario."""

from __future__ import annotations

import json

import pytest
import torch

from cloudrl.algorithms.distill.policy import build_module, load_controller, save_checkpoint
from cloudrl.protocol import seeds_for
from envs.scenario.catalog import load_scenario
from envs.scenario.control import run_episode
from envs.scenario.sim import ScenarioSim
from experiments.analyses.analyse_offline_branches import Composed, main


def random_module(seed: int):
    torch.manual_seed(seed)
    m = build_module((8,))
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 1.0)
    return m


def test_compositions_take_each_control_from_the_right_network():
    searched, clone = random_module(0), random_module(1)
    obs = torch.randn(400, 34)
    s, c = searched.greedy(obs), clone.greedy(obs)
    assert torch.equal(Composed(searched, clone, "clone").greedy(obs), c)
    assert torch.equal(Composed(searched, clone, "searched").greedy(obs), s)
    mixed = Composed(searched, clone, "release_only").greedy(obs)
    assert torch.equal(mixed[:, 0], s[:, 0]) and torch.equal(mixed[:, 1], c[:, 1])
    low = Composed(searched, clone, "release_min").greedy(obs)
    high = Composed(searched, clone, "release_max").greedy(obs)
    assert (low[:, 0] <= high[:, 0]).all() and torch.equal(low[:, 1], c[:, 1])
    assert ((low[:, 0] == s[:, 0]) | (low[:, 0] == c[:, 0])).all()


def test_the_gated_composition_caps_the_release_only_above_the_gate():
    searched, clone = random_module(4), random_module(5)
    obs = torch.randn(600, 34)
    s, c = searched.greedy(obs), clone.greedy(obs)
    g = Composed(searched, clone, "gated", (26, 0.3)).greedy(obs)
    hot = obs[:, 26] > 0.3
    assert torch.equal(g[hot, 0], torch.minimum(s[hot, 0], c[hot, 0]))
    assert torch.equal(g[~hot, 0], s[~hot, 0]) and torch.equal(g[:, 1], s[:, 1])


def test_the_clone_and_searched_rows_are_those_policies_episodes(tmp_path, capsys):
    run = tmp_path / "run"
    save_checkpoint(random_module(2), run / "start", (8,), {"scenario": "tiny"})
    save_checkpoint(random_module(3), run / "policy", (8,), {"scenario": "tiny"})
    assert main(["--run", str(run), "--n-seeds", "2", "--json", str(tmp_path / "b.json")]) == 0
    res = json.loads((tmp_path / "b.json").read_text())
    assert set(res["policies"]) == {"clone", "searched", "release_only", "ready_only",
                                    "release_min", "release_max"}
    sim = ScenarioSim(load_scenario("tiny"))
    for name, sub in (("clone", "start"), ("searched", "policy")):
        ctrl = load_controller(run / sub)
        costs = [run_episode(sim, ctrl, s).metrics["cost_usd"] for s in seeds_for("validation", 2)]
        assert res["policies"][name]["per_seed_cost"] == pytest.approx(costs)
    assert "release_min" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--n-seeds", "0"], ["--n-seeds", "51"], [],
                                  ["--gate-share", "1.5"], ["--gate-data", "/nonexistent"]])
def test_bad_input_exits_2_with_one_line(tmp_path, argv, capsys):
    assert main(["--run", str(tmp_path / "none"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("analyse_offline_branches:")
