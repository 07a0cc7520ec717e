"""EnvConfig: simulator + workload + seed pool, as one validated object.

Accepts the nested form (``{"sim": {...}, "workload": {"kind": "poisson", ...}}``)
and the shortcuts users type most: ``n_servers``, ``workload`` given as a kind
name, and workload fields without a kind (those of the default, ``poisson``).
RLlib hands envs an ``EnvContext`` (a dict); it goes through here.

Validation also refuses a config whose episode would create more jobs, ticks or bytes
than ``sim.limits`` allows (``envs.workloads.work_size``), naming the field. A trace
workload is checked against its file when the file loads (read once per file version);
a missing or invalid file is left to the checks that report files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from envs.sim_config import SimConfig, StrictConfig
from envs.workloads import PoissonConfig, WorkloadConfig, WorkSizeError, make_workload
from envs.workloads.work_size import check_episode_work


class EnvConfig(StrictConfig):
    """Everything an env needs. ``seed_pool``: episode seeds drawn by ``reset()`` without a seed."""

    sim: SimConfig = Field(default_factory=SimConfig)
    workload: WorkloadConfig = Field(default_factory=PoissonConfig)
    seed_pool: tuple[int, ...] | None = None

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

    @model_validator(mode="after")
    def _episode_fits_limits(self) -> EnvConfig:
        try:
            workload = make_workload(self.workload, self.sim.tick_seconds)
        except WorkSizeError:
            raise
        except (OSError, ValueError):  # a trace file that does not load: reported elsewhere
            return self
        check_episode_work(self.sim, workload)
        return self

    @classmethod
    def coerce(cls, config: EnvConfig | Mapping[str, Any] | None) -> EnvConfig:
        """An EnvConfig from an EnvConfig, a (possibly RLlib EnvContext) mapping, or None."""
        if config is None:
            return cls()
        if isinstance(config, EnvConfig):
            return config
        return cls.model_validate(dict(config))
