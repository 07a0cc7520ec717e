"""The out-of-sample SLA check and the ready-margin fix: the unseen seeds lie outside every
split, the paired comparison's numbers, the constrained selection, the lifted grids, and a
lifted checkpoint keeping more cores ready than its source in the same state."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.protocol import N_SEEDS, SPLITS, seeds_for
from experiments.analyses import lc_constrained_fix as fix
from experiments.analyses import sla_out_of_sample as oos

ROOT = Path(__file__).resolve().parents[1]
SLL = ROOT / "checkpoints" / "scarcity_low_load"


def test_unseen_seeds_are_outside_every_split() -> None:
    unseen = set(oos.unseen_seeds(N_SEEDS))
    assert len(unseen) == N_SEEDS
    for split in SPLITS:
        assert not unseen & set(seeds_for(split, N_SEEDS)), split
    assert min(unseen) == oos.UNSEEN_SEED_OFFSET == 2_000_000


@given(st.integers(1, N_SEEDS))
def test_unseen_seeds_prefix(n: int) -> None:
    seeds = oos.unseen_seeds(n)
    assert len(seeds) == n and seeds == oos.unseen_seeds(N_SEEDS)[:n]
    assert oos.seed_set("unseen", n) == seeds
    assert oos.seed_set("test", n)[0] == 1_000_000


@pytest.mark.parametrize("n", [0, 51, True, 2.0])
def test_unseen_seeds_bad_count(n) -> None:
    with pytest.raises(ValueError, match="n_seeds"):
        oos.unseen_seeds(n)


def _metrics(cost: float, lc: float, batch: float, jobs: float = 1000.0) -> dict[str, float]:
    return {"cost_usd": cost, "energy_usd": 0.8 * cost, "carbon_usd": 0.1 * cost,
            "sla_usd": 0.1 * cost, "sla_lc_usd": lc, "sla_batch_usd": 2 * batch,
            "violations_lc": lc, "violations_batch": batch,
            "sla_lc": lc / jobs, "sla_batch": batch / jobs, "jobs_lc": jobs,
            "jobs_batch": jobs}


def test_compare_pairs_by_seed() -> None:
    learned = [_metrics(c, lc, 0.0) for c, lc in [(40, 3), (42, 4), (38, 3), (41, 5)]]
    heur = [_metrics(c, lc, 2.0) for c, lc in [(50, 1), (52, 2), (47, 1), (50, 2)]]
    out = oos.compare(learned, heur)
    lc = out["latency_critical"]["violations_per_episode"]
    assert lc["learned"] == pytest.approx(3.75) and lc["heuristic"] == pytest.approx(1.5)
    assert lc["diff"] == pytest.approx(2.25)
    # paired: differences 2, 2, 2, 3 -> sd 0.5, t(0.975, 3) = 3.182
    assert lc["ci95"] == pytest.approx([2.25 - 3.182 * 0.25, 2.25 + 3.182 * 0.25], abs=1e-3)
    assert out["latency_critical"]["significantly_higher"]
    assert not out["latency_critical"]["not_higher"]
    assert out["batch"]["not_higher"] and not out["batch"]["significantly_higher"]
    assert out["cost_usd"]["diff"] == pytest.approx(-9.5)
    assert out["cost_usd"]["diff_pct"] == pytest.approx(-9.5 / 49.75 * 100)
    assert out["latency_critical"]["violation_rate_pct"]["diff"] == pytest.approx(0.225)
    assert out["sla_batch_usd"]["diff"] == pytest.approx(-4.0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(10, 100), st.integers(0, 20), st.integers(0, 20)),
                min_size=2, max_size=12))
def test_compare_with_itself_is_not_higher(rows) -> None:
    ms = [_metrics(c, lc, b) for c, lc, b in rows]
    out = oos.compare(ms, ms)
    for cls in ("latency_critical", "batch"):
        assert out[cls]["violations_per_episode"]["diff"] == 0.0
        assert out[cls]["not_higher"] and not out[cls]["significantly_higher"]


@pytest.mark.parametrize("diff, ci, expected", [
    (-0.2, [-0.5, 0.1], True),    # overlaps 0, mean below
    (0.1, [-0.3, 0.5], False),    # overlaps 0, mean above
    (-0.5, [-0.8, -0.1], True),   # wholly below
    (0.5, [0.1, 0.9], False),     # wholly above
])
def test_not_higher_bar(diff, ci, expected) -> None:
    assert oos.not_higher({"diff": diff, "ci95": ci}) is expected


def _row(name: str, cost: float, lc: float, lc_h: float = 1.5, upper: float = 0.3) -> dict:
    return {"name": name, "cost": cost, "lc": lc, "lc_heuristic": lc_h,
            "lc_ci95": [upper - 1.0, upper]}


def test_constrained_pick_keeps_the_cheapest_within_the_constraint() -> None:
    rows = [_row("published", 40.0, 1.9), _row("offset_0.1", 41.0, 1.6),
            _row("offset_0.2", 42.0, 1.4, upper=-0.1), _row("offset_0.3", 44.0, 1.0,
                                                            upper=-0.4)]
    assert fix.constrained_pick(rows)["name"] == "offset_0.2"
    assert fix.constrained_pick(rows, "upper")["name"] == "offset_0.2"
    rows[3]["cost"] = 41.5
    assert fix.constrained_pick(rows)["name"] == "offset_0.3"
    assert fix.constrained_pick([_row("a", 40.0, 2.0, upper=0.5)]) is None
    assert fix.constrained_pick([_row("a", 40.0, 1.5, upper=0.5)])["name"] == "a"  # equal
    assert fix.constrained_pick([_row("a", 40.0, 1.5, upper=0.5)], "upper") is None
    with pytest.raises(ValueError, match="rule"):
        fix.constrained_pick(rows, "median")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 100), st.floats(0, 5)), min_size=1, max_size=8),
       st.floats(0, 5))
def test_constrained_pick_invariants(pairs, lc_h) -> None:
    rows = [_row(str(i), c, lc, lc_h) for i, (c, lc) in enumerate(pairs)]
    got = fix.constrained_pick(rows)
    ok = [r for r in rows if r["lc"] <= lc_h]
    if not ok:
        assert got is None
    else:
        assert got["lc"] <= lc_h and got["cost"] == min(r["cost"] for r in ok)


def test_lifted_margins() -> None:
    base = (0.0, 0.25, 0.5, 1.0)
    assert fix.lifted_margins(base, "offset", 0.2) == pytest.approx((0.2, 0.45, 0.7, 1.2))
    assert fix.lifted_margins(base, "floor", 0.15) == pytest.approx((0.15, 0.25, 0.5, 1.0))
    with pytest.raises(ValueError, match="floor 0.3"):
        fix.lifted_margins(base, "floor", 0.3)
    with pytest.raises(ValueError, match="ready_margins"):
        fix.lifted_margins(base, "offset", 2.5)  # leaves [-1, 3]
    with pytest.raises(ValueError, match="kind"):
        fix.lifted_margins(base, "scale", 2.0)


def test_lifted_checkpoint_keeps_more_cores_ready(tmp_path) -> None:
    """Same weights, same state: the lifted grid's ready cores are at least the source's
    at every decision of a real episode of the source (and above it at some)."""
    from cloudrl.algorithms.distill.policy import load_controller
    from envs.scenario.catalog import load_scenario
    from envs.scenario.sim import ScenarioSim

    dst = fix.write_variant(SLL, tmp_path / "v", fix.lifted_margins(
        (0.0, 0.25, 0.5, 1.0), "offset", 0.3), {"kind": "offset", "value": 0.3})
    assert (dst / "policy.pt").read_bytes() == (SLL / "policy.pt").read_bytes()
    src_c, dst_c = load_controller(SLL), load_controller(dst)
    assert dst_c.ready_margins == pytest.approx((0.3, 0.55, 0.8, 1.3))
    sim = ScenarioSim(load_scenario("scarcity_low_load"))
    sim.reset(123)
    src_c.reset(sim)
    dst_c.reset(sim)
    pairs = []
    while sim.t < 60 * sim.cfg.decision_ticks and not sim.done:
        if sim.t % sim.cfg.decision_ticks == 0:
            a, b = src_c.decide(sim), dst_c.decide(sim)
            pairs.append((a, b))
            sim.set_controls(*a)
        sim.tick()
    ready = np.array([[a[1], b[1]] for a, b in pairs])
    assert [a[0] for a, _ in pairs] == [b[0] for _, b in pairs]  # release unchanged
    assert np.all(ready[:, 1] >= ready[:, 0] - 1e-9)
    assert np.any(ready[:, 1] > ready[:, 0] + 1.0)


def test_publish_writes_the_candidate_and_keeps_the_rest(tmp_path) -> None:
    import shutil

    to = tmp_path / "pub"
    shutil.copytree(SLL, to)
    kept = {n: (to / n).read_bytes() for n in ("references.json", "start/policy.pt")}
    parent = json.loads((to / "manifest.json").read_text())
    grid = fix.lifted_margins((0.0, 0.25, 0.5, 1.0), "floor", 0.1)
    chosen = fix.write_variant(to, tmp_path / "c", grid, {"kind": "floor", "value": 0.1})
    fix.publish(chosen, to, {"chosen": "floor_0.1"})
    assert json.loads((to / "policy.json").read_text())["ready_margins"] == \
        pytest.approx(list(grid))
    man = json.loads((to / "manifest.json").read_text())
    assert man["selection"] == {"chosen": "floor_0.1"} and man["parent"] == parent
    assert man["history"] == parent["history"]  # a grid keeps the fine-tune's record
    assert all((to / n).read_bytes() == b for n, b in kept.items())
    # a fine-tuned candidate: its weights and manifest, the replaced manifest as parent
    es_dir = tmp_path / "es"
    shutil.copytree(SLL, es_dir)
    (es_dir / "manifest.json").write_text(json.dumps({"command": "es", "history": []}))
    fix.publish(es_dir, to, None)
    man2 = json.loads((to / "manifest.json").read_text())
    assert man2["command"] == "es" and man2["parent"]["selection"] == {"chosen": "floor_0.1"}
    spec = json.loads((es_dir / "policy.json").read_text())
    spec["action_nvec"] = [5, 4]
    (es_dir / "policy.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="action_nvec differs"):
        fix.publish(es_dir, to, None)


@settings(max_examples=30, deadline=None)
@given(st.floats(0, 100), st.floats(0, 1000), st.integers(0, 30), st.integers(0, 30))
def test_lc_penalty_prices_each_violation(cost, weight, a, b) -> None:
    f = fix.LCPenalty(weight)
    m = {"cost_usd": cost, "violations_lc": float(a), "violations_batch": 3.0}
    assert f(m) == pytest.approx(cost + weight * a)
    more = dict(m, violations_lc=float(a + b))
    assert f(more) - f(m) == pytest.approx(weight * b)


@pytest.mark.parametrize("argv, needle", [
    (["--checkpoint", "nope=dir"], "SCENARIO=DIR"),
    (["--checkpoint", "scarcity_low_load=/nonexistent"], "no policy.json"),
    (["--n-seeds", "0"], "n_seeds"),
    (["--workers", "0"], "--workers"),
])
def test_out_of_sample_bad_input(argv, needle, capsys) -> None:
    assert oos.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err


@pytest.mark.parametrize("argv, needle", [
    (["select", "--scenario", "scarcity_low_load", "--checkpoint", "/nonexistent",
      "--out", "x"], "no policy.pt"),
    (["select", "--scenario", "scarcity_low_load", "--n-val-seeds", "60", "--out", "x"],
     "n_seeds"),
    (["publish", "--chosen", "/nonexistent", "--to", str(SLL)], "no policy.pt"),
    (["es", "--scenario", "scarcity_low_load", "--lc-weight", "-1", "--out", "x"],
     "--lc-weight"),
    (["select", "--scenario", "scarcity_low_load", "--candidate", "a", "--out", "x"],
     "NAME=DIR"),
])
def test_fix_bad_input(argv, needle, capsys) -> None:
    assert fix.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err


def test_committed_out_of_sample_data() -> None:
    data = json.loads((ROOT / "docs/results/data/sla_out_of_sample.json").read_text())
    assert data["seeds"] == {"set": "unseen", "first": 2_000_000, "last": 2_000_049, "n": 50}
    assert {r["scenario"] for r in data["scenarios"]} == set(oos.SCENARIOS)
    for r in data["scenarios"]:
        assert len(r["per_seed"]["learned"]) == len(r["per_seed"]["heuristic"]) == 50
        lc = r["latency_critical"]["violations_per_episode"]
        assert lc["learned"] == pytest.approx(
            np.mean([m["violations_lc"] for m in r["per_seed"]["learned"]]))


def test_headline_row_remeasures_the_claim() -> None:
    """On the tiny scenario and 2 test seeds: the claim's fields are the new run's, the
    other runs stay, the goals follow the intervals."""
    row = {"scenario": "tiny", "policy": "old", "n_test_seeds": 2,
           "heuristic_params": {}, "mpc_params": {}, "command": "cloudrl headline ...",
           "runs": [{"policy": "old", "learned_cost": 1.0}, {"policy": "other"}]}
    out = fix.headline_row(row, str(SLL), "new", workers=1)
    assert out["policy"] == "new" and out["command"] == row["command"]
    assert [r["policy"] for r in out["runs"]] == ["old", "other", "new"]
    new = out["runs"][-1]
    assert out["learned_cost"] == new["learned_cost"] == out["learned_cost_on_yardstick_seeds"]
    assert out["goals"]["beats_heuristic"] == (new["diff_vs_heuristic_ci95"][1] < 0)
    lo, hi = out["diff_vs_heuristic_ci95"]
    assert lo <= new["diff_vs_heuristic_pct"] <= hi
    assert out["lc_fix"]["replaces"] == "old"
    assert set(out["sla_by_class"]) == {"heuristic", "mpc", "learned"}
    assert out["heuristic_cost"] > 0 and out["oracle_cost"] > 0


def test_repick_applies_another_rule_without_replaying(tmp_path) -> None:
    dirs = {}
    for name in ("cheap", "safe"):
        d = dirs[name] = tmp_path / name
        d.mkdir()
        for f in fix.FILES:
            (d / f).write_text(name)
    rows = [dict(_row("cheap", 40.0, 1.4, upper=0.4), checkpoint=str(dirs["cheap"])),
            dict(_row("safe", 41.0, 0.9, upper=-0.1), checkpoint=str(dirs["safe"]))]
    sel = {"rule": "mean", "chosen": "cheap", "candidates": rows}
    out = fix.repick(sel, "upper", tmp_path / "o")
    assert out["chosen"] == "safe" and out["rule"] == "upper"
    assert out["chosen_by_rule"] == {"mean": "cheap", "upper": "safe"}
    assert (tmp_path / "o" / "chosen" / "policy.pt").read_text() == "safe"
    assert out["candidates"] == rows


def test_published_low_load_records_its_constrained_selection() -> None:
    """The re-published scarcity_low_load policy: chosen on validation seeds only by the
    rule its manifest names, from the candidates it lists; the replaced manifest kept."""
    import hashlib

    from cloudrl.algorithms.distill.policy import load_controller

    man = json.loads((SLL / "manifest.json").read_text())
    sel = man["selection"]
    assert sel["validation_seeds"]["first"] == 500_000 and sel["validation_seeds"]["n"] == 50
    assert fix.constrained_pick(sel["candidates"], sel["rule"])["name"] == sel["chosen"]
    chosen = next(r for r in sel["candidates"] if r["name"] == sel["chosen"])
    assert chosen["lc_ci95"][1] <= 0.0 and chosen["lc"] <= chosen["lc_heuristic"]
    assert man["objective"]["lc_weight"] > 0 and man["seeds"]["test"] == []
    assert man["parent"]["command"].startswith("cloudrl scenarios es")
    digest = hashlib.sha256((SLL / "policy.pt").read_bytes()).hexdigest()
    assert man["init_digest"] != digest  # fine-tuned from the replaced weights
    assert load_controller(SLL).ready_margins == (0.0, 0.25, 0.5, 1.0)


def _oos_file(rows: list[tuple[str, float]], n: int = 50) -> dict:
    return {"command": "full run", "wall_s": 400.0,
            "seeds": {"set": "unseen", "first": 2_000_000, "last": 2_000_000 + n - 1, "n": n},
            "scenarios": [{"scenario": s, "cost": c, "wall_s": 9.0} for s, c in rows]}


def test_merge_replaces_only_the_measured_rows() -> None:
    old = _oos_file([("scarcity_spikes", 70.0), ("cold_standby", 77.0),
                     ("demand_response", 80.0)])
    new = dict(_oos_file([("cold_standby", 74.5), ("scarcity_low_load", 48.0)]),
               command="one scenario", wall_s=120.0)
    out = oos.merge_rows(old, new)
    assert [(r["scenario"], r["cost"]) for r in out["scenarios"]] == [
        ("scarcity_spikes", 70.0), ("cold_standby", 74.5), ("demand_response", 80.0),
        ("scarcity_low_load", 48.0)]
    assert out["command"] == "full run" and out["wall_s"] == 400.0
    assert out["scenarios"][1]["command"] == "one scenario"
    assert out["scenarios"][1]["merged_wall_s"] == 120.0
    assert "command" not in out["scenarios"][0]
    with pytest.raises(ValueError, match="seeds"):
        oos.merge_rows(old, _oos_file([("cold_standby", 1.0)], n=10))


def test_merge_bad_input(tmp_path, capsys) -> None:
    assert oos.main(["--merge", "--json", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--merge" in err
    f = tmp_path / "ten.json"
    f.write_text(json.dumps(_oos_file([("cold_standby", 1.0)], n=10)))
    assert oos.main(["--merge", "--json", str(f), "--scenario", "cold_standby"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "seeds" in err
    assert json.loads(f.read_text())["seeds"]["n"] == 10  # the file is left as it was


def test_grids_a_checkpoint_cannot_take_are_left_out(tmp_path, capsys) -> None:
    """A finer grid reaching below 0 (cold_standby's): the floors, below its second level,
    are left out with a line each; every offset is written."""
    import argparse
    import shutil

    src = tmp_path / "src"
    shutil.copytree(SLL, src, ignore=shutil.ignore_patterns("start"))
    spec = json.loads((src / "policy.json").read_text())
    spec["ready_margins"] = [-0.4, -0.2, 0.0, 0.3, 0.6, 1.1]
    (src / "policy.json").write_text(json.dumps(spec))
    args = argparse.Namespace(grids=True, out=str(tmp_path / "out"), candidate=["x=dir"])
    paths = fix._candidates(args, src)
    offsets = [f"offset_{v:g}" for k, v in fix.GRIDS if k == "offset"]
    assert list(paths) == ["published", *offsets, "x"]
    lifted = json.loads((Path(paths["offset_0.3"]) / "policy.json").read_text())
    assert lifted["ready_margins"] == pytest.approx([-0.1, 0.1, 0.3, 0.6, 0.9, 1.4])
    out = capsys.readouterr().out
    assert out.count("left out") == 2 and "floor_0.1" in out
