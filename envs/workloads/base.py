"""The job table every workload produces, and the deadline rule shared by all of them.

A workload turns an episode seed into a :class:`JobTable`: all jobs of the
episode, sorted by arrival tick, generated up front with vectorized numpy so
that the simulator's hot loop only walks a pointer through it. Demands are in
units of the *largest* machine of the fleet (1.0 = a whole largest server),
durations and deadlines in ticks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from pydantic import Field, model_validator

from envs.sim_config import StrictConfig


@dataclass(frozen=True)
class JobTable:
    """All jobs of one episode, column-wise.

    ``deadline`` is the allowance in ticks counted from arrival: a job that
    arrives at tick ``a`` must finish by tick ``a + deadline``. It always
    exceeds ``duration`` (every job has slack).
    """

    arrival: np.ndarray  # int64, sorted ascending
    cpu: np.ndarray  # float64 in (0, 1]
    mem: np.ndarray  # float64 in (0, 1]
    duration: np.ndarray  # int64 >= 1
    deadline: np.ndarray  # int64 > duration
    clock_offset: int = 0  # tick of the simulated day at which the episode starts

    def __post_init__(self) -> None:
        n = len(self.arrival)
        for name in ("cpu", "mem", "duration", "deadline"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"JobTable.{name}: length {len(getattr(self, name))} != {n}")
        if n and np.any(np.diff(self.arrival) < 0):
            raise ValueError("JobTable.arrival: must be sorted ascending")
        if n and np.any(self.deadline <= self.duration):
            raise ValueError("JobTable.deadline: every deadline must exceed the duration")

    def __len__(self) -> int:
        return len(self.arrival)

    @staticmethod
    def empty() -> JobTable:
        z = np.zeros(0)
        zi = np.zeros(0, dtype=np.int64)
        return JobTable(zi, z, z, zi, zi)


class DeadlineConfig(StrictConfig):
    """SLA allowance: deadline = duration + max(min_slack, ceil(U(lo, hi) * duration))."""

    slack_low: float = Field(default=0.5, ge=0, le=100, description="x duration")
    slack_high: float = Field(default=2.0, ge=0, le=100, description="x duration")
    min_slack: int = Field(default=5, ge=1, le=1_000_000, description="ticks")

    @model_validator(mode="after")
    def _ordered(self) -> DeadlineConfig:
        if self.slack_high < self.slack_low:
            raise ValueError(
                f"slack_high ({self.slack_high}) must be >= slack_low ({self.slack_low})")
        return self


def assign_deadlines(duration: np.ndarray, rng: np.random.Generator,
                     cfg: DeadlineConfig) -> np.ndarray:
    """Deadline allowances (ticks from arrival) that always leave at least ``min_slack``."""
    factor = rng.uniform(cfg.slack_low, cfg.slack_high, size=len(duration))
    slack = np.maximum(cfg.min_slack, np.ceil(factor * duration)).astype(np.int64)
    return duration.astype(np.int64) + slack


@dataclass(frozen=True)
class FleetCapacity:
    """What a workload may need to know about the fleet to scale its offered load."""

    total_cpu: float  # sum of server CPU capacities, in largest-machine units
    n_servers: int


class Workload(Protocol):
    """Anything that turns a seeded generator into an episode's jobs."""

    name: str

    def generate(self, horizon: int, rng: np.random.Generator,
                 fleet: FleetCapacity) -> JobTable:
        """Jobs arriving in ticks ``[0, horizon)``, sorted by arrival."""
        ...

    def stationary_sample(self, n: int, rng: np.random.Generator,
                          fleet: FleetCapacity) -> JobTable:
        """``n`` jobs drawn from the workload's job mix (used to warm-start an episode)."""
        ...

    def offered_rate(self, fleet: FleetCapacity) -> float:
        """Mean arrivals per tick (used to size the warm start)."""
        ...

    def mean_duration(self, fleet: FleetCapacity) -> float:
        """Mean job duration in ticks (used to size the warm start)."""
        ...
