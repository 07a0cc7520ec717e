"""The yardstick of a scenario: every controller on one ladder, from a provable floor up.

``cloudrl scenarios yardstick --scenario NAME --checkpoint DIR`` measures, on the same test
seeds (paired by seed), in this order:

1. the **lower bound** (:mod:`cloudrl.mpc.bound`): below every feasible policy's cost;
2. the **hindsight oracle** (:class:`cloudrl.mpc.sim_mpc.SimHindsightOracle`): the
   sim-MPC's search on the realised future, the best achievable plan it finds;
3. the **sim-MPC with perfect forecasts** (the scenario with ``signals.forecast_error = 0``;
   arrivals still sampled);
4. the **sim-MPC** on the scenario's own forecasts;
5. the **fluid MPC** (:mod:`cloudrl.mpc.forecast_mpc`) and the **fluid oracle** (its plan
   of the realised episode replayed; labelled as such, it is no bound);
6. the tuned **deadline-aware** rule and the tuned **signal-aware** heuristic.

The learned policy is placed among them. **Equal menus and budgets**: every rule and the
fluid MPC is tuned here on the same validation seeds with the same number of points, over
the learned policy's ready margins (``menu="wide"``: -0.5 to 1.0); the signal-aware rule is
also tuned over its historical range (``menu="narrow"``), so a reader sees whether opening
the menu changes it. Every difference is split into its cost terms (energy, carbon, SLA per
class) and the transitions, so a reader sees whether a policy wins on prices or on
deadlines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cloudrl.protocol import test_seeds
from cloudrl.scenarios.runner import ControllerSpec, paired_ci, run_controllers
from envs.scenario.config import ScenarioConfig

TERMS = ("energy_usd", "carbon_usd", "sla_lc_usd", "sla_batch_usd")
# the sim-MPC's knobs as tuned on scarcity_spikes' validation seeds (the grid of
# experiments/benchmarks/bench_sim_mpc.py; re-plans hourly) and the hindsight oracle's longer
# search; ``--sim-mpc`` / ``--hindsight`` override single keys
SIM_MPC_TUNED = {"samples": 2, "horizon": 16, "block_periods": 4, "iterations": 2,
                 "population": 8, "elites": 2, "replan_periods": 4}
HINDSIGHT_BUDGET = {"horizon": 12, "block_periods": 2, "iterations": 3, "population": 16,
                    "elites": 4, "replan_periods": 4}
LADDER = ("lower bound", "hindsight oracle", "sim-MPC, perfect forecasts", "sim-MPC",
          "fluid MPC", "fluid oracle", "deadline-aware rule", "heuristic, wide menu",
          "heuristic")


@dataclass
class YardstickConfig:
    """What to measure; defaults sized for a 2-core machine (see the results page)."""

    n_seeds: int = 10  # test seeds
    tune_samples: int = 16  # points per tuned family (the same for every family)
    tune_seeds: int = 8  # validation seeds for tuning
    sim_mpc: dict[str, Any] = field(default_factory=dict)
    hindsight: dict[str, Any] = field(default_factory=dict)
    workers: int | None = None
    bound: bool = True
    sim: bool = True  # the sim-MPC rows (the slow part)


def with_terms(cfg: ScenarioConfig, m: dict[str, float]) -> dict[str, float]:
    """An episode's metrics plus its SLA dollars per class (violations x the penalty)."""
    lc, batch = cfg.cost.sla_usd
    return {**m, "sla_lc_usd": m["violations_lc"] * lc,
            "sla_batch_usd": m["violations_batch"] * batch}


def _tune_all(cfg: ScenarioConfig, yc: YardstickConfig, log) -> dict[str, dict[str, Any]]:
    from cloudrl.scenarios.tuning import tune

    out = {}
    for label, kind, menu in (("heuristic", "signal_aware", "narrow"),
                              ("heuristic, wide menu", "signal_aware", "wide"),
                              ("deadline-aware rule", "deadline_aware", "wide"),
                              ("fluid MPC", "mpc", "wide")):
        t0 = time.perf_counter()
        res = tune(cfg, kind, yc.tune_samples, yc.tune_seeds, workers=yc.workers, menu=menu)
        out[label] = {"kind": kind, "menu": menu, "params": res.params,
                      "validation_cost": res.mean_cost, "default_cost": res.default_cost,
                      "n_points": res.n_samples, "n_seeds": res.n_seeds,
                      "wall_s": time.perf_counter() - t0}
        log(f"tuned {label}: ${res.mean_cost:.2f} on {res.n_seeds} validation seeds "
            f"({res.n_samples} points, {time.perf_counter() - t0:.0f} s)")
    return out


