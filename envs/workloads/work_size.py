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

With exogenous signals (``EnvConfig.signals``) each reset also builds the price, carbon and
solar series over the signal timebase: ``episode_length`` plus the forecast horizon
(``signals.horizon_hours`` in ticks of ``sim.tick_seconds``) plus one tick, about
``BYTES_PER_SIGNAL_TICK`` bytes a tick at the peak of the build. :func:`check_signal_work`
adds those bytes to the episode's and refuses the sum above ``sim.limits.max_episode_bytes``
naming both fields, before anything is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

from envs.fleet import Fleet
from envs.sim_config import SimConfig
from envs.workloads.base import FleetCapacity, Workload

BYTES_PER_JOB = 400  # job columns, feature rows, the simulator's scalar copies, generation
BYTES_PER_TICK = 64  # per-tick rate profiles of the generators
WARM_POOL_FACTOR = 3  # the warm start draws from a pool 3x its expected running jobs
# peak bytes per tick of building one episode's signals (series, forecasts, features):
# 107-139 measured with tracemalloc over 87,401 and 865,001 ticks, with and without solar
BYTES_PER_SIGNAL_TICK = 160

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


def signal_ticks(sim: SimConfig, horizon_ticks: int) -> int:
    """Ticks of the signal timebase: the episode, the forecast horizon and one more."""
    return int(sim.episode_length) + int(horizon_ticks) + 1


def check_signal_work(sim: SimConfig, horizon_hours: float, horizon_ticks: int,
                      work: EpisodeWork | None = None) -> int:
    """The signal timebase's ticks; WorkSizeError naming ``sim.tick_seconds`` and
    ``signals.horizon_hours`` when its bytes (with the episode's ``work``) pass
    ``sim.limits.max_episode_bytes``."""
    ticks = signal_ticks(sim, horizon_ticks)
    need = ticks * BYTES_PER_SIGNAL_TICK + (work.bytes if work is not None else 0.0)
    limit = sim.limits.max_episode_bytes
    if need > limit:
        raise WorkSizeError(
            "sim.tick_seconds", f"{sim.tick_seconds:g} s with signals.horizon_hours "
            f"{horizon_hours:g} makes a signal timebase of {ticks:,} ticks (episode_length "
            f"{sim.episode_length:,} + a {horizon_ticks:,}-tick forecast horizon + 1), "
            f"~{need:,.0f} bytes, above sim.limits.max_episode_bytes = {limit:,}: raise "
            "sim.tick_seconds or lower signals.horizon_hours")
    return ticks
