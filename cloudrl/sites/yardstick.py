"""The yardstick on a real site: the plant-true planners and the lower bound on test windows.

A site's raw result (``cloudrl sites headroom`` / ``cloudrl sites train``) already holds the
tuned heuristic, the fluid MPC, the fluid oracle and the learned policy on every test window.
This adds, on a season-stratified subset of the same windows (same start dates, same seeds,
so every difference is paired by window):

1. the **lower bound** (:func:`cloudrl.mpc.bound.episode_bound`): below every feasible
   policy's cost on the window;
2. the **hindsight oracle**: the sim-MPC's search on the realised window (true signals and
   arrivals), the best plan it finds;
3. the **sim-MPC with perfect forecasts**: the same search where every price and carbon
   value ahead is known (no market cut-off, no carbon forecaster; arrivals still sampled);
4. the **sim-MPC** on the site's market-true forecasts (prices exact up to the cleared
   auction, a forecast beyond; the learned carbon forecaster), which every other
   controller reads too.

The sim knobs are the scenario yardstick's (:data:`cloudrl.scenarios.yardstick.SIM_MPC_TUNED`,
:data:`~cloudrl.scenarios.yardstick.HINDSIGHT_BUDGET`), warm-started from the site's fluid
MPC (its defaults, as in the headroom run). Every row is split into its cost terms.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import numpy as np

from cloudrl.scenarios.runner import ControllerSpec, paired_ci
from cloudrl.scenarios.yardstick import HINDSIGHT_BUDGET, SIM_MPC_TUNED
from cloudrl.sites.registry import get_site
from cloudrl.sites.scenario import site_scenario
from cloudrl.sites.splits import Window, stratified
from envs.scenario.config import ScenarioConfig

TERMS = ("energy_usd", "carbon_usd", "sla_lc_usd", "sla_batch_usd")
LADDER = ("lower bound", "hindsight oracle", "sim-MPC, perfect forecasts", "sim-MPC",
          "mpc", "fluid oracle", "heuristic", "learned")
LABELS = {"mpc": "fluid MPC"}  # the raw results' name of the forecast MPC


def perfect_forecasts(cfg: ScenarioConfig) -> ScenarioConfig:
    """``cfg`` with the future's prices and carbon known exactly (no market model, no
    forecast noise); arrivals are still sampled."""
    return cfg.model_copy(update={"signals": cfg.signals.model_copy(
        update={"market": None, "forecast_error": 0.0})})


def sim_specs(sim_mpc: dict[str, Any] | None = None, hindsight: dict[str, Any] | None = None
              ) -> list[tuple[ControllerSpec, bool]]:
    """(spec, perfect forecasts?) of the three sim rows."""
    sim = {**SIM_MPC_TUNED, **(sim_mpc or {}), "mpc": {}}
    return [(ControllerSpec("sim_mpc", sim, "sim-MPC"), False),
            (ControllerSpec("sim_mpc", sim, "sim-MPC, perfect forecasts"), True),
            (ControllerSpec("sim_hindsight", {**HINDSIGHT_BUDGET, **(hindsight or {}),
                                              "mpc": {}}, "hindsight oracle"), False)]


def play_timed(cfg: ScenarioConfig, spec: ControllerSpec, seed: int) -> dict[str, float]:
    """One episode of ``spec``: the cost terms and the controller's mean re-plan seconds."""
    from envs.scenario.sim import ScenarioSim

    sim = ScenarioSim(cfg)
    ctrl = spec.build()
    sim.reset(seed)
    ctrl.reset(sim)
    d = cfg.decision_ticks
    while not sim.done:
        if sim.t % d == 0:
            sim.set_controls(*ctrl.decide(sim))
        sim.tick()
    m = dict(sim.stats.summary())
    lc, batch = cfg.cost.sla_usd
    out = {t: float(m[t]) for t in ("cost_usd", "energy_usd", "carbon_usd", "sla_lc",
                                    "sla_batch")}
    out["sla_lc_usd"] = m["violations_lc"] * lc
    out["sla_batch_usd"] = m["violations_batch"] * batch
    solve = getattr(ctrl, "solve_times", None)
    out["replan_s"] = float(np.mean(solve)) if solve else 0.0
    return out


def _item(item: tuple) -> dict[str, float]:
    """One Ray task: ``(site name, split, window, spec or None, perfect, carbon model)``;
    spec None is the lower bound."""
    from cloudrl.mpc.bound import episode_bound

    name, split, w, spec, perfect, carbon_model = item
    cfg = site_scenario(get_site(name), split, "test", start_date=w.start_date,
                        carbon_model=carbon_model)
    if spec is None:
        return {"cost_usd": float(episode_bound(cfg, w.seed).bound_usd)}
    return play_timed(perfect_forecasts(cfg) if perfect else cfg, spec, w.seed)