def measure(cfg: ScenarioConfig, checkpoint: str | None, yc: YardstickConfig,
            log=print) -> dict[str, Any]:
    """The ladder on ``yc.n_seeds`` test seeds (module docstring) as a JSON-ready dict."""
    t0 = time.perf_counter()
    seeds = list(test_seeds(yc.n_seeds))
    tuned = _tune_all(cfg, yc, log)
    specs = [ControllerSpec(v["kind"], v["params"], label) for label, v in tuned.items()]
    specs.append(ControllerSpec("oracle", {}, "fluid oracle"))
    if checkpoint:
        from cloudrl.scenarios.runner import checkpoint_kind

        specs.append(ControllerSpec(checkpoint_kind(checkpoint), {"checkpoint": checkpoint},
                                    "learned"))
    per: dict[str, list[dict[str, float]]] = {}
    res = run_controllers(cfg, specs, seeds, yc.workers, desc="yardstick")
    for spec, rows in zip(specs, res, strict=True):
        per[spec.name] = [with_terms(cfg, m) for m in rows]
    if yc.sim:
        for c, spec in sim_specs(cfg, yc, tuned["fluid MPC"]["params"]):
            (rows,) = run_controllers(c, [spec], seeds, yc.workers, desc=spec.name)
            per[spec.name] = [with_terms(cfg, m) for m in rows]
    bound = None
    if yc.bound:
        from cloudrl.mpc.bound import episode_bound

        bound = [float(episode_bound(cfg, s).bound_usd) for s in seeds]
    return summarise(cfg, seeds, per, bound, tuned, checkpoint,
                     wall_s=time.perf_counter() - t0, yc=yc)


def _row(name: str, ms: list[dict[str, float]], heur_cost: np.ndarray,
         heur_terms: dict[str, float]) -> dict[str, Any]:
    """One measured controller's row: means, cost terms, and its paired difference with the
    heuristic (the cost-term differences are differences of means: the same seeds)."""
    cost = np.array([m["cost_usd"] for m in ms])
    base = float(heur_cost.mean())
    terms = {t: float(np.mean([m[t] for m in ms])) for t in TERMS}
    d, lo, hi = paired_ci(cost, heur_cost)
    return {"name": name, "cost": float(cost.mean()), "per_seed": [float(c) for c in cost],
            "terms": terms,
            "transitions": float(np.mean([m["transitions"] for m in ms])),
            "sla_lc": float(np.mean([m["sla_lc"] for m in ms])),
            "sla_batch": float(np.mean([m["sla_batch"] for m in ms])),
            "decide_ms": float(np.mean([m.get("decide_ms", 0.0) for m in ms])),
            "replan_s": float(np.mean([m.get("solve_s", 0.0) for m in ms])),
            "diff_vs_heuristic_pct_ci95": [100 * x / base for x in (d, lo, hi)],
            "terms_diff_vs_heuristic": {t: terms[t] - heur_terms[t] for t in TERMS}}


def _finish(out: dict[str, Any]) -> None:
    """Order the rows as the ladder, pair each with the learned policy, check the bound."""
    by = {r["name"]: r for r in out["rows"]}
    out["rows"] = [by[n] for n in (*LADDER, "learned") if n in by]
    if "learned" in by:
        learned = np.array(by["learned"]["per_seed"])
        for r in out["rows"]:
            if r["name"] not in ("learned", "lower bound"):
                r["learned_minus_this_ci95"] = list(paired_ci(learned, np.array(r["per_seed"])))
    if "lower bound" in by:
        bound = by["lower bound"]["per_seed"]
        out["bound_below_every_controller"] = all(
            b <= c + 1e-9 for r in out["rows"] if r["name"] != "lower bound"
            for b, c in zip(bound, r["per_seed"], strict=True))


