"""Site designs: which change to a real site would leave room for planning (or learning)?

A *design* is a documented override of a site's scenario (:func:`design_config`): more
deferrable work, longer batch deadlines, a lower or higher fleet load, or a tariff with a
monthly peak-kW demand charge that the simulator charges (``cost.demand_usd_per_kw_month``,
:mod:`envs.scenario.sim`). For each design, on the same stratified test windows of the
site's split (:func:`pick_windows`):

1. **Tune** the signal-aware rule and the fluid forecast MPC on the split's *validation*
   period (each validation seed draws its own start day there): the same number of
   points and seeds for both families (:func:`rule_points`, :func:`mpc_points`); the
   cheapest mean cost wins. The rule's existing power cap, ``release_util`` (the share of
   the fleet's cores that held work may fill), is searched down to 0.4 with ``quantile``
   up to 1 (never defer: valley filling under the cap; one point, :data:`PEAK_SHAVING`, is
   such a cap at 0.6), so the rule can shave a peak; the
   MPC's fluid program prices its own peak under a demand charge (:mod:`cloudrl.mpc.fluid`)
   and its ``max_util`` is searched down to 0.4.
2. **Test**: the tuned rule, the tuned MPC, the fluid oracle (three plans on the realised
   episode, the cheapest replayed; it plans with the demand charge too) and the provable
   lower bound (:func:`cloudrl.mpc.bound.episode_bound`, energy + carbon + SLA, plus the
   demand charge of the fleet's floor draw, the least any schedule's peak can be) on every
   window, the same window and seed for each.

The gap between the tuned rule and the oracle (achievable with hindsight) and the bound
(no schedule does better) is the most any learner could gain on that design.

Every episode runs as a Ray task (:mod:`cloudrl.parallel`, ``--workers`` of them).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from cloudrl.sites.registry import Site
from cloudrl.sites.scenario import site_scenario
from cloudrl.sites.splits import Window, episode_windows
from envs.scenario.config import ScenarioConfig

CLASS_INDEX = {"latency_critical": 0, "batch": 1}
TERMS = ("cost_usd", "energy_usd", "carbon_usd", "sla_lc_usd", "sla_batch_usd", "demand_usd",
         "demand_peak_kw", "sla_lc", "sla_batch")
DIFF_TERMS = ("cost_usd", "energy_usd", "carbon_usd", "sla_lc_usd", "sla_batch_usd",
              "demand_usd")
CONTROLLERS = ("rule", "mpc", "oracle", "bound")


@dataclass(frozen=True)
class Design:
    """Overrides of a site's scenario: ``set`` puts values at dotted paths, ``scale``
    multiplies the value found there (``classes.batch`` is the batch class)."""

    name: str
    summary: str
    set: dict[str, float] = field(default_factory=dict)
    scale: dict[str, float] = field(default_factory=dict)


DESIGNS: dict[str, Design] = {d.name: d for d in (
    Design("baseline", "as shipped"),
    Design("flex_50", "50% of the offered load is deferrable batch work",
           set={"classes.batch.load_share": 0.5, "classes.latency_critical.load_share": 0.5}),
    Design("flex_80", "80% of the offered load is deferrable batch work",
           set={"classes.batch.load_share": 0.8, "classes.latency_critical.load_share": 0.2}),
    Design("slack_2x", "batch deadlines with twice the slack",
           scale={"classes.batch.slack_min": 2.0}),
    Design("slack_4x", "batch deadlines with four times the slack",
           scale={"classes.batch.slack_min": 4.0}),
    Design("load_low", "fleet utilisation 0.35", set={"utilization": 0.35}),
    Design("load_high", "fleet utilisation 0.75", set={"utilization": 0.75}),
    Design("demand_15", "a demand charge of $15 per kW-month on the peak 15-min grid draw, "
           "prorated to the window (days / 30)",
           set={"cost.demand_usd_per_kw_month": 15.0, "cost.demand_block_minutes": 15.0}),
)}
DEFAULT_DESIGNS = tuple(DESIGNS)


class DesignError(ValueError):
    """A design name or override that cannot be applied (the message names it)."""


def parse_designs(text: str | None) -> list[Design]:
    """``"a,b"`` -> those designs (all when None); a DesignError names an unknown one."""
    if text is None:
        return list(DESIGNS.values())
    names = [n.strip() for n in text.split(",")]
    out = []
    for n in names:
        if n not in DESIGNS:
            raise DesignError(f"--designs: {n!r} is not a design (known: "
                              f"{', '.join(DESIGNS)})")
        if n not in [d.name for d in out]:
            out.append(DESIGNS[n])
    return out


def _slot(data: dict, path: str) -> tuple[Any, Any]:
    """(container, key) of a dotted path in a model dump; DesignError if it is not there."""
    parts = path.split(".")
    node: Any = data
    for i, p in enumerate(parts[:-1]):
        key: Any = CLASS_INDEX.get(p, p) if isinstance(node, (list, tuple)) else p
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            raise DesignError(f"design override {path!r}: no {'.'.join(parts[:i + 1])!r} "
                              "in the scenario") from None
    last = parts[-1]
    if not isinstance(node, dict) or last not in node:
        raise DesignError(f"design override {path!r}: no such field in the scenario")
    return node, last


def design_config(base: ScenarioConfig, design: Design) -> ScenarioConfig:
    """``base`` with the design's overrides, validated (a DesignError names a bad one)."""
    data = base.model_dump()
    for path, v in design.set.items():
        node, key = _slot(data, path)
        node[key] = v
    for path, f in design.scale.items():
        node, key = _slot(data, path)
        node[key] = node[key] * f
    if design.set or design.scale:
        data["name"] = f"{base.name}+{design.name}"
    try:
        return ScenarioConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "scenario"
        raise DesignError(f"design {design.name!r}: {where}: {err['msg']}") from None


