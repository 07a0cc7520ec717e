"""Headroom of a real site on its test windows: tuned heuristic vs forecast MPC vs oracle.

1. Tune ``signal_aware`` and ``deadline_aware`` (:func:`cloudrl.scenarios.tuning.tune`,
   ``menu="wide"``) on the split's *train* file: each validation seed draws its own start
   day inside it.
2. Select: both tuned rules play the *validation* file (seeds draw days inside it); the
   cheaper is "heuristic".
3. Test: the heuristic, the forecast MPC (defaults, no future knowledge), the fluid oracle
   (:mod:`cloudrl.mpc.oracle`, one plan replayed) and optionally a learned checkpoint play
   every chosen test window (:func:`cloudrl.sites.splits.episode_windows`), the same window and
   seed for every controller. Every cost term per window, plus the peak grid kW (for a
   monthly demand charge applied afterwards, :func:`demand_charge_usd`).

Every controller reads the same market-true forecasts through ``plan_view``.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import numpy as np

from cloudrl.scenarios.runner import ControllerSpec, paired_ci
from cloudrl.sites.registry import Site
from cloudrl.sites.scenario import site_scenario
from cloudrl.sites.splits import Window, check_no_leak, episode_windows, stratified

TERMS = ("cost_usd", "energy_usd", "carbon_usd", "sla_usd", "sla_lc_usd", "sla_batch_usd",
         "sla_lc", "sla_batch", "peak_kw", "energy_kwh")
ORACLE = ControllerSpec("oracle", {}, "fluid oracle")  # three plans, the cheapest replayed
ORACLE_1 = "fluid oracle, 1 plan"  # earlier runs: one plan, no hindsight choice


def play(cfg, spec: ControllerSpec, seed: int) -> dict[str, float]:
    """One episode of ``spec`` on ``cfg``: every metric, the SLA dollars per class and the
    peak grid draw in kW."""
    from envs.scenario.sim import ScenarioSim

    sim = ScenarioSim(cfg)
    ctrl = spec.build()
    sim.reset(seed)
    ctrl.reset(sim)
    d = cfg.decision_ticks
    peak = 0.0
    hours = cfg.tick_seconds / 3600.0
    while not sim.done:
        if sim.t % d == 0:
            sim.set_controls(*ctrl.decide(sim))
        peak = max(peak, sim.tick().grid_kwh / hours)
    m = dict(sim.stats.summary())
    m["sla_lc_usd"] = m["violations_lc"] * cfg.cost.sla_usd[0]
    m["sla_batch_usd"] = m["violations_batch"] * cfg.cost.sla_usd[1]
    m["peak_kw"] = peak
    return m


def _window_item(item: tuple[Site, str, Window, ControllerSpec, str]) -> dict[str, float]:
    site, split, w, spec, carbon_model = item
    cfg = site_scenario(site, split, "test", start_date=w.start_date, carbon_model=carbon_model)
    return play(cfg, spec, w.seed)


def demand_charge_usd(peak_kw: np.ndarray, usd_per_kw_month: float, days: float) -> np.ndarray:
    """A monthly peak-kW demand charge prorated to an episode of ``days`` (30-day month)."""
    return np.asarray(peak_kw) * usd_per_kw_month * days / 30.0


def tune_and_select(site: Site, split: str, samples: int, seeds: int, workers: int,
                    carbon_model: str = "gbt") -> dict[str, Any]:
    """Tune both rules on the train file, pick one on the validation file."""
    from cloudrl.protocol import validation_seeds
    from cloudrl.scenarios.tuning import evaluate_point, tune

    check_no_leak(site, split)
    train = site_scenario(site, split, "train", carbon_model=carbon_model)
    val = site_scenario(site, split, "validation", carbon_model=carbon_model)
    out: dict[str, Any] = {"tuned": {}, "validation_cost": {}}
    for kind in ("signal_aware", "deadline_aware"):
        res = tune(train, kind, samples, seeds, workers=workers, menu="wide")
        out["tuned"][kind] = {"params": res.params, "train_cost": res.mean_cost,
                              "default_train_cost": res.default_cost,
                              "points": res.n_samples}
        out["validation_cost"][kind] = evaluate_point(
            val, kind, res.params, list(validation_seeds(seeds)))["cost_usd"]
    best = min(out["validation_cost"], key=out["validation_cost"].get)
    out["selected"] = best
    return out


def measure(site: Site, split: str, per_season: int | None, samples: int = 6,
            seeds: int = 4, workers: int = 2, learned: str | None = None,
            carbon_model: str = "gbt", reuse: dict[str, Any] | None = None) -> dict[str, Any]:
    """Tune, select, and play every controller on the chosen test windows (raw results).
    With ``reuse`` (an earlier raw result of the same site and split) the tuning, the
    selection and the windows are taken from it and only controllers it lacks are played."""
    from cloudrl.parallel import ordered_map

    t0 = time.perf_counter()
    sel = reuse["selection"] if reuse else tune_and_select(site, split, samples, seeds,
                                                           workers, carbon_model)
    kind = sel["selected"]
    specs = [ControllerSpec(kind, sel["tuned"][kind]["params"], "heuristic"),
             ControllerSpec("mpc", {}, "mpc"), ORACLE]
    if learned:
        specs.append(ControllerSpec("learned", {"checkpoint": learned}, "learned"))
    probe = site_scenario(site, split, "test", start_date=None, carbon_model=carbon_model)
    if reuse:
        windows = [Window(**w) for w in reuse["windows"]]
        done = _renamed(reuse)
        specs = [s for s in specs if s.name not in done["per_window"]]
    else:
        windows = stratified(episode_windows(site, split, probe.signal_ticks
                                             * probe.tick_seconds, probe.days), per_season)
    items = [(site, split, w, s, carbon_model) for s in specs for w in windows]
    flat = ordered_map(_window_item, items, workers, desc=f"{site.name} {split}") \
        if items else []
    n = len(windows)
    per = {s.name: flat[i * n:(i + 1) * n] for i, s in enumerate(specs)}
    out = {"site": site.name, "split": split, "periods": site.splits[split].model_dump(),
           "windows": [asdict(w) for w in windows], "selection": sel,
           "specs": [{"name": s.name, "kind": s.kind, "params": s.params} for s in specs],
           "per_window": {k: [{t: float(m[t]) for t in TERMS} for m in v]
                          for k, v in per.items()},
           "days": probe.days, "wall_s": time.perf_counter() - t0,
           "size": {"tune_samples": samples, "tune_seeds": seeds, "per_season": per_season,
                    "workers": workers}}
    if reuse:
        out["specs"] = done["specs"] + out["specs"]
        out["per_window"] = {**done["per_window"], **out["per_window"]}
        out["size"] = done["size"]
        out["wall_s"] += done["wall_s"]
        out["reused"] = True
    return out


def _renamed(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with a one-plan oracle (``alternatives`` empty) named :data:`ORACLE_1`."""
    raw = dict(raw, per_window=dict(raw["per_window"]), specs=[dict(s) for s in raw["specs"]])
    for s in raw["specs"]:
        if s["kind"] == "oracle" and not s["params"].get("alternatives", True) \
                and s["name"] == ORACLE.name:
            raw["per_window"][ORACLE_1] = raw["per_window"].pop(ORACLE.name)
            s["name"] = ORACLE_1
    return raw


