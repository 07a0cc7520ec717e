"""The receding-horizon forecast MPC: re-plans the fluid program on forecasts every decision.

At each decision it knows what an online operator knows (:class:`envs.scenario.control.
PlanView`): the present, the held batch jobs with their deadlines, the running jobs, and
*forecasts* of price, carbon, solar and load (with their errors). It solves
:mod:`cloudrl.mpc.fluid` over the forecast horizon and applies the first period: how
much batch work runs now (``release_util``) and how many cores stay ready for the load it
expects before a booting server could arrive (``ready_cores``). Under a demand charge
(``cost.demand_usd_per_kw_month`` > 0) the program also prices raising its modelled peak
grid draw above the highest it has planned for a first period so far (the fluid model's
kW: busy cores only, no idle power).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from cloudrl.mpc.fluid import (
    FluidProblem,
    grid_usd_per_kwh,
    per_period,
    solve,
    watts_per_busy_core,
)
from envs.scenario.config import BATCH
from envs.scenario.control import PlanView, plan_view
from envs.scenario.sim import ScenarioSim


@dataclass(frozen=True)
class MPCConfig:
    """Knobs of the MPC (tuned on validation seeds like the heuristic's)."""

    max_util: float = 0.9  # planned busy cores / fleet cores at most
    ready_hedge: float = 0.25  # ready cores cover the forecast load times (1 + hedge)
    shortfall_factor: float = 3.0  # work past its deadline costs this x its SLA penalty
    horizon_hours: float | None = None  # None: the signals' forecast horizon
    # the plan's carbon price is the tariff's times this (an operator's internal carbon
    # price; 1: the tariff, what the cost counts)
    carbon_weight: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_util", "ready_hedge", "shortfall_factor", "horizon_hours",
                     "carbon_weight"):
            v = getattr(self, name)
            if v is None and name == "horizon_hours":
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v:
                raise ValueError(f"MPCConfig.{name} must be a number, got {v!r}")
        if not 0 < self.max_util <= 1.5:
            raise ValueError(f"MPCConfig.max_util must be in (0, 1.5], got {self.max_util}")
        if self.ready_hedge < -0.5 or self.shortfall_factor <= 0:  # the learned policy's menu
            raise ValueError("MPCConfig.ready_hedge must be >= -0.5 and shortfall_factor > 0")
        if not 0 <= self.carbon_weight <= 100:
            raise ValueError(f"MPCConfig.carbon_weight must be in [0, 100], got "
                             f"{self.carbon_weight}")


