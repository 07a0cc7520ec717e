"""The yardstick on a real site: the sim-MPC's sampled futures keep published prices exact
(and only those), perfect forecasts are the truth, the ladder pairs by window and checks the
bound, and ``cloudrl sites yardstick`` names bad input in one line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from cloudrl.mpc.sim_mpc.future import blank_future, published_price_ticks
from cloudrl.sites.registry import BUILTIN
from cloudrl.sites.scenario import site_scenario
from cloudrl.sites.yardstick import perfect_forecasts, sim_specs, summarise
from envs.scenario.control import plan_view
from envs.scenario.sim import ScenarioSim
from envs.signals.market import known_until


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CLOUDRL_SITES_DIR", str(tmp_path / "sites"))


def _sim_at(cfg, t: int) -> ScenarioSim:
    sim = ScenarioSim(cfg)
    sim.reset(1_000_003)
    while sim.t < t:
        sim.tick()
    return sim


@pytest.mark.parametrize("site_name,start,t", [("de_lu", "2023-05-09", 173),
                                                ("caiso", "2023-10-17", 380)])
def test_sampled_futures_keep_published_prices_exact_and_no_others(site_name, start, t):
    cfg = site_scenario(BUILTIN[site_name], "temporal", "test", start_date=start,
                        carbon_model="seasonal_naive")
    sim = _sim_at(cfg, t)
    v = plan_view(sim)
    h = len(v.price_fc)
    k = published_price_ticks(sim, h)
    tick = cfg.tick_seconds
    tau = float(sim.signals.start.astype(np.int64)) + t * tick
    cutoff = known_until(tau, BUILTIN[site_name].timezone, cfg.signals.market.publish_time)
    assert k == int(np.sum(tau + np.arange(1, h + 1) * tick < cutoff))
    assert 0 < k < h  # the horizon straddles the cut-off here
    spec, _ = sim_specs()[0]
    ctrl = spec.build()
    ctrl.reset(sim)
    try:
        futures = ctrl.futures(sim, v)
    finally:
        ctrl.close()
    truth = sim.signals.price_usd_per_mwh[t + 1:t + 1 + h]
    for f in futures:
        got = f.signals.price_usd_per_mwh[t + 1:t + 1 + h]
        np.testing.assert_array_equal(got[:k], truth[:k])  # published: exact
        assert np.all(got[k:] != v.price_fc[k:])  # beyond: the forecast's error law
    # and without a market nothing ahead is published
    plain = cfg.model_copy(update={"signals": cfg.signals.model_copy(update={"market": None})})
    assert published_price_ticks(_sim_at(plain, t), h) == 0
    assert np.isnan(blank_future(sim).signals.price_usd_per_mwh[t + 1])


def test_perfect_forecasts_are_the_truth():
    cfg = perfect_forecasts(site_scenario(BUILTIN["de_lu"], "temporal", "test",
                                          start_date="2023-05-09",
                                          carbon_model="seasonal_naive"))
    sim = _sim_at(cfg, 200)
    v = plan_view(sim)
    h = len(v.price_fc)
    np.testing.assert_allclose(v.price_fc, sim.signals.price_usd_per_mwh[201:201 + h])
    np.testing.assert_allclose(v.carbon_fc, sim.signals.carbon_g_per_kwh[201:201 + h])


def _rows(costs):
    return [{"cost_usd": c, "energy_usd": c - 2, "carbon_usd": 1.0, "sla_lc_usd": 1.0,
             "sla_batch_usd": 0.0, "sla_lc": 0.0, "sla_batch": 0.0} for c in costs]


def test_the_ladder_pairs_by_window_and_catches_a_bound_above_a_controller():
    per = {"heuristic": _rows([10.0, 12.0, 11.0]), "learned": _rows([9.0, 11.0, 10.5]),
           "sim-MPC": _rows([9.5, 11.5, 10.0])}
    out = summarise(per, [5.0, 6.0, 5.5])
    by = {r["name"]: r for r in out["rows"]}
    assert out["bound_below_every_controller"] is True
    assert [r["name"] for r in out["rows"]] == ["lower bound", "sim-MPC", "heuristic",
                                                 "learned"]
    d, lo, hi = by["sim-MPC"]["learned_minus_this_ci95"]
    assert d == pytest.approx(np.mean([-0.5, -0.5, 0.5]))
    assert lo < d < hi
    assert by["learned"]["diff_vs_heuristic_pct_ci95"][0] == pytest.approx(-2.5 / 33 * 100)
    assert summarise(per, [5.0, 11.2, 5.5])["bound_below_every_controller"] is False


@pytest.mark.parametrize("content,needle", [
    (None, "No such file"), ("{", "not JSON"), ("[]", "not a raw site result"),
    ('{"site": "de_lu", "split": "temporal", "windows": []}', "no 'per_window'"),
    ('{"site": "mars", "split": "temporal", "windows": [], "per_window": {"heuristic": []}}',
     "mars"),
])
def test_bad_raw_files_are_one_line_and_exit_2(tmp_path, content, needle):
    raw = tmp_path / "raw.json"
    if content is not None:
        raw.write_text(content)
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, "-m", "cloudrl", "sites", "yardstick", str(raw),
                        "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not out.exists()


def test_bad_sizes_are_one_line_and_exit_2(tmp_path):
    out = tmp_path / "out.json"
    for flags, needle in ((["--per-season", "0"], "--per-season"),
                          (["--workers", "0"], "--workers")):
        r = subprocess.run([sys.executable, "-m", "cloudrl", "sites", "yardstick",
                            "whatever.json", "--json", str(out), *flags],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and needle in r.stderr.strip().splitlines()[0], r.stderr
    assert not out.exists()


def test_a_sites_ladder_joins_its_row_and_the_page():
    from cloudrl.sites.report import _yardstick_section
    from cloudrl.sites.yardstick import report_fields

    per = {"heuristic": _rows([10.0, 12.0, 11.0, 13.0]),
           "learned": _rows([9.0, 11.0, 10.5, 12.0]),
           "sim-MPC": _rows([9.5, 11.5, 10.0, 12.5])}
    lad = summarise(per, [5.0, 6.0, 5.5, 6.5])
    lad.update({"n_windows": 4, "n_windows_in_raw": 100, "command": "cloudrl sites yardstick "
                "r.json --per-season 1 --workers 1 --json y.json"})
    f = report_fields(lad)
    assert f["sim_mpc_cost"] == pytest.approx(10.875)
    assert f["lower_bound_cost"] == pytest.approx(5.75)
    assert f["diff_vs_sim_mpc_ci95"][0] == pytest.approx(-0.25)
    assert f["bound_below_every_controller"] is True
    rows = [{"site": "x", "split": "temporal"}, {"site": "y", "split": "temporal"}]
    page = "\n".join(_yardstick_section(rows, {"x/temporal": lad}))
    assert "**x temporal**, 4 of 100 windows" in page and "y temporal" not in page
    assert "| sim-MPC | 10.88 |" in page and lad["command"] in page