def summarise(raw: dict[str, Any], demand_usd_per_kw_month: float = 15.0) -> dict[str, Any]:
    """Means, paired 95% CIs (per window) of every term, with and without a demand
    charge, from :func:`measure`'s raw results."""
    per = raw["per_window"]
    h = {t: np.array([m[t] for m in per["heuristic"]]) for t in TERMS}
    base = float(h["cost_usd"].mean())
    out: dict[str, Any] = {"means": {}, "diff_vs_heuristic": {}, "diff_vs_mpc": {},
                           "with_demand_charge": {}}
    mpc = {t: np.array([m[t] for m in per["mpc"]]) for t in TERMS}
    for name, rows in per.items():
        arr = {t: np.array([m[t] for m in rows]) for t in TERMS}
        out["means"][name] = {t: float(arr[t].mean()) for t in TERMS}
        dc = arr["cost_usd"] + demand_charge_usd(arr["peak_kw"], demand_usd_per_kw_month,
                                                 raw["days"])
        out["with_demand_charge"][name] = float(dc.mean())
        if name != "heuristic":
            out["diff_vs_heuristic"][name] = {
                t: list(paired_ci(arr[t], h[t])) for t in
                ("cost_usd", "energy_usd", "carbon_usd", "sla_lc_usd", "sla_batch_usd")}
            out["diff_vs_heuristic"][name]["cost_pct"] = [
                100 * x / base for x in paired_ci(arr["cost_usd"], h["cost_usd"])]
            hdc = h["cost_usd"] + demand_charge_usd(h["peak_kw"], demand_usd_per_kw_month,
                                                    raw["days"])
            out["diff_vs_heuristic"][name]["cost_with_demand_charge"] = list(paired_ci(dc, hdc))
        if name not in ("heuristic", "mpc"):
            out["diff_vs_mpc"][name] = list(paired_ci(arr["cost_usd"], mpc["cost_usd"]))
    out["demand_usd_per_kw_month"] = demand_usd_per_kw_month
    return out
