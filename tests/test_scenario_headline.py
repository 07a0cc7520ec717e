"""``cloudrl headline --scenario``: paired statistics, goals, the JSON row, CLI errors, and
(slow) the whole smoke pipeline."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.cli import main
from cloudrl.scenarios.headline import (
    REACH_MPC_PCT,
    ScenarioHeadlineConfig,
    format_table,
    goals,
    merge_headline_json,
    summarise_run,
)


def _episodes(costs, lc=None, batch=None, p50=0.5):
    n = len(costs)
    lc = np.zeros(n) if lc is None else lc
    batch = np.zeros(n) if batch is None else batch
    return [{"cost_usd": float(c), "sla_lc": float(a), "sla_batch": float(b),
             "decide_p50_ms": p50, "decide_p99_ms": 2 * p50}
            for c, a, b in zip(costs, lc, batch, strict=True)]


def test_summary_of_a_run_that_is_cheaper_by_a_constant():
    heur = np.array([100.0, 110.0, 90.0, 105.0, 95.0])
    run = summarise_run("r", _episodes(heur - 5.0), _episodes(heur), _episodes(heur - 4.0),
                        _episodes(heur - 10.0))
    # exactly 5 $ cheaper on every seed: the interval collapses onto -5% of the mean (100)
    assert run["diff_vs_heuristic_pct"] == pytest.approx(-5.0)
    assert run["diff_vs_heuristic_ci95"] == pytest.approx([-5.0, -5.0])
    assert run["diff_vs_mpc_pct"] == pytest.approx(-1.0)
    assert run["gap_closed_pct"] == pytest.approx(50.0)
    g = goals(run)
    assert g["beats_heuristic"] and g["reaches_mpc"] and g["beats_mpc"]
    assert g["sla_not_higher"] and g["decides_in_budget"]


def test_goals_fail_when_sla_is_higher_or_decisions_are_slow():
    heur = np.linspace(90, 110, 8)
    lc_h = np.zeros(8)
    lc_l = np.full(8, 0.01) + np.linspace(0, 1e-3, 8)  # higher on every seed
    run = summarise_run("r", _episodes(heur - 1, lc=lc_l, p50=25.0), _episodes(heur, lc=lc_h),
                        _episodes(heur), _episodes(heur - 2))
    g = goals(run)
    assert not g["sla_not_higher"]
    assert not g["decides_in_budget"]
    assert g["beats_heuristic"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-3.0, 3.0), min_size=3, max_size=20), st.floats(0.0, 2.0))
def test_reaching_the_mpc_is_the_upper_end_of_the_paired_interval(noise, offset):
    heur = np.full(len(noise), 100.0)
    mpc = heur - 3.0
    learned = mpc + offset + np.asarray(noise)
    run = summarise_run("r", _episodes(learned), _episodes(heur), _episodes(mpc),
                        _episodes(heur - 8.0))
    assert goals(run)["reaches_mpc"] == (run["diff_vs_mpc_ci95"][1] <= REACH_MPC_PCT)
    lo, hi = run["diff_vs_mpc_ci95"]
    assert lo <= run["diff_vs_mpc_pct"] <= hi


def test_headline_json_rows_are_merged_by_scenario(tmp_path):
    path = tmp_path / "headline.json"
    base = {"policy": "p", "means": {}, "tiny": False}
    merge_headline_json(path, {"scenario": "b", "learned_cost": 1.0, **base})
    merge_headline_json(path, {"scenario": "a", "learned_cost": 2.0, **base})
    merge_headline_json(path, {"scenario": "b", "learned_cost": 3.0, **base})
    rows = json.loads(path.read_text())["scenarios"]
    assert [r["scenario"] for r in rows] == ["a", "b"]
    assert rows[1]["learned_cost"] == 3.0
    assert "means" not in rows[0]


def test_table_marks_the_claimed_run():
    heur = np.array([10.0, 11.0, 12.0])
    runs = [summarise_run(f"run{i}", _episodes(heur - i), _episodes(heur), _episodes(heur),
                          _episodes(heur - 3)) for i in range(3)]
    means = {n: {"cost_usd": 1.0, "sla_lc": 0.0, "sla_batch": 0.0}
             for n in ("heuristic", "mpc", "oracle", "run0", "run1", "run2")}
    row = {"scenario": "x", "n_test_seeds": 3, "heuristic_cost": 11.0, "means": means,
           "runs": runs, "policy": "run1", "mpc_solve_s": 0.01, "goals": goals(runs[1])}
    table = format_table(row)
    assert "run1 (claim: median run)" in table
    assert table.count("(claim: median run)") == 1


@pytest.mark.parametrize("argv, needle", [
    (["headline", "--scenario", "no_such"], "no_such"),
    (["headline", "--scenario", "tiny", "--n-test-seeds", "0"], "n-test-seeds"),
    (["headline", "--scenario", "tiny", "--families", "bogus"], "bogus"),
    (["headline", "--scenario", "tiny", "--reuse"], "--reuse"),
    (["headline", "--scenario", "tiny", "--dagger-rounds", "9", "--dagger-seeds", "5"],
     "only 50 exist"),
    (["headline", "--scenario", "tiny", "--distill-val-seeds", "0"], "distill-val-seeds"),
    (["headline", "--scenario", "tiny", "--safe-sla-weight", "0.5"], "safe-sla-weight"),
    (["headline", "--scenario", "tiny", "--params-from", "/no/such.json"], "/no/such.json"),
    (["headline", "--scenario", "tiny", "--override", "{bad"], "not JSON"),
    (["headline", "--scenario", "tiny", "--override", '{"executor": {"lc_reserve_cores": 99}}'],
     "lc_reserve_cores 99"),
    (["headline", "--scenario", "tiny", "--override", '{"executor": {"lc_reserve_cores": 8}}',
      "--families", "gated_dqn"], "distilled families only"),
    (["headline", "--scenario", "tiny", "--override", '{"executor": {"lc_reserve_cores": 8}}',
      "--families", "distill", "--publish", "x"], "no --publish"),
    (["headline", "--scenario", "tiny", "--es-params", "trunk"], "--es-params"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--n-servers", "0"], "--n-servers 0"),
    (["evaluate", "--scenario", "tiny", "--n-servers", "5000"], "--n-servers 5000"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--policy", "rllib"], "--checkpoint"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--policy", "learned"], "--checkpoint"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--checkpoint", "/no/such"], "/no/such"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--sla-budget", "0.001", "-1"],
     "--sla-budget"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--params", "nope"], "--params nope"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--override", "{bad"], "not JSON"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--override", "[1]"], "JSON object"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--override",
      '{"executor": {"spare_cores_frac": 2}}'], "executor.spare_cores_frac"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--override",
      '{"executor": {"spare": 0.1}}'], "executor.spare"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--override",
      '{"signals": {"forecast_error": NaN}}'], "signals.forecast_error"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--params", "[1]"], "JSON object"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--params", '{"signal-aware": {}}'],
     "unknown policy 'signal-aware'"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--params", '{"mpc": 3}'],
     "mpc's parameters"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--params",
      '{"signal_aware": {"bogus": 1}}'], "bogus"),
    # a rounded policy takes the parameters of the controller it rounds
    (["scenarios", "evaluate", "--scenario", "tiny", "--policy", "signal_aware_rounded",
      "--params", '{"signal_aware": {"bogus": 1}}'], "bogus"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--policy", "mpc_rounded",
      "--params", '{"mpc": {"max_util": "high"}}'], "max_util"),
])
def test_bad_scenario_headline_arguments_are_one_line_exit_2(argv, needle, capsys, tmp_path):
    extra = ["--out-dir", str(tmp_path), "--no-log"] if argv[0] == "headline" else []
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_sla_budget_prints_the_share_of_seeds_within_each_class(capsys, tmp_path):
    out = tmp_path / "ev.json"
    assert main(["scenarios", "evaluate", "--scenario", "tiny", "--policy", "signal_aware",
                 "--policy", "run_at_once", "--split", "validation", "--n-seeds", "3",
                 "--workers", "1", "--sla-budget", "0.001", "0", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "share of seeds within the SLA budget" in text
    ev = json.loads(out.read_text())
    for name, w in ev["within_budget"].items():
        per_seed = ev["policies"][name]["per_seed"]
        lc = [m["sla_lc"] <= 0.001 for m in per_seed]
        batch = [m["sla_batch"] <= 0.0 for m in per_seed]
        assert w["lc"] == pytest.approx(np.mean(lc))
        assert w["batch"] == pytest.approx(np.mean(batch))
        both = [a and b for a, b in zip(lc, batch, strict=True)]
        assert w["both"] == pytest.approx(np.mean(both))
        assert f"{name:14s} LC {w['lc']:6.0%}" in text


def test_defaults_run():
    cfg = ScenarioHeadlineConfig()
    assert cfg.n_test_seeds == 50 and len(cfg.run_seeds) >= 3


@pytest.mark.slow
def test_tiny_scenario_headline_end_to_end(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["headline", "--scenario", "tiny", "--tiny", "--out-dir", str(tmp_path),
                 "--tracking-uri", uri, "--workers", "1", "--families", "distill", "bdq"]) == 0
    out = capsys.readouterr().out
    assert "smoke run" in out and "claim: median run" in out
    res = json.loads((tmp_path / "tiny" / "result.json").read_text())
    assert res["n_test_seeds"] == 3 and len(res["runs"]) == 2
    assert set(res["validation"]["family_median_cost"]) == {"distill", "bdq"}
    assert res["family"] in ("distill", "bdq")
    assert res["heuristic_cost"] > 0 and res["learned_cost"] > 0
    assert (tmp_path / "tiny" / "headline.png").stat().st_size > 1000
    for r in res["runs"]:  # each run of the selected family left its checkpoint
        fam, run = r["policy"].split("-")
        assert (tmp_path / "tiny" / fam / run).is_dir()


@pytest.mark.slow
def test_a_headline_on_a_variant_trains_and_measures_the_variant(tmp_path, capsys):
    """``--override``: every episode of the headline is the variant's (the heuristic's test
    cost is the variant's, not the catalog scenario's), and the result says which."""
    from cloudrl.protocol import test_seeds
    from cloudrl.scenarios.runner import ControllerSpec, run_controllers
    from envs.scenario.catalog import load_scenario

    override = {"executor": {"spare_cores_frac": 0.5}}
    assert main(["headline", "--scenario", "tiny", "--tiny", "--out-dir", str(tmp_path),
                 "--no-log", "--workers", "1", "--families", "distill", "--override",
                 json.dumps(override)]) == 0
    capsys.readouterr()
    res = json.loads((tmp_path / "tiny" / "result.json").read_text())
    assert res["override"] == override
    heur = ControllerSpec("signal_aware", res["heuristic_params"])
    seeds = list(test_seeds(res["n_test_seeds"]))
    variant = run_controllers(load_scenario("tiny", override), [heur], seeds, 1)[0]
    plain = run_controllers(load_scenario("tiny"), [heur], seeds, 1)[0]
    assert res["heuristic_cost"] == pytest.approx(np.mean([m["cost_usd"] for m in variant]))
    assert res["heuristic_cost"] != pytest.approx(np.mean([m["cost_usd"] for m in plain]))


def test_published_references_feed_the_evaluate_command(tmp_path, capsys):
    from cloudrl.scenarios.cli import ALIASES, _reference_params

    assert _reference_params([str(tmp_path)]) is None
    ref = {"source": "tuned", "signal_aware": {"quantile": 0.3}, "mpc": {"max_util": 0.7}}
    (tmp_path / "references.json").write_text(json.dumps(ref))
    assert _reference_params(["/no/such/dir", str(tmp_path)]) == {
        "signal_aware": {"quantile": 0.3}, "mpc": {"max_util": 0.7}}
    assert "references.json" in capsys.readouterr().out
    assert ALIASES["power_aware"] == "signal_aware"
    # --params takes the same file (its "source" skipped) or the object inline
    from cloudrl.scenarios.cli import policy_params

    path = str(tmp_path / "references.json")
    assert policy_params(path) == policy_params(json.dumps({k: ref[k] for k in ref
                                                            if k != "source"}))
    assert policy_params(path)["mpc"] == {"max_util": 0.7}
    with pytest.raises(ValueError, match="unknown policy 'source'"):
        policy_params(json.dumps(ref))  # inline, every key must be a policy


@pytest.mark.parametrize("content, needle", [
    ("{not json", "not JSON (line 1"),
    ("[1, 2]", "neither a headroom JSON"),
    ('{"scenarios": [{"name": "other"}]}', "no scenario 'tiny'"),
    ('{"scenarios": [{"name": "tiny", "heuristic_params": 3}]}', "lacks heuristic_params"),
])
def test_bad_params_files_name_the_file_and_the_fault(tmp_path, content, needle):
    from cloudrl.scenarios.headline import read_params

    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="p.json") as e:
        read_params(str(path), "tiny")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_params_come_from_a_headroom_json_or_a_checkpoints_references(tmp_path):
    from cloudrl.scenarios.headline import read_params

    heur, mpc = {"quantile": 0.4}, {"max_util": 0.7}
    refs = tmp_path / "references.json"
    refs.write_text(json.dumps({"source": "x", "signal_aware": heur, "mpc": mpc}))
    assert read_params(str(refs), "tiny") == (heur, mpc)
    room = tmp_path / "headroom.json"
    room.write_text(json.dumps({"scenarios": [
        {"name": "other", "heuristic_params": {}, "mpc_params": {}},
        {"name": "tiny", "heuristic_params": heur, "mpc_params": mpc}]}))
    assert read_params(str(room), "tiny") == (heur, mpc)


def test_evaluate_on_another_fleet_size_scales_the_load(capsys):
    from envs.scenario.catalog import load_scenario

    base = load_scenario("tiny").fleet.n_servers
    costs = {}
    for n in (base, 3 * base):
        assert main(["scenarios", "evaluate", "--scenario", "tiny", "--policy", "run_at_once",
                     "--n-seeds", "1", "--workers", "1", "--n-servers", str(n)]) == 0
        out = capsys.readouterr().out
        assert f"tiny: N={n}, 1 test seeds" in out
        costs[n] = float(next(ln for ln in out.splitlines() if ln.startswith("run_at_once"))
                         .split()[1])
    assert 2.0 < costs[3 * base] / costs[base] < 4.0  # three times the fleet and its load


def test_override_plays_the_same_controllers_on_a_variant_of_the_scenario(capsys, tmp_path):
    """``--override`` merges into the scenario's definition: the default spare plays the
    catalog scenario episode for episode; a larger spare keeps more cores awake (more
    energy); the JSON and the header say which variant was played."""
    def play(override: str | None) -> dict:
        out = tmp_path / f"ev{len(list(tmp_path.iterdir()))}.json"
        extra = ["--override", override] if override is not None else []
        assert main(["scenarios", "evaluate", "--scenario", "tiny", "--policy", "signal_aware",
                     "--n-seeds", "2", "--workers", "1", "--json", str(out), *extra]) == 0
        return json.loads(out.read_text())

    from envs.scenario.catalog import load_scenario

    spare = load_scenario("tiny").executor.spare_cores_frac
    plain = play(None)
    same = play(json.dumps({"executor": {"spare_cores_frac": spare}}))
    more = play(json.dumps({"executor": {"spare_cores_frac": min(1.0, spare + 0.5)}}))
    out = capsys.readouterr().out
    assert plain["override"] is None and more["override"] == {
        "executor": {"spare_cores_frac": min(1.0, spare + 0.5)}}
    assert f"tiny with --override {json.dumps(more['override'])}: N=" in out

    def per_seed(ev: dict, key: str) -> list[float]:
        return [m[key] for m in ev["policies"]["signal_aware"]["per_seed"]]
    assert per_seed(same, "cost_usd") == per_seed(plain, "cost_usd")
    assert sum(per_seed(more, "energy_kwh")) > sum(per_seed(plain, "energy_kwh"))


def test_an_rllib_run_is_reused_only_with_the_same_config_and_gets_a_manifest(tmp_path,
                                                                             monkeypatch):
    from cloudrl.scenarios.headline import _rllib_trained, write_rllib_manifest
    from cloudrl.training import TrainConfig, write_meta
    from envs.scenario.catalog import load_scenario

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "gated_dqn" / "run1"
    out.mkdir(parents=True)
    tc = TrainConfig(algo="gated_dqn", scenario="tiny", run_seed=1, env_steps=480,
                     checkpoint_dir=str(out), scenario_heuristic={"quantile": 0.4})
    assert not _rllib_trained(out, tc)  # nothing there yet
    write_meta(out, tc)
    assert not _rllib_trained(out, tc)  # no RLlib checkpoint beside the meta
    (out / "rllib_checkpoint.json").write_text("{}")
    assert _rllib_trained(out, tc)
    for change in ({"env_steps": 960}, {"run_seed": 2},
                   {"scenario_heuristic": {"quantile": 0.5}}, {"scenario_sla_weight": 3.0}):
        assert not _rllib_trained(out, tc.model_copy(update=change)), change
    write_rllib_manifest(out, tc, load_scenario("tiny"), 12.5)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"].startswith(
        "cloudrl train --scenario tiny --algo gated_dqn --run-seed 1 --timesteps 480 "
        "--out gated_dqn/run1 --heuristic-params")
    assert manifest["wall_s"] == 12.5 and manifest["env_config"]["interface"] == "gated"
    assert "commit" in manifest and "dirty" in manifest and manifest["machine"]["cpus"] >= 1
    safe = tc.model_copy(update={"scenario_sla_weight": 3.0})
    write_rllib_manifest(out, safe, load_scenario("tiny"), 1.0)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"].endswith(" --sla-weight 3")
    assert manifest["env_config"]["sla_weight"] == 3.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(1, 100), st.booleans()), min_size=1,
                max_size=8))
def test_the_margin_pick_is_the_cheapest_candidate_that_keeps_sla(cands):
    from cloudrl.scenarios.gate_margin import RULE, pick

    rows = [{"margin": RULE, "cost_usd": 50.0, "keeps_sla": True}]
    rows += [{"margin": m, "cost_usd": c, "keeps_sla": k} for m, c, k in cands]
    best = pick(rows)
    assert best["keeps_sla"]
    assert best["cost_usd"] == min(r["cost_usd"] for r in rows if r["keeps_sla"]) <= 50.0
    if all(not k or c > 50.0 for _, c, k in cands):
        assert best["margin"] == RULE  # nothing cheaper keeps SLA: the rule itself


def test_a_republished_checkpoint_keeps_the_provenance_of_its_parameters(tmp_path):
    from cloudrl.scenarios.headline import ScenarioHeadlineConfig, _provenance

    tuned = "tuned by 'cloudrl headline --scenario tiny' (tuned on 8 validation seeds)"
    refs = tmp_path / "references.json"
    refs.write_text(json.dumps({"source": tuned, "signal_aware": {}, "mpc": {}}))
    cfg = ScenarioHeadlineConfig(scenario="tiny", params_from=str(refs), tiny=True)
    once = _provenance(cfg, "tiny", "reused from elsewhere")
    assert once.startswith(tuned) and once.endswith("--params-from'")
    refs.write_text(json.dumps({"source": once, "signal_aware": {}, "mpc": {}}))
    assert _provenance(cfg, "tiny", "reused from elsewhere") == once  # not appended twice
    fresh = ScenarioHeadlineConfig(scenario="tiny", tiny=True)
    assert _provenance(fresh, "tiny", "tuned on 2 seeds") == \
        "tuned by 'cloudrl headline --scenario tiny' (tuned on 2 seeds)"

