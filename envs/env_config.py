"""EnvConfig: simulator + workload + seed pool, as one validated object.

Accepts the nested form (``{"sim": {...}, "workload": {"kind": "poisson", ...}}``)
and the shortcuts users type most: ``n_servers``, ``workload`` given as a kind
name, and workload fields without a kind (those of the default, ``poisson``).
RLlib hands envs an ``EnvContext`` (a dict); it goes through here.

Validation also refuses a config whose episode would create more jobs, ticks or bytes
than ``sim.limits`` allows (``envs.workloads.work_size``; with signals, the bytes of the
signal timebase too), naming the field, and a signal file that is unreadable or does not
cover an episode and its forecast horizon (``envs.signals.real.check_source``). A trace
workload is checked against its file when the file loads (read once per file version);
a missing or invalid file is left to the checks that report files.

``signals`` (a :class:`envs.signals.SignalConfig`, or None, the default) adds the exogenous
signals (electricity price, grid carbon, optional on-site solar, with forecasts) to every
episode: features appended to the ``macro`` observation, ``energy_usd`` / ``carbon_kg`` in
``info`` and a weighted dollar-cost term in the reward (``envs.cluster_env``). With None the
envs are exactly those without signals (same observations, rewards, infos and random streams).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from envs.sim_config import MAX_WEIGHT, SimConfig, StrictConfig
from envs.workloads import PoissonConfig, WorkloadConfig, WorkSizeError, make_workload
from envs.workloads.work_size import check_episode_work, check_signal_work


class EnvConfig(StrictConfig):
    """Everything an env needs. ``seed_pool``: episode seeds drawn by ``reset()`` without a seed."""

    sim: SimConfig = Field(default_factory=SimConfig)
    workload: WorkloadConfig = Field(default_factory=PoissonConfig)
    seed_pool: tuple[int, ...] | None = None
    # a SignalConfig or None; typed Any so that importing this module does not import
    # envs.signals (and scipy.signal): the validator below builds the SignalConfig
    signals: Any = Field(
        default=None, description="exogenous price, carbon and solar signals (with forecasts) "
        "in every episode: an envs.signals.SignalConfig or a mapping of its fields; None: no "
        "signals, the envs exactly as without them")
    signal_cost_weight: float = Field(
        default=5.0, ge=0.0, le=MAX_WEIGHT,
        description="weight of the step's dollar cost (energy at the tick's price plus carbon "
        "at carbon_usd_per_tonne) in the reward, in units of one tick at fleet peak power at "
        "$100/MWh; the default equals sim.alpha's (needs signals)")
    carbon_usd_per_tonne: float = Field(
        default=100.0, ge=0.0, le=10_000.0,
        description="carbon price that turns carbon_kg into dollars in the reward term "
        "(0..10000 $/tCO2; needs signals)")

    @model_validator(mode="before")
    @classmethod
    def _shortcuts(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        n_servers = data.pop("n_servers", None)
        if n_servers is not None:
            sim = dict(data.get("sim") or {})
            fleet = dict(sim.get("fleet") or {})
            fleet["n_servers"] = n_servers
            sim["fleet"] = fleet
            data["sim"] = sim
        if isinstance(data.get("workload"), str):
            data["workload"] = {"kind": data["workload"]}
        elif isinstance(data.get("workload"), Mapping) and "kind" not in data["workload"]:
            # the default workload's fields without its kind (CLOUDRL__ENV__WORKLOAD__RATE=2)
            data["workload"] = {"kind": "poisson", **data["workload"]}
        return data

    @field_validator("signals", mode="before")
    @classmethod
    def _signal_config(cls, value: Any) -> Any:
        if value is None:
            return None
        from envs.signals.config import SignalConfig

        if isinstance(value, SignalConfig):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"signals: expected a SignalConfig or a mapping of its fields "
                             f"(or None), got {type(value).__name__} {value!r}")
        try:
            return SignalConfig.model_validate(dict(value))
        except ValidationError as err:
            lines = []
            for e in err.errors():
                where = ".".join(str(part) for part in e["loc"])
                msg = e["msg"].removeprefix("Value error, ")
                lines.append(f"signals.{where}: {msg}" if where else f"signals: {msg}")
            raise ValueError("; ".join(lines)) from None

    @model_validator(mode="after")
    def _signal_fields_need_signals(self) -> EnvConfig:
        if self.signals is None:
            for name in ("signal_cost_weight", "carbon_usd_per_tonne"):
                if name in self.model_fields_set and \
                        getattr(self, name) != type(self).model_fields[name].default:
                    raise ValueError(f"{name}: only used with signals; set signals (a "
                                     "SignalConfig, e.g. signals: {}) or leave it out")
        return self

    @model_validator(mode="after")
    def _episode_fits_limits(self) -> EnvConfig:
        try:
            workload = make_workload(self.workload, self.sim.tick_seconds)
        except WorkSizeError:
            raise
        except (OSError, ValueError):  # a trace file that does not load: reported elsewhere
            return self
        work = check_episode_work(self.sim, workload)
        if self.signals is not None:  # the signal timebase, then a real source's file
            from envs.signals.real import check_source

            horizon = self.signals.horizon_ticks(self.sim.tick_seconds)
            ticks = check_signal_work(self.sim, self.signals.horizon_hours, horizon, work)
            check_source(self.signals, ticks, self.sim.tick_seconds)
        return self

    @classmethod
    def coerce(cls, config: EnvConfig | Mapping[str, Any] | None) -> EnvConfig:
        """An EnvConfig from an EnvConfig, a (possibly RLlib EnvContext) mapping, or None."""
        if config is None:
            return cls()
        if isinstance(config, EnvConfig):
            return config
        return cls.model_validate(dict(config))
