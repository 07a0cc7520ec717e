"""Synthetic workloads: Poisson arrivals and a Google-trace-v2-like mix.

Both scale their mean job duration from a target offered load, so that the
same config loads a 15-server and a 200-server fleet equally: with arrival
rate ``r`` jobs/tick and mean CPU demand ``c`` (largest-machine units), the
mean duration is ``load * fleet_cpu / (r * c)`` (Little's law). Set
``load=None`` to use ``duration_mean`` as given instead.

``google_v2_like`` follows the published statistics of the Google cluster
trace v2 (Reiss et al., "Heterogeneity and dynamicity of clouds at scale",
SoCC 2012): requests are small fractions of the largest machine (median CPU
request ~0.02-0.03, memory a little below CPU) spread over orders of
magnitude; task durations are heavy-tailed (most run minutes, a few run for
the whole trace); submissions follow a daily cycle with bursts of many tasks
submitted together. We model those as lognormal demands (median 0.025,
sigma 1.0), lognormal durations with sigma 1.5, a sinusoidal diurnal rate
(amplitude 0.4) and a two-state Markov burst process (x3 rate).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from envs.sim_config import StrictConfig
from envs.snapshot import MAX_TICKS
from envs.workloads.base import DeadlineConfig, FleetCapacity, JobTable, assign_deadlines


class _WorkloadBase(StrictConfig):

    rate: float = Field(default=0.8, ge=1e-6, le=100_000, description="mean arrivals per tick")
    load: float | None = Field(default=0.45, gt=0, le=2.0,
                               description="target offered CPU load of the fleet")
    duration_mean: float = Field(default=30.0, ge=1, le=MAX_TICKS,
                                 description="ticks, used when load is None")
    max_duration: int = Field(default=5000, ge=1, le=MAX_TICKS, description="duration clip, ticks")
    deadline: DeadlineConfig = Field(default_factory=DeadlineConfig)


class PoissonConfig(_WorkloadBase):
    """Homogeneous Poisson arrivals, uniform CPU demand, correlated memory, lognormal durations."""

    kind: Literal["poisson"] = "poisson"
    cpu_low: float = Field(default=0.05, ge=0.001, le=1,
                           description="share of the largest server's cores")
    cpu_high: float = Field(default=0.45, ge=0.001, le=1)
    mem_ratio_low: float = Field(default=0.5, ge=0.001, le=1000,
                                 description="memory share / CPU share")
    mem_ratio_high: float = Field(default=1.5, ge=0.001, le=1000)
    duration_sigma: float = Field(default=0.6, ge=0, le=4,
                                  description="lognormal sigma of durations")

    @model_validator(mode="after")
    def _ordered(self) -> PoissonConfig:
        if self.cpu_high < self.cpu_low:
            raise ValueError(f"cpu_high ({self.cpu_high}) must be >= cpu_low ({self.cpu_low})")
        if self.mem_ratio_high < self.mem_ratio_low:
            raise ValueError("mem_ratio_high must be >= mem_ratio_low")
        return self


class GoogleV2LikeConfig(_WorkloadBase):
    """Heavy-tailed durations, small fractional demands, diurnal cycle with bursts."""

    kind: Literal["google_v2_like"] = "google_v2_like"
    load: float | None = Field(default=0.35, gt=0, le=2.0)
    cpu_median: float = Field(default=0.025, ge=0.001, le=1)
    cpu_sigma: float = Field(default=1.0, ge=0, le=4)
    mem_to_cpu_median: float = Field(default=0.8, ge=0.001, le=1000)
    mem_to_cpu_sigma: float = Field(default=0.6, ge=0, le=4)
    duration_sigma: float = Field(default=1.5, ge=0, le=4)
    diurnal_amplitude: float = Field(default=0.4, ge=0, lt=1)
    diurnal_period: int = Field(default=1440, ge=1, le=1_000_000, description="ticks per day")
    burst_factor: float = Field(default=3.0, ge=1, le=100)
    burst_enter_prob: float = Field(default=0.01, ge=0, le=1)
    burst_mean_length: float = Field(default=20.0, ge=1, le=1_000_000)


def _mean_duration(cfg: _WorkloadBase, mean_cpu: float, fleet: FleetCapacity) -> float:
    if cfg.load is None:
        return cfg.duration_mean
    return max(1.0, cfg.load * fleet.total_cpu / (cfg.rate * mean_cpu))


def _lognormal_durations(n: int, mean: float, sigma: float, clip: int,
                         rng: np.random.Generator) -> np.ndarray:
    mu = np.log(mean) - 0.5 * sigma * sigma  # so that E[duration] = mean before rounding
    d = np.ceil(rng.lognormal(mu, sigma, size=n))
    return np.clip(d, 1, clip).astype(np.int64)


def _arrival_ticks(rate_per_tick: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    counts = rng.poisson(rate_per_tick)
    return np.repeat(np.arange(len(rate_per_tick), dtype=np.int64), counts)


class PoissonWorkload:
    """Poisson arrivals at ``cfg.rate``; see :class:`PoissonConfig`."""

    name = "poisson"

    def __init__(self, cfg: PoissonConfig) -> None:
        self.cfg = cfg

    def _mean_cpu(self) -> float:
        return 0.5 * (self.cfg.cpu_low + self.cfg.cpu_high)

    def offered_rate(self, fleet: FleetCapacity) -> float:
        return self.cfg.rate

    def mean_duration(self, fleet: FleetCapacity) -> float:
        return _mean_duration(self.cfg, self._mean_cpu(), fleet)

    def _jobs(self, arrival: np.ndarray, rng: np.random.Generator,
              fleet: FleetCapacity) -> JobTable:
        c = self.cfg
        n = len(arrival)
        cpu = rng.uniform(c.cpu_low, c.cpu_high, size=n)
        mem = np.clip(cpu * rng.uniform(c.mem_ratio_low, c.mem_ratio_high, size=n), 1e-3, 1.0)
        dur = _lognormal_durations(n, self.mean_duration(fleet), c.duration_sigma,
                                   c.max_duration, rng)
        return JobTable(arrival, cpu, mem, dur, assign_deadlines(dur, rng, c.deadline))

    def generate(self, horizon: int, rng: np.random.Generator,
                 fleet: FleetCapacity) -> JobTable:
        arrival = _arrival_ticks(np.full(horizon, self.cfg.rate), rng)
        return self._jobs(arrival, rng, fleet)

    def stationary_sample(self, n: int, rng: np.random.Generator,
                          fleet: FleetCapacity) -> JobTable:
        return self._jobs(np.zeros(n, dtype=np.int64), rng, fleet)


class GoogleV2LikeWorkload:
    """Google-trace-v2-like arrivals and job mix; see :class:`GoogleV2LikeConfig`."""

    name = "google_v2_like"

    def __init__(self, cfg: GoogleV2LikeConfig) -> None:
        self.cfg = cfg

    def _mean_cpu(self) -> float:
        c = self.cfg
        return float(min(1.0, c.cpu_median * np.exp(0.5 * c.cpu_sigma**2)))

    def offered_rate(self, fleet: FleetCapacity) -> float:
        return self.cfg.rate

    def mean_duration(self, fleet: FleetCapacity) -> float:
        return _mean_duration(self.cfg, self._mean_cpu(), fleet)

    def _burst_multiplier(self, horizon: int, rng: np.random.Generator) -> np.ndarray:
        c = self.cfg
        mult = np.ones(horizon)
        exit_prob = 1.0 / c.burst_mean_length
        u = rng.random(horizon)
        bursting = False
        for t in range(horizon):
            bursting = (u[t] >= exit_prob) if bursting else (u[t] < c.burst_enter_prob)
            if bursting:
                mult[t] = c.burst_factor
        return mult

    def _rate_profile(self, horizon: int, clock_offset: int,
                      rng: np.random.Generator) -> np.ndarray:
        c = self.cfg
        t = np.arange(horizon) + clock_offset
        diurnal = 1.0 + c.diurnal_amplitude * np.sin(2.0 * np.pi * t / c.diurnal_period)
        raw = diurnal * self._burst_multiplier(horizon, rng)
        # Normalize by the process's long-run mean so `rate` is the mean arrival rate.
        p_burst = c.burst_enter_prob / (c.burst_enter_prob + 1.0 / c.burst_mean_length)
        long_run_mean = 1.0 + p_burst * (c.burst_factor - 1.0)
        return c.rate * raw / long_run_mean

    def _jobs(self, arrival: np.ndarray, rng: np.random.Generator, fleet: FleetCapacity,
              clock_offset: int = 0) -> JobTable:
        c = self.cfg
        n = len(arrival)
        cpu = np.clip(rng.lognormal(np.log(c.cpu_median), c.cpu_sigma, size=n), 1e-3, 1.0)
        ratio = rng.lognormal(np.log(c.mem_to_cpu_median), c.mem_to_cpu_sigma, size=n)
        mem = np.clip(cpu * ratio, 1e-3, 1.0)
        dur = _lognormal_durations(n, self.mean_duration(fleet), c.duration_sigma,
                                   c.max_duration, rng)
        return JobTable(arrival, cpu, mem, dur, assign_deadlines(dur, rng, c.deadline),
                        clock_offset=clock_offset)

    def generate(self, horizon: int, rng: np.random.Generator,
                 fleet: FleetCapacity) -> JobTable:
        clock_offset = int(rng.integers(self.cfg.diurnal_period))
        arrival = _arrival_ticks(self._rate_profile(horizon, clock_offset, rng), rng)
        return self._jobs(arrival, rng, fleet, clock_offset)

    def stationary_sample(self, n: int, rng: np.random.Generator,
                          fleet: FleetCapacity) -> JobTable:
        return self._jobs(np.zeros(n, dtype=np.int64), rng, fleet)
