"""Per-episode metrics and their summary (mean with a 95% confidence interval)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

from envs.sim import EpisodeStats

METRICS = ("energy_kwh", "sla_violation_rate", "mean_slowdown", "p95_queue_wait",
           "mean_utilization", "toggles", "episode_reward")
METRIC_LABELS = {
    "energy_kwh": "energy kWh", "sla_violation_rate": "SLA viol. rate",
    "mean_slowdown": "slowdown", "p95_queue_wait": "p95 wait", "mean_utilization": "util.",
    "toggles": "toggles", "episode_reward": "reward",
}


@dataclass(frozen=True)
class EpisodeMetrics:
    """What one evaluation episode measured. Waits are in ticks."""

    policy: str
    seed: int
    energy_kwh: float
    sla_violation_rate: float
    mean_slowdown: float
    p95_queue_wait: float
    mean_utilization: float
    toggles: int
    episode_reward: float
    jobs_ended: int
    invalid_actions: int

    def as_dict(self) -> dict:
        return asdict(self)


def episode_metrics(policy: str, seed: int, st: EpisodeStats, reward: float,
                    invalid_actions: int) -> EpisodeMetrics:
    return EpisodeMetrics(
        policy=policy,
        seed=seed,
        energy_kwh=st.energy_j / 3.6e6,
        sla_violation_rate=st.violation_rate,
        mean_slowdown=st.slowdown_sum / st.finished if st.finished else 0.0,
        p95_queue_wait=float(np.percentile(st.waits, 95)) if st.waits else 0.0,
        mean_utilization=st.util_sum / st.ticks if st.ticks else 0.0,
        toggles=st.toggles,
        episode_reward=reward,
        jobs_ended=st.finished + st.dropped,
        invalid_actions=invalid_actions,
    )


@dataclass(frozen=True)
class Summary:
    mean: float
    ci95: float  # half-width
    n: int


def summarize(values: list[float] | np.ndarray) -> Summary:
    """Mean and the half-width of its two-sided 95% t interval."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return Summary(math.nan, math.nan, 0)
    if n == 1:
        return Summary(float(x[0]), 0.0, 1)
    half = float(sps.t.ppf(0.975, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return Summary(float(x.mean()), half, n)
