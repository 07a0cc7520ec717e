"""experiments/analyses/learned_vs_sim_mpc.py: more test seeds joined to a ladder's, the
paired interval over all of them, --reuse, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from cloudrl.scenarios.runner import ControllerSpec, paired_ci, run_controllers
from cloudrl.scenarios.yardstick import YardstickConfig, summarise, with_terms
from envs.scenario.catalog import load_scenario

SCRIPT = "experiments/analyses/learned_vs_sim_mpc.py"
SMALL = {"samples": 1, "horizon": 2, "block_periods": 1, "iterations": 1, "population": 3,
         "elites": 1, "replan_periods": 2}


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    """A two-seed ladder of ``tiny`` whose "learned" row is a checkpoint-free stand-in: the
    script takes the learned policy from --checkpoint, so the ladder's row is replaced."""
    cfg = load_scenario("tiny")
    seeds = [1_000_000, 1_000_001]
    specs = [ControllerSpec("signal_aware", {}, "heuristic"),
             ControllerSpec("sim_mpc", {**SMALL, "mpc": {}}, "sim-MPC")]
    rows = run_controllers(cfg, specs, seeds, workers=1)
    per = {s.name: [with_terms(cfg, m) for m in r] for s, r in zip(specs, rows, strict=True)}
    per["learned"] = per["heuristic"]
    out = summarise(cfg, seeds, per, None, {"fluid MPC": {"params": {}},
                                            "heuristic": {"kind": "signal_aware",
                                                          "params": {}}},
                    None, 0.0, YardstickConfig(n_seeds=2, sim_mpc=SMALL))
    path = tmp_path_factory.mktemp("lvs") / "ladder.json"
    path.write_text(json.dumps(out))
    return path, out


def test_more_seeds_join_the_ladder_and_reuse_plays_only_the_learned_policy(ladder, tmp_path):
    path, out = ladder
    ck = tmp_path / "ck"
    res = subprocess.run([sys.executable, "-m", "cloudrl", "scenarios", "distill", "--scenario",
                          "tiny", "--out", str(ck), "--expert-seeds", "1", "--dagger-rounds",
                          "0", "--val-seeds", "1"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    first = tmp_path / "first.json"
    res = _run("--scenario", "tiny", "--ladder", str(path), "--checkpoint", str(ck), "--from",
               "2", "--to", "4", "--json", str(first))
    assert res.returncode == 0, res.stderr
    got = json.loads(first.read_text())
    assert got["seeds"] == [1_000_000 + i for i in range(4)]
    by = {r["name"]: r for r in out["rows"]}
    for k in ("heuristic", "sim-MPC"):
        assert got["per_seed"][k][:2] == by[k]["per_seed"]
    d, lo, hi = paired_ci(np.array(got["per_seed"]["learned"]),
                          np.array(got["per_seed"]["sim-MPC"]))
    assert got["learned_minus_sim_mpc_ci95"] == pytest.approx([d, lo, hi])
    base = np.mean(got["per_seed"]["heuristic"])
    assert got["goal_met"] == bool(hi <= 0.005 * base)
    again = tmp_path / "again.json"
    headline = tmp_path / "headline.json"
    headline.write_text(json.dumps({"scenarios": [{"scenario": "spikes"},
                                                  {"scenario": "tiny", "policy": "p"}]}))
    res = _run("--scenario", "tiny", "--ladder", str(path), "--checkpoint", str(ck), "--from",
               "2", "--to", "4", "--reuse", str(first), "--json", str(again),
               "--headline-json", str(headline))
    assert res.returncode == 0, res.stderr
    assert json.loads(again.read_text())["per_seed"] == got["per_seed"]
    rows = json.loads(headline.read_text())["scenarios"]
    assert rows[0] == {"scenario": "spikes"} and rows[1]["policy"] == "p"
    more = rows[1]["diff_vs_sim_mpc_more_seeds"]
    assert more["n_test_seeds"] == 4 and more["ci95"] == pytest.approx([d, lo, hi])
    assert more["goal_met"] == got["goal_met"] and "--reuse" in more["command"]


@pytest.mark.parametrize("args, needle", [
    (["--scenario", "tiny", "--ladder", "/no/such/ladder.json"], "--ladder"),
    (["--scenario", "cold_standby"], "not 'cold_standby'"),
    (["--scenario", "tiny", "--from", "5", "--to", "5"], "--from 5 --to 5"),
    (["--scenario", "tiny", "--from", "1", "--to", "3"], "overlap"),
])
def test_bad_input_is_one_line_and_exit_2(ladder, args, needle):
    path, _ = ladder
    if "--ladder" not in args:
        args = [*args, "--ladder", str(path)]
    res = _run(*args)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
