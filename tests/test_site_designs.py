"""Site designs: the simulator's demand charge, the fluid plan's peak term, the design
overrides and the ``cloudrl sites designs`` sweep end to end on a tiny setting."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.mpc.fluid import FluidProblem, solve
from cloudrl.sites.designs import DESIGNS, Design, DesignError, design_config, parse_designs
from envs.scenario.catalog import load_scenario
from envs.scenario.sim import ScenarioSim


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CLOUDRL_SITES_DIR", str(tmp_path / "sites"))


def _trace(cfg, controls):
    """Play ``cfg`` with a hand-chosen control per decision; per tick grid kW and costs."""
    sim = ScenarioSim(cfg)
    sim.reset(3)
    kw, ticks = [], []
    hours = cfg.tick_seconds / 3600.0
    k = 0
    while not sim.done:
        if sim.t % cfg.decision_ticks == 0:
            sim.set_controls(*controls[k % len(controls)])
            k += 1
        ticks.append(sim.tick())
        kw.append(ticks[-1].grid_kwh / hours)
    return sim, np.array(kw), ticks


def _expected_peak(kw: np.ndarray, block: int) -> float:
    """The highest block mean, blocks of ``block`` ticks from tick 0, the last one shorter."""
    return max(float(np.mean(kw[i:i + block])) for i in range(0, len(kw), block))


# release and ready levels that swing the grid draw from decision to decision
SWING = [(0.2, 10.0), (1.2, 1e9), (0.0, 0.0), (0.8, 200.0)]


@settings(max_examples=8, deadline=None)
@given(rate=st.floats(1.0, 60.0), block_min=st.sampled_from([6.0, 15.0, 21.0, 60.0]))
def test_the_demand_charge_is_the_peak_block_mean_times_the_prorated_rate(rate, block_min):
    cfg = load_scenario("tiny", {"days": 0.25, "cost": {"demand_usd_per_kw_month": rate,
                                                        "demand_block_minutes": block_min}})
    sim, kw, ticks = _trace(cfg, SWING)
    block = int(round(block_min * 60 / cfg.tick_seconds))
    peak = _expected_peak(kw, block)
    charge = peak * rate * cfg.days / 30.0
    assert sim.stats.peak_kw == pytest.approx(peak, rel=1e-9)
    assert sim.stats.demand_usd == pytest.approx(charge, rel=1e-9)
    # charged tick by tick, only on ticks that close a block (or the last tick)
    per_tick = np.array([t.demand_usd for t in ticks])
    assert per_tick.sum() == pytest.approx(charge, rel=1e-9)
    closing = {min(i + block, len(kw)) - 1 for i in range(0, len(kw), block)}
    assert all(i in closing for i in np.flatnonzero(per_tick))
    assert sum(t.cost_usd for t in ticks) == pytest.approx(sim.stats.cost_usd, rel=1e-9)
    s = sim.stats
    assert s.cost_usd == pytest.approx(s.energy_usd + s.carbon_usd + s.sla_usd + charge)


def test_a_hand_built_trace_is_charged_on_its_peak_block():
    # 5 ticks of 5 min per 25-min block, the last block shorter; the peak by hand
    cfg = load_scenario("tiny", {"tick_seconds": 300.0, "days": 0.25,
                                 "cost": {"demand_usd_per_kw_month": 12.0,
                                          "demand_block_minutes": 25.0}})
    sim, kw, ticks = _trace(cfg, SWING)
    assert len(kw) == cfg.episode_ticks and len(kw) % 5 != 0
    means = [kw[i:i + 5].sum() / len(kw[i:i + 5]) for i in range(0, len(kw), 5)]
    assert sim.stats.peak_kw == pytest.approx(max(means))
    assert sim.stats.demand_usd == pytest.approx(max(means) * 12.0 * 0.25 / 30.0)


def test_the_demand_charge_is_off_by_default_and_changes_no_other_term():
    off = load_scenario("tiny", {"days": 0.25})
    assert off.cost.demand_usd_per_kw_month == 0.0
    on = load_scenario("tiny", {"days": 0.25, "cost": {"demand_usd_per_kw_month": 20.0}})
    a, kw_a, _ = _trace(off, SWING)
    b, kw_b, _ = _trace(on, SWING)
    assert a.stats.demand_usd == 0.0
    assert a.stats.cost_usd == a.stats.energy_usd + a.stats.carbon_usd + a.stats.sla_usd
    assert np.array_equal(kw_a, kw_b)  # the charge changes no dynamics
    for term in ("energy_usd", "carbon_usd", "sla_usd"):
        assert getattr(a.stats, term) == getattr(b.stats, term)
    assert a.stats.peak_kw == b.stats.peak_kw > 0  # metered either way
    assert b.stats.cost_usd - a.stats.cost_usd == pytest.approx(b.stats.demand_usd)
    assert b.stats.demand_usd > 0


def test_the_fluid_plan_flattens_its_peak_when_the_peak_is_priced():
    # three 1-hour periods at one price; 4 core-ticks of work due by the end, room 6 each
    def plan(peak_usd, floor=0.0):
        return solve(FluidProblem(
            grid_usd_per_kwh=np.array([0.10, 0.10, 0.10]), export_usd_per_kwh=0.0,
            base_kwh=np.array([1.0, 3.0, 1.0]), solar_kwh=np.zeros(3),
            room=np.full(3, 6.0), due=np.array([0.0, 0.0, 4.0]), avail=np.full(3, 4.0),
            kwh_per_core_tick=1.0, shortfall_usd_per_core_tick=10.0,
            peak_usd_per_kw=peak_usd, peak_floor_kw=floor, period_hours=np.ones(3)))

    priced = plan(1.0)
    # the flattest plan tops the two 1 kWh periods up to the middle's 3 (2 + 0 + 2)
    np.testing.assert_allclose(priced.grid_kwh, [3.0, 3.0, 3.0], atol=1e-6)
    assert priced.cost_usd == pytest.approx(0.10 * 9.0 + 1.0 * 3.0, abs=1e-6)
    # a peak already paid for (floor 4 kW) costs nothing more below it
    assert plan(1.0, floor=4.0).cost_usd == pytest.approx(0.10 * 9.0, abs=1e-6)
    assert plan(0.0).grid_kwh.sum() == pytest.approx(9.0, abs=1e-6)


def test_design_overrides_apply_and_bad_ones_are_named():
    base = load_scenario("scarcity_spikes")
    flex = design_config(base, DESIGNS["flex_80"])
    assert [c.load_share for c in flex.classes] == [pytest.approx(0.2), pytest.approx(0.8)]
    slack = design_config(base, DESIGNS["slack_4x"])
    assert slack.classes[1].slack_min == 4 * base.classes[1].slack_min
    assert slack.classes[0].slack_min == base.classes[0].slack_min
    dc = design_config(base, DESIGNS["demand_15"])
    assert dc.cost.demand_usd_per_kw_month == 15.0 and dc.demand_usd_per_kw == 1.0
    assert design_config(base, DESIGNS["baseline"]) == base
    with pytest.raises(DesignError, match="'gpu_share'"):
        parse_designs("baseline,gpu_share")
    with pytest.raises(DesignError, match="classes.gpu"):
        design_config(base, Design("x", "", set={"classes.gpu.slack_min": 1.0}))
    with pytest.raises(DesignError, match="design 'y'.*utilization"):
        design_config(base, Design("y", "", set={"utilization": 7.0}))


def test_a_bad_design_name_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "d.json"
    r = subprocess.run([sys.executable, "-m", "cloudrl", "sites", "designs", "--site", "caiso",
                        "--designs", "flex_80,solar_farm", "--json", str(out), "--md",
                        str(tmp_path / "d.md")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "cloudrl sites designs: --designs: 'solar_farm' is not a design (known: "
        + ", ".join(DESIGNS) + ")"]
    assert not out.exists()


@pytest.mark.parametrize("args,field", [
    (["--site", "atlantis"], "--site"), (["--site", "de_lu", "--windows", "0"], "--windows"),
    (["--site", "de_lu", "--split", "future"], "--split")])
def test_bad_sweep_options_are_one_line(tmp_path, capsys, args, field):
    from cloudrl.cli import main

    rc = main(["sites", "designs", *args, "--json", str(tmp_path / "a.json"), "--md",
               str(tmp_path / "a.md")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and field in err[0]
    assert not (tmp_path / "a.json").exists()


def test_the_sweep_runs_end_to_end_and_the_bound_is_below_every_controller(
        tmp_path, capsys, ray_session):
    from cloudrl.cli import main

    js, md = tmp_path / "d.json", tmp_path / "d.md"
    rc = main(["sites", "designs", "--site", "caiso", "--designs", "demand_15", "--windows", "1",
               "--tune-points", "1", "--tune-seeds", "1", "--json", str(js), "--md", str(md)])
    assert rc == 0
    data = json.loads(js.read_text())["sites"]["caiso"]
    d = data["designs"]["demand_15"]
    per = d["per_window"]
    assert set(per) == {"rule", "mpc", "oracle", "bound"} and len(data["windows"]) == 1
    for k in ("rule", "mpc", "oracle"):
        m = per[k][0]
        assert m["cost_usd"] == pytest.approx(m["energy_usd"] + m["carbon_usd"] + m["sla_lc_usd"]
                                              + m["sla_batch_usd"] + m["demand_usd"], rel=1e-9)
        assert per["bound"][0]["cost_usd"] <= m["cost_usd"] + 1e-6
        # $15/kW-month over 2 of 30 days: $1 per kW of the peak 15-min draw
        assert m["demand_peak_kw"] > 0
        assert m["demand_usd"] == pytest.approx(m["demand_peak_kw"], rel=1e-9)
    assert d["result"]["vs_rule_pct"]["oracle"][0] == pytest.approx(
        100 * (per["oracle"][0]["cost_usd"] / per["rule"][0]["cost_usd"] - 1))
    page = md.read_text()
    assert "cloudrl sites designs --site caiso --designs demand_15 --windows 1" in page
    assert "| demand_15 |" in page and "## Conclusion" in page
    # --merge keeps the other site's entry; without the tariff nothing is charged
    js.write_text(json.dumps({"sites": {"de_lu": data | {"site": "de_lu"}}}))
    rc = main(["sites", "designs", "--site", "caiso", "--designs", "baseline", "--windows", "1",
               "--tune-points", "1", "--tune-seeds", "1", "--no-bound", "--json", str(js),
               "--md", str(md), "--merge"])
    assert rc == 0
    sites = json.loads(js.read_text())["sites"]
    assert set(sites) == {"de_lu", "caiso"}
    base = sites["caiso"]["designs"]["baseline"]["per_window"]
    assert set(base) == {"rule", "mpc", "oracle"}
    assert all(base[k][0]["demand_usd"] == 0.0 < base[k][0]["demand_peak_kw"] for k in base)
    assert "## de_lu" in md.read_text() and "## caiso" in md.read_text()


@pytest.mark.parametrize("pct,expect", [
    ([-4.2, -7.0, -1.4], "room for planning"), ([-1.1, -2.0, -0.2], "a small gap"),
    ([-3.5, -8.0, 1.0], "no gap"), ([2.5, 0.4, 4.6], "the rule is cheaper")])
def test_the_verdict_reads_the_oracle_interval(pct, expect):
    from cloudrl.sites.designs_page import verdict

    assert verdict(pct) == expect
