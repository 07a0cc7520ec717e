"""The plant-true MPC: plans by rolling the real simulator forward on sampled futures.

At each re-plan (every ``replan_periods`` decision periods) it copies the simulator with
its future blanked out (:func:`blank_future`: the controller never reads a realised
arrival or signal), samples ``samples`` futures from the workload model and the forecast
error model (:func:`sample_future`), and searches plans of ``horizon`` decision periods,
piecewise constant over blocks of ``block_periods``, in the learned policy's control
space (release level x ready margin), by the cross-entropy method (:func:`cem`): every
plan is played through each future's copy of the real :class:`ScenarioSim` and scored by
the simulator's own cost plus a terminal value for the work left (:mod:`.rollout`).
Warm starts: the previous best plan shifted by the periods since, and the fluid forecast
MPC's decision held over the horizon. The best plan's first period is applied; between
re-plans the plan's next periods are (each margin turned into ready cores in the state
then). Rollouts run on ``workers`` Ray actors (:class:`RolloutPool`); ``workers=1`` runs
them in this process with the same result.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field

import numpy as np

from cloudrl.mpc.forecast_mpc import ForecastMPC, MPCConfig
from cloudrl.mpc.sim_mpc.cem import cem
from cloudrl.mpc.sim_mpc.future import (
    Forecasts,
    blank_future,
    published_price_ticks,
    sample_future,
)
from cloudrl.mpc.sim_mpc.pool import RolloutPool
from cloudrl.mpc.sim_mpc.rollout import FINE_READY_MARGINS, FINE_RELEASE_LEVELS, Scoring, snap
from envs.scenario.control import PlanView, plan_view, release_and_ready
from envs.scenario.sim import ScenarioSim

_INTS = ("samples", "horizon", "block_periods", "iterations", "population", "elites",
         "replan_periods", "seed", "workers")


@dataclass(frozen=True)
class SimMPCConfig:
    """Knobs of the sim-MPC (tuned on validation seeds; see docs/results/yardstick.md)."""

    samples: int = 4  # K sampled futures per re-plan
    horizon: int = 8  # decision periods planned
    block_periods: int = 2  # periods per piecewise-constant block
    iterations: int = 3  # CEM iterations
    population: int = 16  # plans scored per iteration
    elites: int = 4
    replan_periods: int = 1  # re-plan every this many decision periods
    init_std: tuple[float, float] = (0.2, 0.4)  # CEM's first spread: release, margin
    terminal_quantile: float = 0.5  # price quantile of a held job's remaining window
    seed: int = 0
    workers: int = 1  # Ray actors scoring rollouts (1: in this process)
    mpc: dict = field(default_factory=dict)  # the fluid MPC's knobs (warm start)

    def __post_init__(self) -> None:
        for name in _INTS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ValueError(f"SimMPCConfig.{name} must be an integer, got {v!r}")
            if name != "seed" and v < 1:
                raise ValueError(f"SimMPCConfig.{name} must be >= 1, got {v}")
        if self.elites > self.population:
            raise ValueError(f"SimMPCConfig.elites ({self.elites}) must be <= population "
                             f"({self.population})")
        if not 0.0 <= self.terminal_quantile <= 1.0:
            raise ValueError("SimMPCConfig.terminal_quantile must be in [0, 1], got "
                             f"{self.terminal_quantile}")
        if len(self.init_std) != 2 or min(self.init_std) <= 0:
            raise ValueError(f"SimMPCConfig.init_std must be two numbers > 0, got "
                             f"{self.init_std!r}")

    @property
    def blocks(self) -> int:
        return -(-self.horizon // self.block_periods)


def menu_point(v: PlanView, release_util: float, ready_cores: float) -> np.ndarray:
    """The menu's (release, margin) nearest to the controls ``(release_util, ready_cores)``."""
    levels = np.asarray(FINE_RELEASE_LEVELS, dtype=float)
    i = int(np.argmin(np.abs(levels - release_util)))
    ready = np.array([release_and_ready(v, 0.0, m)[1] for m in FINE_READY_MARGINS])
    j = int(np.argmin(np.abs(ready - ready_cores)))  # ties: the lower margin
    return np.array([FINE_RELEASE_LEVELS[i], FINE_READY_MARGINS[j]])


class SimMPC:
    """Receding-horizon CEM on rollouts of the real simulator; see the module docstring."""

    name = "sim_mpc"
    clairvoyant = False

    def __init__(self, config: SimMPCConfig | None = None, **overrides) -> None:
        base = config or SimMPCConfig()
        self.config = SimMPCConfig(**{**base.__dict__, **overrides}) if overrides else base
        self.solve_times: list[float] = []  # seconds per re-plan
        self.plans: list[tuple[int, np.ndarray, float]] = []  # (t, best plan, its score)
        self._pool: RolloutPool | None = None

    # ------------------------------------------------------------------ the controller
    def reset(self, sim: ScenarioSim) -> None:
        self.solve_times, self.plans = [], []
        self._scoring = Scoring.for_sim(sim, self.config.terminal_quantile)
        self._fluid = ForecastMPC(MPCConfig(**self.config.mpc))
        self._fluid.reset(sim)
        self._periods: np.ndarray | None = None  # the current plan, one row per period
        self._step = 0
        if self._pool is None:
            self._pool = RolloutPool(self.config.workers)

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        v = plan_view(sim)
        if self._periods is None or self._step % self.config.replan_periods == 0 \
                or self._step_in_plan >= len(self._periods):
            t0 = time.perf_counter()
            self._replan(sim, v)
            self.solve_times.append(time.perf_counter() - t0)
        release, margin = self._periods[self._step_in_plan]
        self._step += 1
        self._step_in_plan += 1
        return release_and_ready(v, float(release), float(margin))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # ------------------------------------------------------------------ planning
    def futures(self, sim: ScenarioSim, v: PlanView) -> list[ScenarioSim]:
        """The sampled futures of this re-plan (the realised one never among them)."""
        cfg = self.config
        root = blank_future(sim)
        fc = Forecasts(v.price_fc, v.carbon_fc, v.solar_fc_kw,
                       published_price_ticks(sim, len(v.price_fc)))
        length = cfg.horizon * sim.cfg.decision_ticks
        return [sample_future(root, fc, length, (cfg.seed, sim.seed, sim.t, k))
                for k in range(cfg.samples)]

    def warm_starts(self, sim: ScenarioSim, v: PlanView) -> list[np.ndarray]:
        cfg = self.config
        out = []
        if self._periods is not None:  # the last plan, shifted to now
            rest = self._periods[self._step_in_plan:]
            if len(rest):
                pad = np.repeat(rest[-1:], cfg.horizon, axis=0)
                per = np.concatenate([rest, pad])[:cfg.horizon]
                out.append(per[::cfg.block_periods][:cfg.blocks])
        fluid = menu_point(v, *self._fluid.decide_view(v))
        out.append(np.repeat(fluid[None, :], cfg.blocks, axis=0))
        return out

    def _replan(self, sim: ScenarioSim, v: PlanView) -> None:
        cfg = self.config
        assert self._pool is not None
        self._pool.load(self.futures(sim, v), cfg.block_periods, self._scoring)
        rng = np.random.default_rng([cfg.seed, sim.seed, sim.t, 0xCE])
        res = cem(self._pool.score, self.warm_starts(sim, v), cfg.blocks, cfg.iterations,
                  cfg.population, cfg.elites, cfg.init_std, rng)
        self.plans.append((sim.t, res.plan, res.cost))
        self._periods = snap(np.repeat(res.plan, cfg.block_periods, axis=0)[:cfg.horizon])
        self._step_in_plan = 0