def measure(raw: dict[str, Any], per_season: int | None, workers: int = 1,
            sim_mpc: dict[str, Any] | None = None, hindsight: dict[str, Any] | None = None,
            carbon_model: str = "gbt") -> dict[str, Any]:
    """The ladder on ``per_season`` windows of each season of ``raw``'s test windows."""
    from cloudrl.parallel import ordered_map

    t0 = time.perf_counter()
    all_w = [Window(**w) for w in raw["windows"]]
    chosen = stratified(all_w, per_season)
    pos = {w.index: i for i, w in enumerate(all_w)}
    idx = [pos[w.index] for w in chosen]
    specs = sim_specs(sim_mpc, hindsight)
    items = [(raw["site"], raw["split"], w, s, p, carbon_model) for s, p in specs
             for w in chosen] + [(raw["site"], raw["split"], w, None, False, carbon_model)
                                 for w in chosen]
    flat = ordered_map(_item, items, workers, desc=f"{raw['site']} yardstick")
    n = len(chosen)
    per: dict[str, list[dict[str, float]]] = {
        name: [raw["per_window"][name][i] for i in idx] for name in raw["per_window"]
        if name in LADDER}
    for k, (s, _) in enumerate(specs):
        per[s.name] = flat[k * n:(k + 1) * n]
    bound = [m["cost_usd"] for m in flat[len(specs) * n:]]
    out = summarise(per, bound)
    out.update({"site": raw["site"], "split": raw["split"], "n_windows": n,
                "n_windows_in_raw": len(all_w), "windows": [asdict(w) for w in chosen],
                "per_season": per_season, "carbon_model": carbon_model,
                "sim_mpc": specs[0][0].params, "hindsight": specs[2][0].params,
                "wall_s": time.perf_counter() - t0})
    return out


def summarise(per: dict[str, list[dict[str, float]]], bound: list[float]) -> dict[str, Any]:
    """Rows in ladder order: mean cost and terms, paired CIs against the heuristic and
    (learned − this) against the learned policy; whether the bound is below every row."""
    heur = np.array([m["cost_usd"] for m in per["heuristic"]])
    base = float(heur.mean())
    learned = np.array([m["cost_usd"] for m in per["learned"]]) if "learned" in per else None
    rows = [{"name": "lower bound", "cost": float(np.mean(bound)), "per_window": bound}]
    for name in LADDER[1:]:
        if name not in per:
            continue
        ms = per[name]
        cost = np.array([m["cost_usd"] for m in ms])
        row: dict[str, Any] = {
            "name": LABELS.get(name, name), "cost": float(cost.mean()),
            "per_window": [float(c) for c in cost],
            "terms": {t: float(np.mean([m[t] for m in ms])) for t in TERMS},
            "sla_lc": float(np.mean([m["sla_lc"] for m in ms])),
            "sla_batch": float(np.mean([m["sla_batch"] for m in ms]))}
        if "replan_s" in ms[0]:
            row["replan_s"] = float(np.mean([m["replan_s"] for m in ms]))
        if name != "heuristic":
            row["diff_vs_heuristic_pct_ci95"] = [100 * x / base for x in paired_ci(cost, heur)]
        if learned is not None and name != "learned":
            row["learned_minus_this_ci95"] = list(paired_ci(learned, cost))
        rows.append(row)
    ok = all(b <= c + 1e-9 for r in rows[1:] for b, c in zip(bound, r["per_window"],
                                                              strict=True))
    return {"rows": rows, "bound_below_every_controller": ok}


def report_fields(out: dict[str, Any]) -> dict[str, Any]:
    """The fields a ``docs/results/sites.json`` row takes from a site's ladder."""
    by = {r["name"]: r for r in out["rows"]}
    sim = by.get("sim-MPC", {})
    return {"yardstick_windows": out["n_windows"],
            "sim_mpc_cost": sim.get("cost"), "sim_mpc_replan_s": sim.get("replan_s"),
            "hindsight_cost": by.get("hindsight oracle", {}).get("cost"),
            "lower_bound_cost": by["lower bound"]["cost"],
            "learned_cost_on_yardstick_windows": by.get("learned", {}).get("cost"),
            "diff_vs_sim_mpc_ci95": sim.get("learned_minus_this_ci95"),
            "bound_below_every_controller": out["bound_below_every_controller"],
            "yardstick_command": out.get("command")}


def format_markdown(out: dict[str, Any]) -> str:
    """The ladder as a Markdown table with cost terms and paired differences."""
    lines = ["| controller | cost $ | energy $ | carbon $ | SLA LC $ | SLA batch $ | "
             "vs heuristic % [95% CI] | learned − this $ [95% CI] |",
             "|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        vs = r.get("diff_vs_heuristic_pct_ci95")
        vs_s = f"{vs[0]:+.1f} [{vs[1]:+.1f}, {vs[2]:+.1f}]" if vs else ""
        lm = r.get("learned_minus_this_ci95")
        lm_s = f"{lm[0]:+.2f} [{lm[1]:+.2f}, {lm[2]:+.2f}]" if lm else ""
        t = r.get("terms")
        cells = (f"{t['energy_usd']:.2f} | {t['carbon_usd']:.2f} | {t['sla_lc_usd']:.2f} | "
                 f"{t['sla_batch_usd']:.2f}") if t else " | | | "
        lines.append(f"| {r['name']} | {r['cost']:.2f} | {cells} | {vs_s} | {lm_s} |")
    return "\n".join(lines)
