"""The yardstick ladder: rows in order, cost terms that add up, the bound below every
controller, paired differences, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.scenarios.yardstick import (
    LADDER,
    TERMS,
    YardstickConfig,
    attach_bound,
    format_markdown,
    summarise,
    with_terms,
)
from envs.scenario.catalog import load_scenario

CFG = load_scenario("tiny")
NAMES = [n for n in LADDER if n != "lower bound"] + ["learned"]


def _episode(rng: np.random.Generator) -> dict[str, float]:
    lc, batch = CFG.cost.sla_usd
    m = {"energy_usd": float(rng.uniform(0, 5)), "carbon_usd": float(rng.uniform(0, 2)),
         "violations_lc": float(rng.integers(0, 4)), "violations_batch": float(rng.integers(0, 4)),
         "transitions": float(rng.integers(0, 50)), "sla_lc": 0.01, "sla_batch": 0.02}
    m["sla_usd"] = m["violations_lc"] * lc + m["violations_batch"] * batch
    m["cost_usd"] = m["energy_usd"] + m["carbon_usd"] + m["sla_usd"]
    return m


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 8))
def test_rows_keep_the_ladder_order_and_their_terms_add_up(seed, n):
    rng = np.random.default_rng(seed)
    per = {name: [with_terms(CFG, _episode(rng)) for _ in range(n)] for name in NAMES}
    floor = [min(per[k][i]["cost_usd"] for k in per) - 0.1 for i in range(n)]
    out = summarise(CFG, list(range(n)), per, floor, {}, None, 0.0, YardstickConfig())
    assert [r["name"] for r in out["rows"]] == list(LADDER) + ["learned"]
    assert out["bound_below_every_controller"] is True
    for row in out["rows"][1:]:
        assert sum(row["terms"].values()) == pytest.approx(row["cost"], rel=1e-12, abs=1e-12)
        assert set(row["terms"]) == set(TERMS)
        d, lo, hi = row["diff_vs_heuristic_pct_ci95"]
        assert lo <= d <= hi
    heur = next(r for r in out["rows"] if r["name"] == "heuristic")
    assert heur["diff_vs_heuristic_pct_ci95"] == [0.0, 0.0, 0.0]
    learned = np.array(out["rows"][-1]["per_seed"])
    for row in out["rows"][1:-1]:
        assert row["learned_minus_this_ci95"][0] == pytest.approx(
            float((learned - np.array(row["per_seed"])).mean()))
    assert format_markdown(out).count("\n") == len(out["rows"]) + 1


def test_a_bound_above_any_controller_is_reported():
    rng = np.random.default_rng(0)
    per = {name: [with_terms(CFG, _episode(rng)) for _ in range(3)] for name in NAMES}
    out = summarise(CFG, [0, 1, 2], per, None, {}, None, 0.0, YardstickConfig())
    attach_bound(out, [-1.0, -1.0, 1e9])
    assert out["bound_below_every_controller"] is False
    assert out["rows"][0]["name"] == "lower bound"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "cloudrl", "scenarios", "yardstick", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("args", "needle"), [
    (["--scenario", "tiny", "--sim-mpc", "{samples: 2"], "--sim-mpc: not a JSON object"),
    (["--scenario", "tiny", "--hindsight", "[1, 2]"], "--hindsight: expected a JSON object"),
    (["--scenario", "tiny", "--n-seeds", "1"], "--n-seeds 1"),
    (["--scenario", "tiny", "--tune-samples", "0"], "--tune-samples"),
    (["--scenario", "tiny", "--checkpoint", "no/such/dir"], "no/such/dir"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    out = _cli(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr


def test_a_bound_file_without_the_test_seeds_is_refused(tmp_path):
    path = tmp_path / "bound.json"
    path.write_text(json.dumps({"per_seed": [{"seed": 1, "bound_usd": 2.0}]}))
    out = _cli("--scenario", "tiny", "--bound-from", str(path))
    assert out.returncode == 2 and "no bound for test seed" in out.stderr
    path.write_text("not json")
    out = _cli("--scenario", "tiny", "--bound-from", str(path))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_ladder_runs_end_to_end_on_tiny(tmp_path):
    out = _cli("--scenario", "tiny", "--n-seeds", "2", "--tune-samples", "2", "--tune-seeds",
               "2", "--sim-mpc", '{"samples":1,"horizon":2,"iterations":1,"population":4,'
               '"elites":2}', "--hindsight", '{"horizon":2,"iterations":1,"population":4,'
               '"elites":2}', "--workers", "1", "--json", str(tmp_path / "y.json"))
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "y.json").read_text())
    assert [r["name"] for r in data["rows"]] == list(LADDER)
    assert data["bound_below_every_controller"] is True


def test_sim_rows_from_a_bench_run_join_the_ladder_and_the_headline_row(tmp_path):
    from cloudrl.scenarios.yardstick import attach_sim, merge_into_headline

    rng = np.random.default_rng(3)
    per = {name: [with_terms(CFG, _episode(rng)) for _ in range(4)] for name in
           ("heuristic", "fluid MPC", "learned")}
    out = summarise(CFG, [5, 6, 7, 8], per, None, {}, None, 0.0, YardstickConfig())
    attach_bound(out, [-5.0] * 4)
    bench = {"test": {"seeds": [5, 6, 7, 8], "config": "K2", "table": {
        "sim_mpc_K2": {"per_seed": [1.0, 2.0, 3.0, 4.0], "replan_s": 0.5},
        "sim_hindsight": {"per_seed": [0.5, 1.0, 1.5, 2.0], "replan_s": 0.7}}}}
    attach_sim(out, bench)
    names = [r["name"] for r in out["rows"]]
    assert names == ["lower bound", "hindsight oracle", "sim-MPC", "fluid MPC", "heuristic",
                     "learned"]
    assert out["bound_below_every_controller"] is True
    learned = np.array(out["rows"][-1]["per_seed"])
    sim = next(r for r in out["rows"] if r["name"] == "sim-MPC")
    assert sim["learned_minus_this_ci95"][0] == pytest.approx(float(learned.mean() - 2.5))
    bench["test"]["seeds"] = [1, 2, 3, 4]
    with pytest.raises(ValueError, match="seeds differ"):
        attach_sim(out, bench)
    path = tmp_path / "headline.json"
    path.write_text(json.dumps({"scenarios": [{"scenario": CFG.name, "learned_cost": 1.0}]}))
    assert merge_into_headline(path, out)
    row = json.loads(path.read_text())["scenarios"][0]
    assert row["learned_cost"] == 1.0 and row["sim_mpc_cost"] == 2.5
    assert row["sim_mpc_replan_s"] == 0.5 and row["lower_bound_cost"] == -5.0
    assert row["diff_vs_sim_mpc_ci95"] == sim["learned_minus_this_ci95"]
    assert [d["name"] for d in row["decomposition"]] == names
    out["scenario"] = "other"
    assert not merge_into_headline(path, out)


def test_measured_sim_rows_join_a_saved_ladder_on_its_own_seeds(tmp_path):
    """``--from-json F --measure sim`` plays the three sim rows on the ladder's seeds (real
    episodes of ``tiny``), keeps the other rows, pairs them with the learned row and re-checks
    the bound; ``--measure`` without a ladder is one line, exit 2."""
    from cloudrl.mpc.bound import episode_bound
    from cloudrl.scenarios.runner import ControllerSpec, run_controllers

    seeds = [1_000_000, 1_000_001]
    heur, rule = run_controllers(CFG, [ControllerSpec("signal_aware", {}, "heuristic"),
                                       ControllerSpec("deadline_aware", {}, "learned")],
                                 seeds, workers=1)
    per = {"heuristic": [with_terms(CFG, m) for m in heur],
           "learned": [with_terms(CFG, m) for m in rule]}
    bound = [float(episode_bound(CFG, s).bound_usd) for s in seeds]
    out = summarise(CFG, seeds, per, bound, {"fluid MPC": {"params": {}}}, None, 0.0,
                    YardstickConfig(n_seeds=2))
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps(out))
    small = '{"samples":1,"horizon":2,"block_periods":1,"iterations":1,"population":3,"elites":1}'
    res = _cli("--scenario", "tiny", "--n-seeds", "2", "--from-json", str(path), "--measure",
               "sim", "--sim-mpc", small, "--hindsight", small, "--workers", "1", "--json",
               str(tmp_path / "with_sim.json"))
    assert res.returncode == 0, res.stderr
    got = json.loads((tmp_path / "with_sim.json").read_text())
    names = [r["name"] for r in got["rows"]]
    assert names == ["lower bound", "hindsight oracle", "sim-MPC, perfect forecasts", "sim-MPC",
                     "heuristic", "learned"]
    by = {r["name"]: r for r in got["rows"]}
    saved = {r["name"]: r for r in out["rows"]}
    assert by["heuristic"]["per_seed"] == saved["heuristic"]["per_seed"]
    for name in ("hindsight oracle", "sim-MPC", "sim-MPC, perfect forecasts"):
        r = by[name]
        assert len(r["per_seed"]) == 2 and r["replan_s"] > 0
        diff = np.array(by["learned"]["per_seed"]) - np.array(r["per_seed"])
        assert r["learned_minus_this_ci95"][0] == pytest.approx(float(diff.mean()))
        assert sum(r["terms"].values()) == pytest.approx(r["cost"], rel=1e-9)
    assert got["bound_below_every_controller"] is True
    res = _cli("--scenario", "tiny", "--measure", "sim")
    assert res.returncode == 2 and "--from-json" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
