"""Typed configuration of the cluster simulator: fleet tiers, physics, reward, queue.

Every model has defaults that run; validation errors name the offending field
(pydantic does that for us, and the validators below add the physics rules,
e.g. ``P_max >= P_idle`` for every tier). :class:`StrictConfig` is the shared base of
all env, sim and workload configs: unknown fields and non-finite floats are errors.

Every number has a physically meaningful range (the ``Field`` bounds below; the table
is ``docs/reference/input-ranges.md``). The ranges keep every accumulated quantity
(returns, energy) finite, and :class:`WorkLimits` refuses, before anything is
allocated, an episode that would hold more ticks, jobs or bytes than configured.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from envs.snapshot import MAX_TICKS

MAX_WEIGHT = 1e6  # any reward weight or penalty: a step's cost stays far inside float64
MAX_SERVER_W = 100_000.0  # one server's power draw (a whole rack is ~10-40 kW)


class StrictConfig(BaseModel):
    """Base for the env's config models: unknown fields are errors, not silently dropped, and
    every float must be finite (inf/nan are rejected with the field's name)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_Strict = StrictConfig


class TierConfig(_Strict):
    """One hardware tier: capacity, power curve P(u) = P_idle + (P_max - P_idle) * u**alpha."""

    name: str = Field(min_length=1, max_length=64)
    cpu_cores: float = Field(ge=0.01, le=100_000, description="cores of one server")
    mem_gib: float = Field(ge=0.01, le=1_000_000, description="memory GiB of one server")
    p_idle_w: float = Field(ge=0, le=MAX_SERVER_W, description="watts when idle")
    p_max_w: float = Field(gt=0, le=MAX_SERVER_W, description="watts at full load")
    power_exponent: float = Field(default=1.4, ge=0.1, le=10.0,
                                  description="alpha of u**alpha: 1 linear, >1 convex")
    share: float = Field(default=1.0, ge=1e-6, le=1e6, description="relative share of the fleet")

    @model_validator(mode="after")
    def _power_curve_is_monotone(self) -> TierConfig:
        if self.p_max_w < self.p_idle_w:
            raise ValueError(
                f"tier {self.name!r}: p_max_w ({self.p_max_w}) must be >= "
                f"p_idle_w ({self.p_idle_w})"
            )
        return self


def default_tiers() -> list[TierConfig]:
    """Three tiers loosely modelled on small/standard/large cloud hosts (SPECpower-like ratios)."""
    return [
        TierConfig(name="efficient", cpu_cores=16, mem_gib=64, p_idle_w=60, p_max_w=180,
                   power_exponent=1.3),
        TierConfig(name="standard", cpu_cores=32, mem_gib=128, p_idle_w=100, p_max_w=300,
                   power_exponent=1.4),
        TierConfig(name="performance", cpu_cores=64, mem_gib=256, p_idle_w=180, p_max_w=520,
                   power_exponent=1.6),
    ]


class FleetConfig(_Strict):
    """The fleet: how many servers, which tiers, and the fixed seed that lays them out."""

    n_servers: int = Field(default=15, ge=1, le=4096)
    tiers: list[TierConfig] = Field(default_factory=default_tiers, min_length=1, max_length=32)
    fleet_seed: int = Field(default=0, ge=0, le=2**63 - 1)
    initially_asleep: float = Field(default=0.0, ge=0.0, le=1.0,
                                    description="fraction of servers asleep at reset")

    @model_validator(mode="after")
    def _unique_tier_names(self) -> FleetConfig:
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tiers: duplicate tier names {names}")
        return self


class WorkLimits(_Strict):
    """Work-size guards: a config whose episode would create more than these is refused
    up front, naming the field that drives it (``envs.workloads.work_size``). Jobs count
    the episode's expected arrivals plus the warm-start pool; bytes are estimated from
    jobs and ticks. Raise them for deliberately large runs."""

    max_episode_ticks: int = Field(default=1_000_000, ge=1, le=MAX_TICKS,
                                   description="ticks of one episode (episode_length)")
    max_episode_jobs: int = Field(default=200_000, ge=1, le=100_000_000,
                                  description="expected jobs one episode creates")
    max_episode_bytes: int = Field(default=2**30, ge=2**20, le=2**40,
                                   description="estimated memory of one episode's job tables")


class SimConfig(_Strict):
    """Physics, queue and reward of the simulator. One step = one tick of ``tick_seconds``."""

    fleet: FleetConfig = Field(default_factory=FleetConfig)
    episode_length: int = Field(default=1000, ge=1, le=MAX_TICKS,
                                description="ticks; at most limits.max_episode_ticks")
    tick_seconds: float = Field(default=60.0, ge=0.001, le=86_400.0,
                                description="seconds of one tick (1 ms to 1 day)")
    queue_window: int = Field(default=8, ge=1, le=64,
                              description="K: pending jobs visible to the policy")
    queue_capacity: int = Field(default=64, ge=1, le=1_000_000,
                                description="pending jobs held; arrivals beyond it are dropped")
    standby_fraction: float = Field(default=0.05, ge=0.0, le=1.0,
                                    description="asleep power as a fraction of P_idle")
    wake_delay: int = Field(default=3, ge=0, le=1_000_000,
                            description="ticks from wake command to active")
    alpha: float = Field(default=5.0, ge=0, le=MAX_WEIGHT,
                         description="weight of normalized energy")
    beta: float = Field(default=60.0, ge=0, le=MAX_WEIGHT, description="weight per SLA violation")
    toggle_penalty: float = Field(default=0.2, ge=0, le=MAX_WEIGHT,
                                  description="cost per power toggle")
    invalid_action_penalty: float = Field(default=1.0, ge=0, le=MAX_WEIGHT)
    priority_levels: int = Field(default=4, ge=1, le=16,
                                 description="queue-order levels of the branching interface")
    warm_start: bool = Field(default=True,
                             description="start episodes with jobs already running (steady state)")
    diurnal_period: int = Field(default=1440, ge=1, le=1_000_000,
                                description="ticks per simulated day (the observation keeps "
                                            "a sin/cos table of one day)")
    limits: WorkLimits = Field(default_factory=WorkLimits,
                               description="work-size guards of one episode")

    @model_validator(mode="after")
    def _window_fits_queue(self) -> SimConfig:
        if self.queue_window > self.queue_capacity:
            raise ValueError(
                f"queue_window ({self.queue_window}) must be <= "
                f"queue_capacity ({self.queue_capacity})"
            )
        if self.episode_length > self.limits.max_episode_ticks:
            raise ValueError(
                f"episode_length ({self.episode_length}) must be <= "
                f"limits.max_episode_ticks ({self.limits.max_episode_ticks}); raise the "
                f"limit for a longer episode"
            )
        return self
