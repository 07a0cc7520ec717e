"""ServiceConfig: everything the decision service reads, with defaults that run.

Given as the ``args`` of the Serve application (``serve_apps/config.yaml``), as
``cloudrl serve`` flags, or in Python (``build_app(ServiceConfig(...))``). The bearer
token for the rollout and feedback endpoints comes from ``auth_token`` or, when that is
unset, from the ``CLOUDRL_SERVE_TOKEN`` environment variable. Every number has a range
(``docs/reference/input-ranges.md``); a value outside it is one line naming the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cloudrl.policy import Interface
from cloudrl.serving.schemas import MAX_POLICY_SPEC
from envs.env_config import EnvConfig
from serve_apps.scenario_config import ScenarioServing

TOKEN_ENV = "CLOUDRL_SERVE_TOKEN"


class ServiceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    policy: str = Field(default="heuristic:power_aware", min_length=1,
                        max_length=MAX_POLICY_SPEC,
                        description="checkpoint dir, heuristic:NAME or python:MODULE:FACTORY")
    canary: str | None = Field(default=None, min_length=1, max_length=MAX_POLICY_SPEC,
                               description="optional second version at start")
    canary_weight: float = Field(default=0.1, ge=0.0, le=1.0)
    env: EnvConfig = Field(default_factory=EnvConfig,
                           description="fleet and sim of heuristic/python policies "
                                       "(checkpoints bring their own)")
    interface: Interface = "branching"
    state_db: str = Field(default="results/serve/state.db",
                          description="SQLite file: feedback pairs and rollout state")
    auth_token: str | None = Field(default=None, min_length=8)
    decide_requires_token: bool = False
    max_body_bytes: int = Field(default=2_000_000, ge=1024, le=2**30)
    max_batch_size: int = Field(default=32, ge=1, le=4096)
    batch_wait_timeout_s: float = Field(default=0.0, ge=0.0, le=60.0, description="0: a batch "
                                        "is whatever queued while the previous one ran")
    model_timeout_s: float = Field(default=1.0, gt=0, le=600.0)
    failure_threshold: int = Field(default=3, ge=1, le=1_000_000)
    canary_rollback_timeouts: int = Field(default=3, ge=0, le=1_000_000, description="a "
                                          "canary is rolled back at its Nth decision that "
                                          "timed out (model_timeout_s), with or without an "
                                          "automatic plan; 0: never")
    cooldown_s: float = Field(default=5.0, ge=0, le=86_400.0)
    routing_seed: int = Field(default=0, ge=-(2**63), le=2**63 - 1)
    num_replicas: int = Field(default=1, ge=1, le=1024)
    num_cpus: float = Field(default=0.5, ge=0, le=1024, description="CPUs per replica")
    health_check_period_s: float = Field(default=10.0, gt=0, le=3600.0, description="seconds "
                                         "between Serve's health checks of a replica")
    health_check_timeout_s: float = Field(default=30.0, gt=0, le=3600.0)
    scenario: ScenarioServing | None = Field(default=None, description="a scenario and its "
                                             "controller for POST /v1/scenario/decide")
    smoke_timeout_s: float = Field(default=10.0, gt=0, le=3600.0, description="time a new "
                                   "version has to answer its smoke-test states before it is "
                                   "refused")

    def token(self) -> str | None:
        return self.auth_token or os.environ.get(TOKEN_ENV) or None

    def resolved(self) -> ServiceConfig:
        """Absolute state_db (replicas may run in another working directory)."""
        return self.model_copy(update={"state_db": str(Path(self.state_db).resolve())})

    @classmethod
    def coerce(cls, value: ServiceConfig | dict[str, Any] | None) -> ServiceConfig:
        if isinstance(value, ServiceConfig):
            return value
        return cls.model_validate(value or {})
