"""Typed configuration of a scenario: job classes, server power states, cost, signals.

A scenario is the cluster under the conditions an operator pays for: a time-varying
electricity price and grid carbon intensity (with forecasts), optional on-site solar,
latency-critical jobs beside deferrable batch jobs, servers that can be suspended or
switched off, and a cost in dollars. Every field has a default that runs and a
documented, physical range; unknown fields and non-finite numbers are errors that name
the field (pydantic, through :class:`envs.sim_config.StrictConfig`).

Units: cores, watts, ticks of ``tick_seconds``; money in US dollars.
"""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator, model_validator

from envs.signals import SignalConfig
from envs.sim_config import FleetConfig, StrictConfig

LATENCY_CRITICAL, BATCH = 0, 1
CLASS_NAMES = ("latency_critical", "batch")


class JobClassConfig(StrictConfig):
    """One job class: arrivals, size, duration and deadline slack.

    Arrivals are Poisson with a rate that follows the day: ``rate(t) = base * (1 +
    diurnal_amplitude * cos(2 pi (hour - peak_hour) / 24))``, times 1 - ``weekend_dip`` on
    Saturdays and Sundays, times ``burst_factor`` inside bursts (bursts start at
    ``bursts_per_day`` per day on average and last ``burst_minutes``)."""

    load_share: float = Field(default=0.5, ge=0.0, le=1.0,
                              description="share of the mean offered core-ticks")
    cores_mean: float = Field(default=4.0, gt=0, le=256, description="mean cores per job")
    duration_min_mean: float = Field(default=10.0, ge=1.0, le=24 * 60,
                                     description="mean run time, minutes (geometric)")
    slack_min: float = Field(default=5.0, ge=1.0, le=7 * 24 * 60,
                             description="deadline = arrival + duration + slack, minutes")
    diurnal_amplitude: float = Field(default=0.4, ge=0.0, le=1.0)
    peak_hour: float = Field(default=19.0, ge=0.0, lt=24.0)
    weekend_dip: float = Field(default=0.2, ge=0.0, lt=1.0)
    bursts_per_day: float = Field(default=0.0, ge=0.0, le=48.0)
    burst_minutes: float = Field(default=30.0, ge=1.0, le=24 * 60)
    burst_factor: float = Field(default=2.0, ge=1.0, le=20.0)


def _lc_default() -> JobClassConfig:
    return JobClassConfig(load_share=0.5, cores_mean=8.0, duration_min_mean=15.0, slack_min=6.0,
                          diurnal_amplitude=0.5, peak_hour=19.0, bursts_per_day=3.0,
                          burst_minutes=20.0, burst_factor=1.8)


def _batch_default() -> JobClassConfig:
    return JobClassConfig(load_share=0.5, cores_mean=16.0, duration_min_mean=120.0,
                          slack_min=12 * 60.0, diurnal_amplitude=0.3, peak_hour=11.0)


class PowerStatesConfig(StrictConfig):
    """Server power states beyond active: suspended (fast resume) and off (slow boot).

    Draws are fractions of the tier's idle power; resuming and booting servers draw
    ``P_idle`` for their whole latency, and a suspend or a shutdown costs a fixed energy
    (``*_seconds`` at ``P_idle``), so every transition is counted in the energy."""

    suspended_fraction: float = Field(default=0.08, ge=0.0, le=1.0,
                                      description="suspend-to-RAM draw / P_idle")
    off_fraction: float = Field(default=0.02, ge=0.0, le=1.0,
                                description="soft-off draw (BMC) / P_idle")
    resume_seconds: float = Field(default=30.0, ge=0.0, le=3600.0)
    boot_seconds: float = Field(default=300.0, ge=0.0, le=3 * 3600.0)
    suspend_seconds: float = Field(default=10.0, ge=0.0, le=3600.0,
                                   description="energy of entering suspend, as seconds at P_idle")
    shutdown_seconds: float = Field(default=60.0, ge=0.0, le=3600.0,
                                    description="energy of a shutdown, as seconds at P_idle")


