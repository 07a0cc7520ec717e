"""EnvConfig: simulator + workload + seed pool, as one validated object.

Accepts the nested form (``{"sim": {...}, "workload": {"kind": "poisson", ...}}``)
and the shortcuts users type most: ``n_servers``, ``workload`` given as a kind
name, and workload fields without a kind (those of the default, ``poisson``).
RLlib hands envs an ``EnvContext`` (a dict); it goes through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from envs.sim_config import SimConfig, StrictConfig
from envs.workloads import PoissonConfig, WorkloadConfig


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

    @classmethod
    def coerce(cls, config: EnvConfig | Mapping[str, Any] | None) -> EnvConfig:
        """An EnvConfig from an EnvConfig, a (possibly RLlib EnvContext) mapping, or None."""
        if config is None:
            return cls()
        if isinstance(config, EnvConfig):
            return config
        return cls.model_validate(dict(config))
