"""What a planner may know of the future, and the futures it samples in its place.

At decision tick ``t`` the simulator holds the realised episode: every job's arrival and
every signal value. A plant-true planner must not read them, so :func:`blank_future`
copies the simulator with every job arriving at ``t`` or later removed and every signal
value after ``t`` set to NaN (a rollout that reads one turns its cost into NaN).
:func:`sample_future` then fills a copy with one plausible future:

* arrivals of ticks ``t .. t+L-1`` drawn from the scenario's own workload model
  (:func:`envs.scenario.jobs.generate_jobs`, the calendar shifted to ``t``) with a fresh
  seed per (planner seed, episode, ``t``, sample) - diurnal shape and random bursts
  included, the realised draws never;
* price, carbon and solar after ``t`` as the forecast made at ``t`` (what an online
  controller sees, :func:`envs.signals.forecast.forecast`) times ``max(0, 1 + error *
  B(lead))`` with a fresh Brownian path ``B`` in days per signal - the forecast error
  model's own law, so the samples scatter around the forecast as the truth does. On a real
  site (``signals.market``) the prices whose day-ahead auction has cleared are known: the
  first ``Forecasts.price_known`` price values are kept exact and the price's Brownian path
  starts after them (:func:`published_price_ticks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.scenario.jobs import ClassJobs, generate_jobs
from envs.scenario.sim import ScenarioSim
from envs.signals.forecast import forecast

_FUTURE_STREAM = 0x51A1


@dataclass(frozen=True)
class FutureSignals:
    """Per-tick price, carbon and solar a rollout reads (NaN where unknown)."""

    price_usd_per_mwh: np.ndarray
    carbon_g_per_kwh: np.ndarray
    solar_kw: np.ndarray


@dataclass(frozen=True)
class Forecasts:
    """The signal forecasts made at tick ``t`` for ticks ``t+1 .. t+len``."""

    price: np.ndarray
    carbon: np.ndarray
    solar: np.ndarray
    price_known: int = 0  # leading price values that are published (exact), not forecast


def published_price_ticks(sim: ScenarioSim, horizon: int) -> int:
    """How many of the ticks ``t+1 .. t+horizon`` have a published day-ahead price at
    ``sim.t`` (0 without a market: every price ahead is a forecast)."""
    market = sim.cfg.signals.market
    if market is None:
        return 0
    from envs.signals.market import market_forecaster

    f = market_forecaster(sim.signals, market, sim.horizon_ticks)
    return int(np.clip(f.price_cutoff_tick(sim.t) - (sim.t + 1), 0, horizon))


def forecasts_at(sim: ScenarioSim) -> Forecasts:
    """The forecasts an online controller sees at ``sim.t`` (over the signals' horizon)."""
    price, carbon, solar = forecast(sim.signals, sim.t, sim.horizon_ticks,
                                    sim.cfg.signals.forecast_error, sim.seed)
    return Forecasts(price, carbon, solar)


def _no_jobs() -> ClassJobs:
    z = np.zeros(0, dtype=np.int64)
    return ClassJobs(z, z.astype(np.int8), z.astype(float), z, z)


def blank_future(sim: ScenarioSim) -> ScenarioSim:
    """A copy of ``sim`` holding nothing of its future: no job arriving at ``t`` or later,
    NaN for every signal value after ``t`` (the past and the present are kept)."""
    t = sim.t
    arrays = []
    for name in ("price_usd_per_mwh", "carbon_g_per_kwh", "solar_kw"):
        a = np.array(getattr(sim.signals, name), dtype=np.float64)
        a[t + 1:] = np.nan
        arrays.append(a)
    return sim.with_future(_no_jobs(), FutureSignals(*arrays))


def _shift(jobs: ClassJobs, t: int) -> ClassJobs:
    return ClassJobs(jobs.arrival + t, jobs.cls, jobs.cores, jobs.duration, jobs.deadline + t)


def sample_future(root: ScenarioSim, fc: Forecasts, length: int, seed: tuple[int, ...]
                  ) -> ScenarioSim:
    """``root`` (a :func:`blank_future` copy) with one sampled future: arrivals for ticks
    ``t .. t+length-1`` and signals for ticks ``t+1 .. t+len(fc.price)``."""
    cfg, t = root.cfg, root.t
    rng = np.random.default_rng([*seed, _FUTURE_STREAM])
    n_arr = max(0, min(length, root.arrival_ticks - t))
    if n_arr:
        jobs = _shift(generate_jobs(cfg, root.fleet_cores, root.max_job_cores,
                                    root.start_hour_of_week + t / cfg.ticks_per_hour, n_arr,
                                    rng), t)
    else:
        jobs = _no_jobs()
    h = len(fc.price)
    err = cfg.signals.forecast_error
    lead_days = np.arange(1, h + 1) * cfg.tick_seconds / 86400.0
    steps = rng.standard_normal((3, h)) * np.sqrt(np.diff(lead_days, prepend=0.0))
    steps[0, :fc.price_known] = 0.0  # published prices are exact; the error starts after
    factor = np.maximum(1.0 + err * np.cumsum(steps, axis=1), 0.0)
    arrays = []
    for i, (name, f) in enumerate((("price_usd_per_mwh", fc.price),
                                   ("carbon_g_per_kwh", fc.carbon), ("solar_kw", fc.solar))):
        a = np.array(getattr(root.signals, name), dtype=np.float64)
        hi = min(t + 1 + h, len(a))
        a[t + 1:hi] = (f * factor[i])[:hi - t - 1]
        arrays.append(a)
    return root.with_future(jobs, FutureSignals(*arrays))


def true_future(sim: ScenarioSim) -> ScenarioSim:
    """A copy of ``sim`` with its realised future (what only a clairvoyant planner reads)."""
    return sim.clone()