def scenario(site: Site, split: str, part: str, design: Design, start_date: str | None,
             carbon_model: str) -> ScenarioConfig:
    return design_config(site_scenario(site, split, part, start_date=start_date,
                                       carbon_model=carbon_model), design)


def pick_windows(site: Site, split: str, n: int, need_seconds: float, days: float
                 ) -> list[Window]:
    """``n`` test windows stratified by season: ``n // 4`` per season (one more for the
    first ``n % 4`` of DJF, MAM, JJA, SON), evenly spaced in time inside each season."""
    windows = episode_windows(site, split, need_seconds, days)
    out: list[Window] = []
    for i, season in enumerate(("DJF", "MAM", "JJA", "SON")):
        ws = [w for w in windows if w.season == season]
        k = min(n // 4 + (1 if i < n % 4 else 0), len(ws))
        if k:
            out += [ws[j] for j in np.unique(np.linspace(0, len(ws) - 1, k).round().astype(int))]
    return sorted(out, key=lambda w: w.index)


# the rule's peak-shaving point: never defer, fill at most 60% of the fleet's cores
PEAK_SHAVING = {"quantile": 1.0, "window_hours": 12.0, "release_util": 0.6,
                "ready_margin": 0.25, "guard_hours": 2.0}


def rule_points(n: int, seed: int = 0) -> list[dict[str, float]]:
    """The signal-aware rule's search: its defaults, ``n - 2`` seeded random points and
    :data:`PEAK_SHAVING` (``n`` points in all)."""
    from cloudrl.heuristics.signal_aware import SignalAwareConfig

    rng = np.random.default_rng(seed)
    pts = [asdict(SignalAwareConfig())]
    for _ in range(n - 2):
        pts.append({"quantile": float(rng.uniform(0.05, 1.0)),
                    "window_hours": float(rng.choice([6.0, 12.0, 24.0])),
                    "release_util": float(rng.uniform(0.4, 1.0)),
                    "ready_margin": float(rng.uniform(-0.5, 1.0)),
                    "guard_hours": float(rng.choice([0.0, 1.0, 2.0, 4.0]))})
    if n >= 2:
        pts.append(dict(PEAK_SHAVING))
    return pts


def mpc_points(n: int, seed: int = 0) -> list[dict[str, float]]:
    """The MPC's search: its defaults, then ``n - 1`` seeded random points."""
    rng = np.random.default_rng(seed)
    pts: list[dict[str, float]] = [{}]
    for _ in range(n - 1):
        pts.append({"max_util": float(rng.uniform(0.4, 0.95)),
                    "ready_hedge": float(rng.uniform(-0.5, 1.0))})
    return pts


def _controller(kind: str, params: dict[str, Any]):
    if kind == "rule":
        from cloudrl.heuristics.signal_aware import SignalAwareConfig, SignalAwareDeferral

        return SignalAwareDeferral(SignalAwareConfig.from_dict(params))
    if kind == "mpc":
        from cloudrl.mpc.forecast_mpc import ForecastMPC, MPCConfig

        return ForecastMPC(MPCConfig(**params))
    if kind == "oracle":
        from cloudrl.mpc.oracle import ClairvoyantOracle, OracleConfig

        return ClairvoyantOracle(OracleConfig(**params))
    raise ValueError(f"controller kind {kind!r}")


def play(cfg: ScenarioConfig, kind: str, params: dict[str, Any], seed: int) -> dict[str, float]:
    """One episode: every cost term, SLA $ per class, the demand charge and its peak kW."""
    from envs.scenario.control import run_episode
    from envs.scenario.sim import ScenarioSim

    res = run_episode(ScenarioSim(cfg), _controller(kind, params), seed)
    m = dict(res.metrics)
    m["sla_lc_usd"] = m["violations_lc"] * cfg.cost.sla_usd[0]
    m["sla_batch_usd"] = m["violations_batch"] * cfg.cost.sla_usd[1]
    return {t: float(m[t]) for t in TERMS}


def demand_floor_kw(cfg: ScenarioConfig, seed: int) -> float:
    """The least peak any schedule of ``seed``'s episode can be charged for (kW): every server
    draws at least its lowest state's share of idle power, times PUE, less solar, averaged
    over each demand block."""
    from envs.scenario.sim import ScenarioSim

    sim = ScenarioSim(cfg)
    sim.reset(seed)
    pw = cfg.power
    floor_w = cfg.cost.pue * float(min(1.0, pw.suspended_fraction, pw.off_fraction)
                                   * sim.p_idle.sum())
    grid = np.maximum(floor_w - sim.signals.solar_kw[:sim.n_ticks] * 1000.0, 0.0) / 1000.0
    b = cfg.demand_block_ticks
    blocks = [grid[i:i + b].mean() for i in range(0, len(grid), b)]
    return float(max(blocks))


def bound(cfg: ScenarioConfig, seed: int) -> dict[str, float]:
    """The provable lower bound of the episode (dollars) and its demand part."""
    from cloudrl.mpc.bound import episode_bound

    b = episode_bound(cfg, seed)
    peak = demand_floor_kw(cfg, seed)
    demand = peak * cfg.demand_usd_per_kw
    return {"cost_usd": b.bound_usd + demand, "demand_usd": demand, "demand_peak_kw": peak,
            "energy_carbon_sla_usd": b.bound_usd, "lp_sla_usd": b.lp_sla_usd}


def _item(item: tuple) -> dict[str, float]:
    """One Ray task: ``(site, split, design, part, start_date, seed, kind, params,
    carbon_model)`` -> the episode's terms (the bound for kind ``bound``)."""
    site, split, design, part, start, seed, kind, params, carbon_model = item
    cfg = scenario(site, split, part, design, start, carbon_model)
    if kind == "bound":
        return bound(cfg, seed)
    return play(cfg, kind, params, seed)


def sweep(site: Site, split: str, designs: list[Design], n_windows: int, tune_points: int,
          tune_seeds: int, workers: int, carbon_model: str = "seasonal_naive",
          with_bound: bool = True, on_design=None, windows: list[Window] | None = None
          ) -> dict[str, Any]:
    """Tune and test every design (module docstring); raw results. ``on_design(raw)`` is
    called after each design with the results so far; ``windows`` (an earlier run's) replace
    the stratified pick."""
    from cloudrl.parallel import WorkerPool
    from cloudrl.protocol import validation_seeds

    t0 = time.perf_counter()
    cfgs = {d.name: scenario(site, split, "test", d, None, carbon_model) for d in designs}
    probe = max(cfgs.values(), key=lambda c: c.signal_ticks * c.tick_seconds)
    if windows is None:
        windows = pick_windows(site, split, n_windows, probe.signal_ticks * probe.tick_seconds,
                               probe.days)
    if not windows:
        raise DesignError(f"site {site.name!r} split {split!r}: no test window fits")
    seeds = list(validation_seeds(tune_seeds))
    families = {"rule": rule_points(tune_points), "mpc": mpc_points(tune_points)}
    raw: dict[str, Any] = {
        "site": site.name, "split": split, "periods": site.splits[split].model_dump(),
        "windows": [asdict(w) for w in windows], "carbon_model": carbon_model,
        "size": {"windows": len(windows), "tune_points": tune_points,
                 "tune_seeds": tune_seeds, "workers": workers},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "designs": {}}
    with WorkerPool(workers) as pool:
        for d in designs:
            t1 = time.perf_counter()
            items = [(site, split, d, "validation", None, s, kind, p, carbon_model)
                     for kind, pts in families.items() for p in pts for s in seeds]
            res = pool.map(_item, items, desc=f"{site.name} {d.name} tune")
            tuned: dict[str, Any] = {}
            k = 0
            for kind, pts in families.items():
                costs = []
                for _ in pts:
                    costs.append(float(np.mean([r["cost_usd"] for r in res[k:k + len(seeds)]])))
                    k += len(seeds)
                best = int(np.argmin(costs))
                tuned[kind] = {"params": pts[best], "validation_cost": costs[best],
                               "default_validation_cost": costs[0], "points": len(pts)}
            specs = [("rule", tuned["rule"]["params"]), ("mpc", tuned["mpc"]["params"]),
                     ("oracle", {})] + ([("bound", {})] if with_bound else [])
            items = [(site, split, d, "test", w.start_date, w.seed, kind, p, carbon_model)
                     for kind, p in specs for w in windows]
            res = pool.map(_item, items, desc=f"{site.name} {d.name} test")
            n = len(windows)
            cfg = cfgs[d.name]
            raw["designs"][d.name] = {
                "summary": d.summary, "set": d.set, "scale": d.scale,
                "scenario": {"utilization": cfg.utilization,
                             "batch_share": cfg.classes[1].load_share,
                             "batch_slack_min": cfg.classes[1].slack_min,
                             "demand_usd_per_kw_month": cfg.cost.demand_usd_per_kw_month},
                "tuned": tuned,
                "per_window": {kind: res[i * n:(i + 1) * n] for i, (kind, _) in enumerate(specs)},
                "wall_s": time.perf_counter() - t1}
            raw["wall_s"] = time.perf_counter() - t0
            if on_design is not None:
                on_design(raw)
    return raw


def _ci(a: np.ndarray, b: np.ndarray) -> list[float]:
    from cloudrl.scenarios.runner import paired_ci

    return [float(x) for x in paired_ci(a, b)]


def summarise(design_raw: dict[str, Any]) -> dict[str, Any]:
    """Means per controller and term, and paired 95% CIs against the rule (in $ per term,
    and in % of the rule's mean cost)."""
    per = design_raw["per_window"]
    arr = {k: {t: np.array([m.get(t, np.nan) for m in rows]) for t in TERMS}
           for k, rows in per.items()}
    rule = arr["rule"]
    base = float(rule["cost_usd"].mean())
    out: dict[str, Any] = {"means": {}, "vs_rule": {}, "vs_rule_pct": {}}
    for k, a in arr.items():
        out["means"][k] = {t: float(np.nanmean(a[t])) if np.isfinite(a[t]).any() else None
                           for t in TERMS}
        if k == "rule":
            continue
        out["vs_rule_pct"][k] = [100.0 * x / base for x in _ci(a["cost_usd"], rule["cost_usd"])]
        out["vs_rule"][k] = {t: _ci(a[t], rule[t]) for t in DIFF_TERMS
                             if k != "bound" or t in ("cost_usd", "demand_usd")}
    return out

