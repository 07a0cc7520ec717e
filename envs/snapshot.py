"""ClusterSnapshot: an observed cluster state in simulator units, loadable into a ClusterSim.

The decision service receives the live cluster's state (servers, pending jobs) and
must build the observation and mask exactly as the env does. It does so by
loading a snapshot into the env's own simulator (``ClusterSim.load_snapshot``)
and calling the env's observation path; nothing is re-implemented.
``ClusterSim.snapshot()`` goes the other way (a running simulation's state as a
snapshot), which tests and clients use to drive the service from the simulator.
This module imports nothing from the simulator: ``envs.sim`` builds on it.

Units are the simulator's: CPU and memory in largest-machine units, times in ticks.
Job ``deadline`` counts ticks from now; ``age`` ticks since the job arrived.
Every tick count is at most ``MAX_TICKS`` and every job count at most ``MAX_JOBS``, so
sums such as ``tick + deadline`` stay far inside int64 (``check`` enforces both).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POWER_STATES = ("active", "asleep", "waking")  # index = the simulator's state code
MAX_TICKS = 10**9  # any tick count: ~31 years of one-second ticks
MAX_JOBS = 10**6  # jobs running on one server


@dataclass
class ClusterSnapshot:
    """Per-server arrays (length N) and per-pending-job arrays, in queue order."""

    tick: int
    power_state: np.ndarray  # int8, index into POWER_STATES
    wake_left: np.ndarray  # ticks until a waking server is active
    used_cpu: np.ndarray
    used_mem: np.ndarray
    n_running: np.ndarray
    job_cpu: np.ndarray
    job_mem: np.ndarray
    job_duration: np.ndarray  # int64 ticks
    job_deadline: np.ndarray  # int64 ticks from now
    job_age: np.ndarray  # int64 ticks since arrival
    arrival_rate: float = 0.0  # jobs per tick (the observation's smoothed estimate)
    violation_rate: float = 0.0  # SLA violations per tick (smoothed)
    priority_level: int = 0
    clock_offset: int = 0  # tick of the simulated day at tick 0 (time-of-day features)

    def check(self, n_servers: int) -> None:
        """Raises ValueError naming the field when the arrays do not fit ``n_servers``."""
        for name in ("power_state", "wake_left", "used_cpu", "used_mem", "n_running"):
            if len(getattr(self, name)) != n_servers:
                raise ValueError(f"snapshot.{name}: {len(getattr(self, name))} servers, "
                                 f"the fleet has {n_servers}")
        n_jobs = len(self.job_age)
        for name in ("job_cpu", "job_mem", "job_duration", "job_deadline"):
            if len(getattr(self, name)) != n_jobs:
                raise ValueError(f"snapshot.{name}: {len(getattr(self, name))} jobs, "
                                 f"job_age has {n_jobs}")
        if np.any((self.power_state < 0) | (self.power_state >= len(POWER_STATES))):
            raise ValueError(f"snapshot.power_state: codes must be in [0, {len(POWER_STATES)})")
        bounded = {"tick": (self.tick, 0), "clock_offset": (self.clock_offset, -MAX_TICKS),
                   "wake_left": (self.wake_left, 0), "job_duration": (self.job_duration, 0),
                   "job_deadline": (self.job_deadline, -MAX_TICKS), "job_age": (self.job_age, 0)}
        for name, (value, low) in bounded.items():
            _check_range(name, value, low, MAX_TICKS)
        _check_range("n_running", self.n_running, 0, MAX_JOBS)


def _check_range(name: str, value: int | np.ndarray, low: int, high: int) -> None:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"snapshot.{name}: integers expected, got {arr.dtype}")
    if arr.size and (int(arr.min()) < low or int(arr.max()) > high):
        raise ValueError(f"snapshot.{name}: values must be in [{low}, {high}]")