class CostConfig(StrictConfig):
    """The episode's cost in dollars; the reward is its negative."""

    carbon_usd_per_tonne: float = Field(default=100.0, ge=0.0, le=10_000.0)
    sla_usd: tuple[float, float] = Field(default=(0.5, 2.0),
                                         description="penalty per violation: (latency_critical, "
                                                     "batch)")
    pue: float = Field(default=1.2, ge=1.0, le=3.0, description="facility power / IT power")
    demand_usd_per_kw_month: float = Field(
        default=0.0, ge=0.0, le=1000.0,
        description="a commercial tariff's demand charge: $ per kW of the episode's peak grid "
                    "draw (the highest demand_block_minutes average) per 30-day month, "
                    "prorated to the episode's days (0: off)")
    demand_block_minutes: float = Field(default=15.0, ge=1.0, le=240.0,
                                        description="the demand meter's averaging block")

    @model_validator(mode="after")
    def _penalties_in_range(self) -> CostConfig:
        for name, v in zip(CLASS_NAMES, self.sla_usd, strict=True):
            if not 0.0 <= v <= 10_000.0:
                raise ValueError(f"cost.sla_usd[{name}]: {v} outside [0, 10000] $")
        return self


class ExecutorConfig(StrictConfig):
    """The power-aware executor every controller shares: best-fit placement by efficiency,
    idle servers suspended, capacity woken for waiting work."""

    spare_cores_frac: float = Field(default=0.05, ge=0.0, le=1.0,
                                    description="free active cores kept, as a share of the "
                                                "fleet's cores")
    off_after_min: float = Field(default=60.0, ge=0.0, le=24 * 60,
                                 description="a server is switched off only after this long "
                                             "suspended (a shutdown and boot cost about an "
                                             "hour of suspended draw)")
    lc_reserve_cores: float = Field(default=0.0, ge=0.0, le=1024.0,
                                    description="room kept for large latency-critical jobs: "
                                                "batch work is not placed on the last active "
                                                "server of the largest tier with this many "
                                                "free cores (0: none)")
    force_margin_min: float = Field(default=30.0, ge=0.0, le=24 * 60,
                                    description="a held batch job is released this long before "
                                                "its latest start")


