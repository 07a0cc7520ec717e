"""The jobs of a scenario episode: latency-critical and deferrable batch classes.

Each class arrives as a Poisson process whose rate follows the hour of the day, the
day of the week and random bursts (:class:`envs.scenario.config.JobClassConfig`); the
mean rate is set so that the class offers ``load_share * utilization`` of the fleet's
cores on average. All jobs of an episode are drawn up front with vectorized numpy, so
the same seed gives the same jobs, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.scenario.config import JobClassConfig, ScenarioConfig


@dataclass(frozen=True)
class ClassJobs:
    """All jobs of one episode (both classes), sorted by arrival tick."""

    arrival: np.ndarray  # int64 tick
    cls: np.ndarray  # int8 class id
    cores: np.ndarray  # float64
    duration: np.ndarray  # int64 ticks >= 1
    deadline: np.ndarray  # int64 absolute tick by which the job must finish

    def __len__(self) -> int:
        return len(self.arrival)

    @property
    def latest_start(self) -> np.ndarray:
        return self.deadline - self.duration


def rate_shape(cfg: JobClassConfig, hour_of_week: np.ndarray) -> np.ndarray:
    """Relative arrival rate (mean 1 over a week, bursts excluded) at each hour of week."""
    hour = np.mod(hour_of_week, 24.0)
    day = np.floor_divide(np.mod(hour_of_week, 168.0), 24.0)  # 0 = Monday
    shape = 1.0 + cfg.diurnal_amplitude * np.cos(2 * np.pi * (hour - cfg.peak_hour) / 24.0)
    weekend = (day >= 5).astype(float)
    shape = shape * (1.0 - cfg.weekend_dip * weekend)
    return shape / (1.0 - cfg.weekend_dip * 2.0 / 7.0)


def hours_of_week(cfg: ScenarioConfig, start_hour_of_week: float, n_ticks: int) -> np.ndarray:
    return start_hour_of_week + np.arange(n_ticks) / cfg.ticks_per_hour


def _largest_cores(cfg: ScenarioConfig) -> float:
    return max(t.cpu_cores for t in cfg.fleet.tiers)


def expected_load(cfg: ScenarioConfig, cls_cfg: JobClassConfig, fleet_cores: float,
                  hour_of_week: np.ndarray) -> np.ndarray:
    """Expected busy cores of a class at each tick (rate x size x duration), bursts excluded."""
    return cls_cfg.load_share * cfg.utilization * fleet_cores * rate_shape(cls_cfg, hour_of_week)


def generate_jobs(cfg: ScenarioConfig, fleet_cores: float, max_cores: float,
                  start_hour_of_week: float, n_ticks: int,
                  rng: np.random.Generator) -> ClassJobs:
    """Both classes' jobs arriving in ticks ``[0, n_ticks)``. ``max_jobs`` was checked when
    ``cfg`` was validated (:meth:`ScenarioConfig.check_jobs`, on the expected count); a
    config built without validation is checked here, before anything is drawn."""
    cfg.check_jobs(fleet_cores)
    parts = []
    how = hours_of_week(cfg, start_hour_of_week, n_ticks)
    for c, ccfg in enumerate(cfg.classes):
        if ccfg.load_share <= 0:
            continue
        dur_mean = max(1.0, ccfg.duration_min_mean * 60.0 / cfg.tick_seconds)
        per_job = ccfg.cores_mean * dur_mean
        base = ccfg.load_share * cfg.utilization * fleet_cores / per_job  # jobs per tick
        rate = base * rate_shape(ccfg, how)
        if ccfg.bursts_per_day > 0:
            n_b = rng.poisson(ccfg.bursts_per_day * n_ticks / (24 * cfg.ticks_per_hour))
            starts = rng.integers(0, n_ticks, size=n_b)
            length = max(1, cfg.minutes_to_ticks(ccfg.burst_minutes))
            boost = np.ones(n_ticks)
            for s in starts.tolist():
                boost[s:s + length] = ccfg.burst_factor
            rate = rate * boost
        counts = rng.poisson(rate)
        arrival = np.repeat(np.arange(n_ticks, dtype=np.int64), counts)
        n = len(arrival)
        cores = np.clip(rng.gamma(2.0, ccfg.cores_mean / 2.0, size=n), 0.25, max_cores)
        duration = np.minimum(rng.geometric(1.0 / dur_mean, size=n),
                              cfg.max_duration_ticks(c)).astype(np.int64)
        slack = max(1, cfg.minutes_to_ticks(ccfg.slack_min))
        deadline = arrival + duration + slack
        parts.append((arrival, np.full(n, c, dtype=np.int8), cores, duration, deadline))
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return ClassJobs(z, z.astype(np.int8), z.astype(float), z, z)
    cols = [np.concatenate(p) for p in zip(*parts, strict=True)]
    order = np.argsort(cols[0], kind="stable")
    return ClassJobs(*(c[order] for c in cols))
