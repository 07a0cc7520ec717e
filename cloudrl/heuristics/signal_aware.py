"""The signal-aware deferral rule: run batch work when the grid is cheap, else hold it.

On top of the power-aware executor every scenario controller shares (best-fit placement
by efficiency, idle servers suspended, capacity woken for waiting work), the rule decides
the two standing controls from the present and the forecasts:

* **Deferral.** The marginal cost of a grid kWh now (price + carbon price x intensity;
  the export price, or 0, while on-site solar exceeds the load) is compared with the
  ``quantile`` of the same cost over the next ``window_hours`` of forecasts. At or below
  it, held batch work is released up to ``release_util`` of the fleet's cores, less the
  growth of the forecast latency-critical load over the next ``guard_hours`` (so a
  release does not crowd out the coming peak); above it, work is held until its slack
  runs out (the executor then releases it regardless).
* **Wake-ahead.** Enough cores stay ready (not off) for the forecast latency-critical
  peak over the next boot time and decision period, times ``1 + ready_margin``, plus the
  batch work committed now and the executor's spare.

Its knobs are tuned on validation seeds (``cloudrl scenarios tune``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Self

import numpy as np

from envs.scenario.control import PlanView, plan_view, release_and_ready
from envs.scenario.sim import ScenarioSim


@dataclass(frozen=True)
class SignalAwareConfig:
    quantile: float = 0.3
    window_hours: float = 12.0
    release_util: float = 0.9
    ready_margin: float = 0.25
    guard_hours: float = 2.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.quantile <= 1.0:
            raise ValueError(f"SignalAwareConfig.quantile must be in [0, 1], got {self.quantile}")
        if not 0.25 <= self.window_hours <= 168.0:
            raise ValueError("SignalAwareConfig.window_hours must be in [0.25, 168]")
        if not 0.0 <= self.release_util <= 2.0:
            raise ValueError("SignalAwareConfig.release_util must be in [0, 2]")
        if not 0.0 <= self.guard_hours <= 24.0:
            raise ValueError("SignalAwareConfig.guard_hours must be in [0, 24]")
        if not -0.5 <= self.ready_margin <= 5.0:  # -0.5: the learned policy's lowest margin
            raise ValueError("SignalAwareConfig.ready_margin must be in [-0.5, 5]")

    @classmethod
    def from_dict(cls, params: dict) -> Self:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown parameter(s) {unknown}")
        return cls(**params)


class SignalAwareDeferral:
    """Threshold deferral with forecast wake-ahead; see the module docstring."""

    name = "signal_aware"
    clairvoyant = False

    def __init__(self, config: SignalAwareConfig | None = None, **overrides) -> None:
        base = config or SignalAwareConfig()
        self.config = SignalAwareConfig(**{**base.__dict__, **overrides}) if overrides else base

    def reset(self, sim: ScenarioSim) -> None:
        cfg = sim.cfg
        self._ticks_per_hour = cfg.ticks_per_hour
        self._cp = cfg.cost.carbon_usd_per_tonne
        self._export = float(cfg.signals.export_price_usd_per_mwh or 0.0)
        self._kw_per_core = cfg.cost.pue * float((sim.p_idle + sim.p_span).sum()
                                                 / sim.cores.sum()) / 1000.0

    def marginal(self, price: np.ndarray, carbon: np.ndarray, solar_kw: np.ndarray,
                 load_cores: np.ndarray) -> np.ndarray:
        """$/MWh of the next kWh: the grid's price and carbon, or the export price while
        solar covers the load."""
        grid = price + carbon * self._cp / 1000.0
        return np.where(solar_kw >= load_cores * self._kw_per_core, self._export, grid)

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        return self.decide_view(plan_view(sim))

    def decide_view(self, v: PlanView) -> tuple[float, float]:
        """The controls from what an online controller sees (also the service's path)."""
        cfg = self.config
        h = max(1, min(int(round(cfg.window_hours * self._ticks_per_hour)), len(v.price_fc)))
        load_now = float(v.running[:, 0].sum() + sum(v.queued)) if v.running.shape[1] else 0.0
        now = self.marginal(np.array([v.price_now]), np.array([v.carbon_now]),
                            np.array([v.solar_now_kw]), np.array([load_now]))[0]
        load_fc = v.load_fc[:, :h].sum(axis=0)
        ahead = self.marginal(v.price_fc[:h], v.carbon_fc[:h], v.solar_fc_kw[:h], load_fc)
        cheap = now <= np.quantile(np.concatenate([[now], ahead]), cfg.quantile)
        release = 0.0
        if cheap:
            g = max(1, int(round(cfg.guard_hours * self._ticks_per_hour)))
            lc_now = float(v.running[0, 0] + v.queued[0]) if v.running.shape[1] else 0.0
            growth = max(float(v.load_fc[0, :g].max(initial=0.0)) - lc_now, 0.0) \
                if cfg.guard_hours > 0 else 0.0
            release = max(cfg.release_util - growth / v.fleet_cores, 0.0)
        return release_and_ready(v, release, cfg.ready_margin)
