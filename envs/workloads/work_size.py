"""Work-size guard: what one episode of a config would create, refused up front above
``SimConfig.limits``.

An episode's jobs are generated whole at ``reset()``, and the warm start pre-loads a
steady-state set of running jobs drawn from a pool three times its expected size. A
config whose episode would hold hundreds of thousands of jobs (a very high rate, a
trace replayed 100x faster) or whose warm start would pre-load millions (a tiny CPU
demand, a huge mean duration) would allocate gigabytes or never return. From the
workload's own rate and mean duration, :func:`episode_work` estimates the expected
jobs (arrivals over ``episode_length`` plus the warm-start pool), ticks and bytes;
:func:`check_episode_work` raises :class:`WorkSizeError` naming the field that drives
the excess and the limit it passes. Expected values: the realised Poisson counts of one
seed scatter around them.
"""

from __future__ import annotations

from dataclasses import dataclass

from envs.fleet import Fleet
from envs.sim_config import SimConfig
from envs.workloads.base import FleetCapacity, Workload

BYTES_PER_JOB = 400  # job columns, feature rows, the simulator's scalar copies, generation
BYTES_PER_TICK = 64  # per-tick rate profiles of the generators
WARM_POOL_FACTOR = 3  # the warm start draws from a pool 3x its expected running jobs

# Which config field drives arrivals and the warm start, per workload name.
_FIELDS = {"poisson": ("workload.rate", "workload.load"),
           "google_v2_like": ("workload.rate", "workload.load"),
           "trace": ("workload.time_scale", "workload.time_scale")}


class WorkSizeError(ValueError):
    """An episode above ``sim.limits`` (or a value that would overflow); ``field`` names the
    config field to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class EpisodeWork:
    """Expected size of one episode."""

    ticks: int
    rate: float  # arrivals per tick
    arrivals: float  # expected arrivals over the episode
    warm_pool: float  # jobs drawn to warm-start it

    @property
    def jobs(self) -> float:
        return self.arrivals + self.warm_pool

    @property
    def bytes(self) -> float:
        return self.jobs * BYTES_PER_JOB + self.ticks * BYTES_PER_TICK


def fleet_capacity(sim: SimConfig) -> FleetCapacity:
    """The capacity a workload scales its load to (the simulator computes the same)."""
    fleet = Fleet.from_config(sim.fleet)
    return FleetCapacity(float(fleet.cpu_cap.sum()), fleet.n_servers)


def episode_work(sim: SimConfig, workload: Workload,
                 capacity: FleetCapacity | None = None) -> EpisodeWork:
    """Expected jobs, ticks and bytes of one episode of ``workload`` under ``sim``."""
    capacity = capacity or fleet_capacity(sim)
    rate = float(workload.offered_rate(capacity))
    warm = rate * float(workload.mean_duration(capacity)) if sim.warm_start else 0.0
    return EpisodeWork(sim.episode_length, rate, rate * sim.episode_length,
                       WARM_POOL_FACTOR * warm)


def check_episode_work(sim: SimConfig, workload: Workload,
                       capacity: FleetCapacity | None = None) -> EpisodeWork:
    """The episode's expected work; WorkSizeError when it passes ``sim.limits``."""
    work = episode_work(sim, workload, capacity)
    limits = sim.limits
    arrivals_field, warm_field = _FIELDS.get(workload.name, ("workload", "workload"))
    field = arrivals_field if work.arrivals >= work.warm_pool else warm_field
    what = (f"~{work.jobs:,.0f} jobs ({work.arrivals:,.0f} arrivals = {work.rate:.4g}/tick x "
            f"{work.ticks:,} ticks, + {work.warm_pool:,.0f} drawn for the warm start)")
    if work.jobs > limits.max_episode_jobs:
        raise WorkSizeError(field, f"an episode would create {what}, above "
                            f"sim.limits.max_episode_jobs = {limits.max_episode_jobs:,}")
    if work.bytes > limits.max_episode_bytes:
        raise WorkSizeError(field, f"an episode would need ~{work.bytes:,.0f} bytes for "
                            f"{what}, above sim.limits.max_episode_bytes = "
                            f"{limits.max_episode_bytes:,}")
    return work
