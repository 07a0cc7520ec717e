"""Controllers of a scenario and the loop that runs one through an episode.

A controller is asked every ``decision_ticks`` ticks for the simulator's two standing
decisions (``release_util``, ``ready_cores``; see :mod:`envs.scenario.sim`). Online
controllers read a :class:`PlanView`: the present state plus *forecasts* of the signals
and of the load, never the future itself. The clairvoyant oracle is the one controller
that reads the simulator's realised episode, and says so (``clairvoyant = True``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from envs.scenario.sim import ACTIVE, BOOTING, RESUMING, SUSPENDED, ScenarioSim
from envs.signals.forecast import forecast


@dataclass(frozen=True)
class PlanView:
    """What an online controller knows at tick ``t`` (forecasts cover ticks t+1..t+H)."""

    t: int
    ticks_left: int
    tick_seconds: float
    decision_ticks: int
    price_now: float
    carbon_now: float
    solar_now_kw: float
    price_fc: np.ndarray
    carbon_fc: np.ndarray
    solar_fc_kw: np.ndarray
    load_fc: np.ndarray  # (2, H) forecast busy cores per class
    running: np.ndarray  # (2, H) cores of running jobs still busy per class
    queued: tuple[float, float]  # cores waiting in the run queue per class
    pool_cores: np.ndarray
    pool_duration: np.ndarray
    pool_latest: np.ndarray  # absolute latest start ticks
    fleet_cores: float
    ready_cores: float  # active + suspended + resuming
    active_cores: float
    coming_cores: float  # resuming + booting
    spare_cores: float
    boot_ticks: int
    resume_ticks: int


def plan_view(sim: ScenarioSim) -> PlanView:
    """The online view of ``sim`` now."""
    cfg, t = sim.cfg, sim.t
    h = sim.horizon_ticks
    sig = sim.signals
    if cfg.signals.market is not None:  # a real site: published prices, learned carbon
        from envs.signals.market import market_forecast

        price, carbon, solar = market_forecast(sig, t, h, cfg.signals, sim.seed)
    else:
        price, carbon, solar = forecast(sig, t, h, cfg.signals.forecast_error, sim.seed)
    cores, s = sim.cores, sim.state
    pc, pd, pl = sim.pool_work()
    return PlanView(
        t=t, ticks_left=sim.n_ticks - t, tick_seconds=cfg.tick_seconds,
        decision_ticks=cfg.decision_ticks,
        price_now=float(sig.price_usd_per_mwh[t]), carbon_now=float(sig.carbon_g_per_kwh[t]),
        solar_now_kw=float(sig.solar_kw[t]), price_fc=price, carbon_fc=carbon,
        solar_fc_kw=solar, load_fc=sim.load_forecast(h), running=sim.running_profile(h),
        queued=sim.queued_cores_by_class(), pool_cores=pc, pool_duration=pd, pool_latest=pl,
        fleet_cores=sim.fleet_cores,
        ready_cores=float(cores[(s == ACTIVE) | (s == SUSPENDED) | (s == RESUMING)].sum()),
        active_cores=float(cores[s == ACTIVE].sum()),
        coming_cores=float(cores[(s == RESUMING) | (s == BOOTING)].sum()),
        spare_cores=cfg.executor.spare_cores_frac * sim.fleet_cores,
        boot_ticks=cfg.boot_ticks, resume_ticks=cfg.resume_ticks)


def release_and_ready(v: PlanView, release_util: float, margin: float) -> tuple[float, float]:
    """``release_util`` as given; ready cores for the forecast latency-critical peak before a
    boot could finish, times ``1 + margin``, plus committed batch work and the spare (the
    heuristic's wake-ahead and the env's ready levels)."""
    window = max(1, v.boot_ticks + v.decision_ticks)
    lc_now = float(v.running[0, 0] + v.queued[0]) if v.running.shape[1] else v.queued[0]
    lc_peak = max(float(v.load_fc[0, :window].max(initial=0.0)), lc_now)
    batch_now = float(v.running[1, 0] + v.queued[1]) if v.running.shape[1] else v.queued[1]
    ready = lc_peak * (1.0 + margin) + batch_now + v.spare_cores
    return release_util, min(ready, v.fleet_cores)


class Controller(Protocol):
    """Anything that sets the two standing decisions of a scenario."""

    name: str
    clairvoyant: bool

    def reset(self, sim: ScenarioSim) -> None: ...

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        """(release_util, ready_cores) for the next ``decision_ticks`` ticks."""
        ...


@dataclass
class EpisodeResult:
    seed: int
    controller: str
    metrics: dict[str, float]
    decide_s: float  # mean seconds per decision
    decisions: int


def run_episode(sim: ScenarioSim, controller: Controller, seed: int) -> EpisodeResult:
    """Reset ``sim`` to ``seed`` and run ``controller`` to the episode's end."""
    sim.reset(seed)
    controller.reset(sim)
    d = sim.cfg.decision_ticks
    spent, decisions = 0.0, 0
    while not sim.done:
        if sim.t % d == 0:
            t0 = time.perf_counter()
            release, ready = controller.decide(sim)
            spent += time.perf_counter() - t0
            decisions += 1
            sim.set_controls(release, ready)
        sim.tick()
    return EpisodeResult(seed, controller.name, sim.stats.summary(),
                         spent / max(decisions, 1), decisions)


class RunAtOnce:
    """The reference without any signal awareness: every job runs as soon as it can and
    every server stays ready (suspended at worst)."""

    name = "run_at_once"
    clairvoyant = False

    def reset(self, sim: ScenarioSim) -> None:
        pass

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        return 10.0, sim.fleet_cores
