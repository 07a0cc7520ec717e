"""The sites summary: paired differences and intervals per cost term, the demand charge,
and the page made from them; plus (slow) the whole headroom command on an added site."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from cloudrl.sites.headroom import TERMS, demand_charge_usd, summarise
from cloudrl.sites.report import markdown


def _raw(rng, n=40):
    def rows(shift):
        out = []
        for _ in range(n):
            m = {t: float(rng.uniform(1, 5)) for t in TERMS}
            m["energy_usd"] = float(rng.normal(50 + shift, 4))
            m["cost_usd"] = m["energy_usd"] + m["carbon_usd"] + m["sla_lc_usd"] + \
                m["sla_batch_usd"]
            m["peak_kw"] = float(rng.uniform(15, 20))
            out.append(m)
        return out

    return {"per_window": {"heuristic": rows(0), "mpc": rows(-1.5), "fluid oracle": rows(-8)},
            "days": 2.0}


def test_paired_intervals_match_a_t_interval_on_the_window_differences():
    raw = _raw(np.random.default_rng(3))
    s = summarise(raw, demand_usd_per_kw_month=12.0)
    h = np.array([m["cost_usd"] for m in raw["per_window"]["heuristic"]])
    o = np.array([m["cost_usd"] for m in raw["per_window"]["fluid oracle"]])
    d = o - h
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    mean, lo, hi = s["diff_vs_heuristic"]["fluid oracle"]["cost_usd"]
    assert mean == pytest.approx(d.mean()) and hi - lo == pytest.approx(2 * half)
    pct = s["diff_vs_heuristic"]["fluid oracle"]["cost_pct"]
    assert pct[0] == pytest.approx(100 * d.mean() / h.mean())
    m = np.array([x["cost_usd"] for x in raw["per_window"]["mpc"]])
    assert s["diff_vs_mpc"]["fluid oracle"][0] == pytest.approx((o - m).mean())
    # the demand charge: $12 per kW-month prorated to 2 of 30 days
    peak = np.array([x["peak_kw"] for x in raw["per_window"]["mpc"]])
    assert s["with_demand_charge"]["mpc"] == pytest.approx((m + peak * 12 * 2 / 30).mean())
    assert demand_charge_usd(np.array([30.0]), 15.0, 3.0)[0] == pytest.approx(45.0)


def test_the_page_states_each_interval_and_its_verdict():
    raw = _raw(np.random.default_rng(11))
    s = summarise(raw)
    fc = {k: {"mae": [float(i) for i in range(1, 25)], "mape": [2.0] * 24}
          for k in ("price_market", "price_seasonal_naive_week", "carbon_seasonal_naive_day",
                    "carbon_gbt")}
    fc["price_published_share"] = [1.0] * 12 + [0.5] * 12
    row = {"site": "x", "split": "temporal", "train_period": "2021-01-01..2022-01-01",
           "test_period": "2023-01-01..2024-01-01", "n_test_windows": 40,
           "windows_per_season": {"DJF": 10, "MAM": 10, "JJA": 10, "SON": 10},
           "heuristic": {"kind": "signal_aware"},
           "heuristic_cost": s["means"]["heuristic"]["cost_usd"],
           "mpc_cost": s["means"]["mpc"]["cost_usd"],
           "oracle_cost": s["means"]["fluid oracle"]["cost_usd"], "learned_cost": None,
           "cost_terms": s["means"],
           "diff_vs_heuristic_ci95": {k: s["diff_vs_heuristic"].get(k)
                                      for k in ("mpc", "fluid oracle", "learned")},
           "with_demand_charge": {"usd_per_kw_month": 15.0,
                                  "mean_cost": s["with_demand_charge"]},
           "forecast_error_by_lead": fc,
           "size": {"tune_samples": 5, "tune_seeds": 3, "workers": 2}, "wall_s": 10.0}
    page = markdown([row], "cloudrl sites report r.json --json a.json --md a.md")
    pct = s["diff_vs_heuristic"]["fluid oracle"]["cost_pct"]
    assert f"{pct[0]:+.1f} [{pct[1]:+.1f}, {pct[2]:+.1f}]" in page
    assert pct[2] < 0 and "the fluid oracle is cheaper than the heuristic" in page
    assert "| x | temporal | price hours already published | 100% | 100% | 100% | 50% |" \
        in page
    assert len(page.splitlines()) <= 250
    json.dumps(row)  # the JSON row is plain data


@pytest.mark.slow
def test_headroom_runs_on_an_added_site(tmp_path, monkeypatch):
    from cloudrl.sites.byo import add_site
    from cloudrl.sites.headroom import measure

    monkeypatch.setenv("CLOUDRL_SITES_DIR", str(tmp_path / "sites"))
    monkeypatch.setenv("CLOUDRL_CACHE_DIR", str(tmp_path / "cache"))
    t = np.arange(np.datetime64("2022-02-01T00"), np.datetime64("2022-05-01T00"),
                  np.timedelta64(1, "h"))
    rng = np.random.default_rng(2)
    hour = np.arange(len(t)) % 24
    (tmp_path / "p.csv").write_text("timestamp,price_usd_per_mwh\n" + "".join(
        f"{a},{70 + 35 * np.sin(2 * np.pi * h / 24) + rng.normal(0, 6):.2f}\n"
        for a, h in zip(t, hour, strict=True)))
    (tmp_path / "c.csv").write_text("timestamp,carbon_g_per_kwh\n" + "".join(
        f"{a},{280 + 70 * np.cos(2 * np.pi * h / 24) + rng.normal(0, 9):.1f}\n"
        for a, h in zip(t, hour, strict=True)))
    site = add_site("slow_site", tmp_path / "p.csv", tmp_path / "c.csv", "Europe/Madrid")
    raw = measure(site, "temporal", per_season=1, samples=2, seeds=1, workers=1)
    assert len(raw["windows"]) == 1
    for name in ("heuristic", "mpc", "fluid oracle"):
        assert raw["per_window"][name][0]["cost_usd"] > 0
    test = site.splits["temporal"].test
    assert test.start <= raw["windows"][0]["start_date"] < test.end


def test_a_reused_one_plan_oracle_keeps_its_numbers_under_its_own_name():
    from cloudrl.sites.headroom import ORACLE_1, _renamed

    raw = _raw(np.random.default_rng(5))
    raw["specs"] = [{"name": "heuristic", "kind": "signal_aware", "params": {}},
                    {"name": "mpc", "kind": "mpc", "params": {}},
                    {"name": "fluid oracle", "kind": "oracle", "params": {"alternatives": []}}]
    out = _renamed(raw)
    assert "fluid oracle" not in out["per_window"]
    assert out["per_window"][ORACLE_1] == raw["per_window"]["fluid oracle"]
    assert "fluid oracle" in raw["per_window"]  # the input is left as it was
    # an oracle with its plan variants keeps its name
    raw["specs"][2]["params"] = {}
    assert "fluid oracle" in _renamed(raw)["per_window"]