class ScenarioConfig(StrictConfig):
    """A whole scenario: fleet, length, job classes, power states, cost and signals."""

    name: str = "custom"
    description: str = ""
    fleet: FleetConfig = Field(default_factory=lambda: FleetConfig(n_servers=50))
    tick_seconds: float = Field(default=180.0, ge=10.0, le=3600.0)
    days: float = Field(default=2.0, ge=0.25, le=14.0, description="episode length, days")
    decision_minutes: float = Field(default=15.0, ge=1.0, le=240.0,
                                    description="a controller decides every this many minutes")
    utilization: float = Field(default=0.45, gt=0.0, le=1.5,
                               description="mean offered cores / fleet cores")
    classes: tuple[JobClassConfig, JobClassConfig] = Field(
        default_factory=lambda: (_lc_default(), _batch_default()))
    power: PowerStatesConfig = Field(default_factory=PowerStatesConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    signals: SignalConfig = Field(default_factory=SignalConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    load_forecast_error: float = Field(default=0.1, ge=0.0, le=2.0,
                                       description="relative sd of the load forecast at 24 h")
    queue_capacity: int = Field(default=20_000, ge=1, le=1_000_000)
    max_jobs: int = Field(default=400_000, ge=1, le=10_000_000,
                          description="scenarios whose episodes are expected to create more "
                                      "jobs are refused when validated (see expected_jobs)")

    @model_validator(mode="after")
    def _consistent(self) -> ScenarioConfig:
        shares = sum(c.load_share for c in self.classes)
        if abs(shares - 1.0) > 1e-6:
            raise ValueError(f"classes: load_share must sum to 1, got {shares:g}")
        if self.decision_minutes * 60.0 < self.tick_seconds:
            raise ValueError(f"decision_minutes ({self.decision_minutes}) must cover at least "
                             f"one tick ({self.tick_seconds} s)")
        if self.n_ticks > 200_000:
            raise ValueError(f"days: {self.days} days of {self.tick_seconds} s ticks is "
                             f"{self.n_ticks} ticks (> 200000)")
        self.check_jobs()
        from envs.signals.real import check_source  # a signal file reads and covers the episode

        check_source(self.signals, self.signal_ticks, self.tick_seconds)
        return self

    def expected_jobs(self, fleet_cores: float | None = None) -> tuple[float, ...]:
        """Per class, the jobs an episode is expected to create at most: the class's arrival
        rate at its peak hour of the week (``1 + diurnal_amplitude`` over the weekly mean,
        weekdays), times its expected burst boost (``1 + (burst_factor - 1) x`` the expected
        share of ticks inside a burst, at most 1), over every arrival tick (``days``). The
        rate is that of :func:`envs.scenario.jobs.generate_jobs`: ``load_share x
        utilization x`` fleet cores / (``cores_mean x`` mean duration in ticks). A seed's
        realised count scatters below and around it (Poisson arrivals, random bursts).
        ``fleet_cores``: the fleet's cores when known (else built from ``fleet``)."""
        if fleet_cores is None:
            from envs.fleet import Fleet

            largest = max(t.cpu_cores for t in self.fleet.tiers)
            fleet_cores = float((Fleet.from_config(self.fleet).cpu_cap * largest).sum())
        ticks_per_day = 24 * self.ticks_per_hour
        out = []
        for c in self.classes:
            if c.load_share <= 0:
                out.append(0.0)
                continue
            dur_mean = max(1.0, c.duration_min_mean * 60.0 / self.tick_seconds)
            base = c.load_share * self.utilization * fleet_cores / (c.cores_mean * dur_mean)
            peak = (1.0 + c.diurnal_amplitude) / (1.0 - c.weekend_dip * 2.0 / 7.0)
            covered = min(1.0, c.bursts_per_day * max(1, self.minutes_to_ticks(c.burst_minutes))
                          / ticks_per_day)
            boost = 1.0 + (c.burst_factor - 1.0) * covered
            out.append(base * peak * boost * self.n_ticks)
        return tuple(out)

    def check_jobs(self, fleet_cores: float | None = None) -> None:
        """ValueError naming ``max_jobs`` when :meth:`expected_jobs` sums above it."""
        per_class = self.expected_jobs(fleet_cores)
        total = sum(per_class)
        if total > self.max_jobs:
            parts = " + ".join(f"{name} ~{n:,.0f}" for name, n in zip(CLASS_NAMES, per_class,
                                                                      strict=True))
            raise ValueError(
                f"max_jobs: scenario {self.name!r} is expected to create up to ~{total:,.0f} "
                f"jobs per episode ({parts}, at each class's peak-hour rate over {self.days:g} "
                f"days; utilization {self.utilization:g}, fleet.n_servers "
                f"{self.fleet.n_servers}), above max_jobs {self.max_jobs:,}: lower "
                "utilization, days or fleet.n_servers, or raise max_jobs")

    @field_validator("executor")
    @classmethod
    def _reserve_fits(cls, executor: ExecutorConfig, info: ValidationInfo) -> ExecutorConfig:
        fleet = info.data.get("fleet")
        largest = max(t.cpu_cores for t in fleet.tiers) if fleet is not None else None
        if largest is not None and executor.lc_reserve_cores > largest:
            raise ValueError(f"lc_reserve_cores {executor.lc_reserve_cores:g} is more than "
                             f"the largest server's {largest:g} cores")
        return executor

    # ------------------------------------------------------------------ derived
    @property
    def ticks_per_hour(self) -> float:
        return 3600.0 / self.tick_seconds

    @property
    def n_ticks(self) -> int:
        return int(round(self.days * 24 * self.ticks_per_hour))

    def max_duration_ticks(self, c: int) -> int:
        """Longest run time of class ``c``: 4x its mean (the geometric draw is capped)."""
        mean = max(1.0, self.classes[c].duration_min_mean * 60.0 / self.tick_seconds)
        return max(1, int(round(4 * mean)))

    @property
    def drain_ticks(self) -> int:
        """Ticks after the last arrival until every job's deadline has passed."""
        return max(self.minutes_to_ticks(c.slack_min) + self.max_duration_ticks(i)
                   for i, c in enumerate(self.classes))

    @property
    def episode_ticks(self) -> int:
        """Arrivals for ``days``, then the drain: every job ends inside the episode."""
        return self.n_ticks + self.drain_ticks

    @property
    def signal_ticks(self) -> int:
        """Ticks of the signal series an episode builds: the episode, the forecast horizon,
        one more (as :class:`envs.scenario.sim.ScenarioSim` does)."""
        return self.episode_ticks + int(round(self.signals.horizon_hours * self.ticks_per_hour)) + 1

    @property
    def demand_block_ticks(self) -> int:
        """Ticks per demand-meter block (at least one)."""
        return max(1, int(round(self.cost.demand_block_minutes * 60.0 / self.tick_seconds)))

    @property
    def demand_usd_per_kw(self) -> float:
        """The demand charge per kW of the episode's peak: the monthly rate x days / 30."""
        return self.cost.demand_usd_per_kw_month * self.days / 30.0

    @property
    def decision_ticks(self) -> int:
        return max(1, int(round(self.decision_minutes * 60.0 / self.tick_seconds)))

    def minutes_to_ticks(self, minutes: float) -> int:
        return int(round(minutes * 60.0 / self.tick_seconds))

    @property
    def resume_ticks(self) -> int:
        return int(-(-self.power.resume_seconds // self.tick_seconds))

    @property
    def boot_ticks(self) -> int:
        return int(-(-self.power.boot_seconds // self.tick_seconds))
