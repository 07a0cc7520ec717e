"""Each forecaster's error on a split's test period, by lead time (MAE, MAPE).

Forecasts are issued at every hour of the test period for leads 1..24 h, exactly as a
controller sees them (:mod:`envs.signals.market`): the market price (published hours
exact, later hours seasonal-naive one week back), carbon seasonal-naive (a day back) and
carbon by gradient-boosted trees fit on the split's train file. MAPE of prices counts only
hours whose true price is at least ``PRICE_MAPE_FLOOR`` $/MWh in magnitude (prices near
zero and negative ones make a percentage meaningless); carbon is never near zero.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cloudrl.sites.registry import Site
from cloudrl.sites.splits import period, slice_path
from envs.signals.market import (
    DAY_HOURS,
    HOUR,
    WEEK_HOURS,
    carbon_model,
    known_until,
    predict_carbon,
)
from envs.signals.real import load_table

LEADS = 24
MODEL_LEADS = 25  # the lead range the controllers' model is fit for (24 h horizon + 1)
PRICE_MAPE_FLOOR = 10.0


def _errors(pred: np.ndarray, truth: np.ndarray, floor: float = 0.0) -> tuple[list, list]:
    err = np.abs(pred - truth)
    mae = err.mean(axis=0)
    mape = []
    for k in range(truth.shape[1]):
        ok = np.abs(truth[:, k]) >= max(floor, 1e-9)
        mape.append(float(100 * (err[ok, k] / np.abs(truth[ok, k])).mean()) if ok.any()
                    else None)
    return [float(x) for x in mae], mape


def evaluate_forecasts(site: Site, split: str = "temporal") -> dict[str, Any]:
    """``{forecaster: {"mae": [lead 1..24], "mape": [...]}}`` plus the share of price
    hours that were published at each lead."""
    test = period(site, split, "test")
    table = load_table(slice_path(site, split, "test"))
    if abs(table.interval_s - HOUR) > 1e-6:
        raise ValueError(f"{site.name}: forecast errors need hourly data")
    secs = table.seconds
    first = float(secs[0])
    lo = float(np.datetime64(test.start, "D").astype("datetime64[s]").astype(np.int64))
    n = len(secs)
    issue = np.flatnonzero((secs >= lo) & (np.arange(n) + LEADS < n))
    leads = np.arange(1, LEADS + 1)
    target = issue[:, None] + leads[None, :]
    price_true, carbon_true = table.price[target], table.carbon[target]
    publish = site.market("seasonal_naive").publish_time
    cut = np.array([known_until(secs[i], site.timezone, publish) for i in issue])
    published = secs[target] < cut[:, None]
    price_fc = np.where(published, price_true, table.price[np.clip(target - WEEK_HOURS, 0,
                                                                   None)])
    back = DAY_HOURS * -(-leads // DAY_HOURS)
    naive = table.carbon[np.clip(target - back[None, :], 0, None)]
    model = carbon_model(str(slice_path(site, split, "train")), MODEL_LEADS)
    ii = np.repeat(issue, LEADS)
    ll = np.tile(leads, len(issue))
    gbt = predict_carbon(model, table.carbon, first, ii, ll).reshape(len(issue), LEADS)
    out: dict[str, Any] = {"site": site.name, "split": split, "test_period": str(test),
                           "issues": int(len(issue)), "leads_h": leads.tolist(),
                           "price_published_share": [float(x) for x in published.mean(0)]}
    for name, pred, truth, floor in (
            ("price_market", price_fc, price_true, PRICE_MAPE_FLOOR),
            ("price_seasonal_naive_week", table.price[np.clip(target - WEEK_HOURS, 0, None)],
             price_true, PRICE_MAPE_FLOOR),
            ("carbon_seasonal_naive_day", naive, carbon_true, 0.0),
            ("carbon_gbt", gbt, carbon_true, 0.0)):
        mae, mape = _errors(pred, truth, floor)
        out[name] = {"mae": mae, "mape": mape}
    return out


def format_errors(res: dict[str, Any], leads: tuple[int, ...] = (1, 3, 6, 12, 24)) -> str:
    names = [k for k in res if isinstance(res[k], dict)]
    head = f"{'forecaster (' + res['site'] + ', test ' + res['test_period'] + ')':52s}" + \
        "".join(f"{'+' + str(h) + ' h':>16s}" for h in leads)
    lines = [head, "MAE (MAPE %)".rjust(len(head))]
    for k in names:
        cells = []
        for h in leads:
            mae, mape = res[k]["mae"][h - 1], res[k]["mape"][h - 1]
            cells.append(f"{mae:8.1f} ({mape:5.1f})" if mape is not None else f"{mae:8.1f}")
        lines.append(f"{k:52s}" + "".join(f"{c:>16s}" for c in cells))
    share = res["price_published_share"]
    lines.append(f"{'price hours already published':52s}" +
                 "".join(f"{100 * share[h - 1]:15.0f}%" for h in leads))
    return "\n".join(lines)