class ForecastMPC:
    """Receding-horizon plan on forecasts; see the module docstring."""

    name = "forecast_mpc"
    clairvoyant = False

    def __init__(self, config: MPCConfig | None = None, **overrides) -> None:
        base = config or MPCConfig()
        self.config = MPCConfig(**{**base.__dict__, **overrides}) if overrides else base
        self.solve_times: list[float] = []

    def reset(self, sim: ScenarioSim) -> None:
        self.solve_times = []
        cfg = self._cfg = sim.cfg
        self._wpc = watts_per_busy_core(sim.cores, sim.p_idle + sim.p_span)
        self._k = cfg.cost.pue * self._wpc * cfg.tick_seconds / 3600.0 / 1000.0
        b = cfg.classes[BATCH]
        dur = max(1.0, b.duration_min_mean * 60.0 / cfg.tick_seconds)
        self._batch_lag = cfg.minutes_to_ticks(b.slack_min) + int(round(dur))
        self._shortfall = self.config.shortfall_factor * cfg.cost.sla_usd[BATCH] / \
            max(b.cores_mean * dur, 1e-9)
        self._model_peak_kw = 0.0  # the demand charge's peak in the plan's units, so far

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        return self.decide_view(plan_view(sim))

    def decide_view(self, view: PlanView) -> tuple[float, float]:
        """The controls from what an online controller sees (also the service's path)."""
        plan_batch = self._plan(view)
        return controls_for(view, plan_batch, self.config.ready_hedge, view.load_fc)

    def _plan(self, v: PlanView) -> float:
        """Batch busy cores the plan wants in the coming period."""
        cfg, d = self._cfg, v.decision_ticks
        hours = self.config.horizon_hours
        h = len(v.price_fc) if hours is None else int(round(hours * cfg.ticks_per_hour))
        h = max(d, min(h, v.ticks_left))
        # tick 0 of the plan is now: the present values, then the forecasts
        price = np.concatenate([[v.price_now], v.price_fc])[:h]
        carbon = np.concatenate([[v.carbon_now], v.carbon_fc])[:h]
        solar = np.concatenate([[v.solar_now_kw], v.solar_fc_kw])[:h]
        lc = np.concatenate([v.load_fc[0, :1], v.load_fc[0]])[:h]
        lc = np.maximum(lc, v.running[0, :h])
        run_b = v.running[1, :h]
        arriving = np.concatenate([[0.0], v.load_fc[BATCH]])[:h]  # batch work per tick
        tick_h = v.tick_seconds / 3600.0
        base_w = self._wpc * (lc + run_b)
        # deadlines: held jobs by their own; forecast arrivals after slack + a mean run
        due_tick = np.zeros(h)
        work = v.pool_cores * v.pool_duration
        deadline = v.pool_latest + v.pool_duration - v.t
        np.add.at(due_tick, np.clip(deadline - 1, 0, h - 1), work)
        lag = min(self._batch_lag, max(v.ticks_left - 1, 0))
        due_arr = np.zeros(h)
        idx = np.arange(h) + lag
        ok = idx < h
        np.add.at(due_arr, idx[ok], arriving[ok])
        # arrivals whose deadline falls past the plan but inside the episode are not due here;
        # those past the episode's end are due at its end
        if v.ticks_left <= h:
            due_arr[-1] += arriving[~ok].sum()
        avail_tick = arriving.copy()
        avail_tick[0] += work.sum()
        problem = FluidProblem(
            grid_usd_per_kwh=per_period(grid_usd_per_kwh(
                price, carbon, cfg.cost.carbon_usd_per_tonne * self.config.carbon_weight), d,
                "mean"),
            export_usd_per_kwh=(cfg.signals.export_price_usd_per_mwh or 0.0) / 1000.0,
            base_kwh=per_period(cfg.cost.pue * base_w * tick_h / 1000.0, d),
            solar_kwh=per_period(solar * tick_h, d),
            room=per_period(np.maximum(self.config.max_util * v.fleet_cores - lc - run_b, 0.0), d),
            due=np.cumsum(per_period(due_tick + due_arr, d)),
            avail=np.cumsum(per_period(avail_tick, d)),
            kwh_per_core_tick=self._k, shortfall_usd_per_core_tick=self._shortfall,
            peak_usd_per_kw=cfg.demand_usd_per_kw, peak_floor_kw=self._model_peak_kw,
            period_hours=per_period(np.full(h, tick_h), d))
        plan = solve(problem)
        self.solve_times.append(plan.solve_s)
        if cfg.demand_usd_per_kw > 0:
            hours0 = min(d, h) * tick_h
            self._model_peak_kw = max(self._model_peak_kw, float(plan.grid_kwh[0]) / hours0)
        n0 = min(d, h)
        return float(run_b[:n0].mean() + plan.work[0] / n0)


def controls_for(v: PlanView, batch_busy: float, hedge: float, load_fc: np.ndarray
              ) -> tuple[float, float]:
    """(release_util, ready_cores) that realise ``batch_busy`` batch cores now and keep
    ready what the forecast latency-critical load needs before a boot could finish."""
    lc_committed = float(v.running[0, 0] + v.queued[0]) if v.running.shape[1] else v.queued[0]
    release_util = (lc_committed + batch_busy) / v.fleet_cores
    window = max(1, v.boot_ticks + v.decision_ticks)
    lc_peak = float(max(load_fc[0, :window].max(initial=0.0), lc_committed))
    batch_now = float(v.running[1, 0] + v.queued[1]) if v.running.shape[1] else v.queued[1]
    ready = lc_peak * (1.0 + hedge) + max(batch_busy, batch_now) + v.spare_cores
    return max(release_util, 0.0), min(ready, v.fleet_cores)