def summarise(cfg: ScenarioConfig, seeds: list[int], per: dict[str, list[dict[str, float]]],
              bound: list[float] | None, tuned: dict[str, Any], checkpoint: str | None,
              wall_s: float, yc: YardstickConfig) -> dict[str, Any]:
    """Means, cost terms and paired differences of every row (the learned one included)."""
    heur = per["heuristic"]
    heur_cost = np.array([m["cost_usd"] for m in heur])
    heur_terms = {t: float(np.mean([m[t] for m in heur])) for t in TERMS}
    rows = [_row(name, ms, heur_cost, heur_terms) for name, ms in per.items()]
    if bound is not None:
        rows.append({"name": "lower bound", "cost": float(np.mean(bound)), "per_seed": bound})
    out = {"scenario": cfg.name, "n_test_seeds": len(seeds), "seeds": seeds,
           "checkpoint": checkpoint, "tuning": tuned, "rows": rows,
           "bound_below_every_controller": None, "wall_s": wall_s,
           "config": {"n_seeds": yc.n_seeds, "tune_samples": yc.tune_samples,
                      "tune_seeds": yc.tune_seeds, "sim_mpc": yc.sim_mpc,
                      "hindsight": yc.hindsight}}
    _finish(out)
    return out


def sim_specs(cfg: ScenarioConfig, yc: YardstickConfig, mpc: dict[str, Any]
              ) -> list[tuple[ScenarioConfig, ControllerSpec]]:
    """The sim rows: the sim-MPC, the same search with the future's signals known (the
    scenario with ``forecast_error = 0``; arrivals still sampled), the hindsight oracle."""
    perfect = cfg.model_copy(update={"signals": cfg.signals.model_copy(
        update={"forecast_error": 0.0})})
    sim = {**SIM_MPC_TUNED, **yc.sim_mpc, "mpc": mpc}
    return [(cfg, ControllerSpec("sim_mpc", sim, "sim-MPC")),
            (perfect, ControllerSpec("sim_mpc", sim, "sim-MPC, perfect forecasts")),
            (cfg, ControllerSpec("sim_hindsight", {**HINDSIGHT_BUDGET, **yc.hindsight,
                                                   "mpc": mpc}, "hindsight oracle"))]


def measure_rows(cfg: ScenarioConfig, out: dict[str, Any],
                 specs: list[tuple[ScenarioConfig, ControllerSpec]],
                 workers: int | None = None) -> None:
    """Measure ``specs`` on the ladder's own test seeds and put their rows into ``out`` (a
    ladder this module wrote), replacing rows of the same name; the learned pairing and the
    bound check follow. Each spec runs in its own config (the perfect-forecast copy)."""
    by = {r["name"]: r for r in out["rows"]}
    heur = by["heuristic"]
    heur_cost = np.array(heur["per_seed"])
    seeds = [int(s) for s in out["seeds"]]
    for c, spec in specs:
        (ms,) = run_controllers(c, [spec], seeds, workers, desc=spec.name)
        by[spec.name] = _row(spec.name, [with_terms(cfg, m) for m in ms], heur_cost,
                             heur["terms"])
    out["rows"] = list(by.values())
    _finish(out)


def attach_bound(out: dict[str, Any], bound: list[float]) -> None:
    """Put per-seed bounds computed elsewhere (the same seeds) at the foot of the ladder."""
    out["rows"] = [r for r in out["rows"] if r["name"] != "lower bound"]
    out["rows"].insert(0, {"name": "lower bound", "cost": float(np.mean(bound)),
                           "per_seed": bound})
    costs = [r["per_seed"] for r in out["rows"][1:]]
    out["bound_below_every_controller"] = all(b <= c + 1e-9 for row in costs
                                              for b, c in zip(bound, row, strict=True))


SIM_FROM_BENCH = {"sim-MPC": "sim_mpc_K2", "hindsight oracle": "sim_hindsight"}


def attach_sim(out: dict[str, Any], bench: dict[str, Any]) -> None:
    """The sim-MPC and hindsight rows of an ``experiments/benchmarks/bench_sim_mpc.py``
    run (its ``results.json``) on the same test seeds, placed on the ladder: costs, paired
    differences and the time per re-plan (that run recorded no cost terms)."""
    test = bench["test"]
    if [int(s) for s in test["seeds"]] != [int(s) for s in out["seeds"]]:
        raise ValueError("--sim-from: its test seeds differ from the ladder's")
    by = {r["name"]: r for r in out["rows"]}
    heur = np.array(by["heuristic"]["per_seed"])
    learned = np.array(by["learned"]["per_seed"]) if "learned" in by else None
    base = float(heur.mean())
    for name, key in SIM_FROM_BENCH.items():
        got = test["table"][key]
        cost = np.array(got["per_seed"], float)
        row: dict[str, Any] = {"name": name, "cost": float(cost.mean()),
                               "per_seed": [float(c) for c in cost],
                               "replan_s": got.get("replan_s"),
                               "source": f"bench_sim_mpc ({test.get('config', key)})"}
        row["diff_vs_heuristic_pct_ci95"] = [100 * x / base for x in paired_ci(cost, heur)]
        if learned is not None:
            row["learned_minus_this_ci95"] = list(paired_ci(learned, cost))
        by[name] = row
    out["rows"] = [by[n] for n in (*LADDER, "learned") if n in by]
    if out.get("bound_below_every_controller") is not None:
        bound = out["rows"][0]["per_seed"]
        out["bound_below_every_controller"] = all(
            b <= c + 1e-9 for r in out["rows"][1:] for b, c in zip(bound, r["per_seed"],
                                                                    strict=True))
    out["sim_from"] = bench.get("machine")


def headline_fields(out: dict[str, Any]) -> dict[str, Any]:
    """The ladder's fields for the scenario's row of ``docs/results/headline.json`` (on the
    ladder's own test seeds, named in ``yardstick_seeds``)."""
    by = {r["name"]: r for r in out["rows"]}

    def cost(name: str) -> float | None:
        return by[name]["cost"] if name in by else None

    sim = by.get("sim-MPC", {})
    return {
        "yardstick_seeds": out["seeds"], "yardstick_command": out.get("command"),
        "yardstick_added_by": out.get("commands", []),  # the --measure runs after it
        "lower_bound_cost": cost("lower bound"), "hindsight_cost": cost("hindsight oracle"),
        "sim_mpc_cost": cost("sim-MPC"), "sim_mpc_replan_s": sim.get("replan_s"),
        "learned_cost_on_yardstick_seeds": cost("learned"),
        "diff_vs_sim_mpc_ci95": sim.get("learned_minus_this_ci95"),
        "decomposition": [{k: r[k] for k in ("name", "cost", "terms", "transitions",
                                             "diff_vs_heuristic_pct_ci95",
                                             "learned_minus_this_ci95") if k in r}
                          for r in out["rows"]]}


def merge_into_headline(path, out: dict[str, Any]) -> bool:
    """Add :func:`headline_fields` to the scenario's row of ``path``; False if none."""
    import json
    from pathlib import Path

    p = Path(path)
    data = json.loads(p.read_text())
    for row in data.get("scenarios", []):
        if row.get("scenario") == out["scenario"]:
            row.update(headline_fields(out))
            p.write_text(json.dumps(data, indent=2) + "\n")
            return True
    return False


def format_markdown(out: dict[str, Any]) -> str:
    """The ladder as a Markdown table, cheapest first as measured, with cost terms."""
    head = ("| controller | cost $ | energy $ | carbon $ | SLA LC $ | SLA batch $ | "
            "transitions | vs heuristic % [95% CI] | learned − this $ [95% CI] |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        if "terms" not in r:
            vs = r.get("diff_vs_heuristic_pct_ci95")
            vs_s = f"{vs[0]:+.1f} [{vs[1]:+.1f}, {vs[2]:+.1f}]" if vs else ""
            lm = r.get("learned_minus_this_ci95")
            lm_s = f"{lm[0]:+.2f} [{lm[1]:+.2f}, {lm[2]:+.2f}]" if lm else ""
            lines.append(f"| {r['name']} | {r['cost']:.2f} | | | | | | {vs_s} | {lm_s} |")
            continue
        t = r["terms"]
        vs = r["diff_vs_heuristic_pct_ci95"]
        vs_s = "" if r["name"] == "heuristic" else f"{vs[0]:+.1f} [{vs[1]:+.1f}, {vs[2]:+.1f}]"
        lm = r.get("learned_minus_this_ci95")
        lm_s = f"{lm[0]:+.2f} [{lm[1]:+.2f}, {lm[2]:+.2f}]" if lm else ""
        lines.append(f"| {r['name']} | {r['cost']:.2f} | {t['energy_usd']:.2f} | "
                     f"{t['carbon_usd']:.2f} | {t['sla_lc_usd']:.2f} | {t['sla_batch_usd']:.2f}"
                     f" | {r['transitions']:.0f} | {vs_s} | {lm_s} |")
    return "\n".join(lines)
