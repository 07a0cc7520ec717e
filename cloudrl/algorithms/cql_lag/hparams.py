"""``CQLLagConfig.training(...)`` hyperparameters with cloudrl's defaults (typed)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cloudrl.algorithms.hparams import Hparams


class CQLLagHparams(Hparams):
    """The CQL-Lagrangian learner's settings; ``cost_budget`` is set by
    ``cloudrl offline train`` from the dataset unless given."""

    lr: float = Field(3e-4, gt=0)
    gamma: float = Field(0.95, gt=0, lt=1)
    cql_alpha: float = Field(1.0, ge=0)
    cql_cost_alpha: float = Field(0.0, ge=0)
    cost_budget: float | None = Field(None, gt=0)
    reward_scale: float = Field(0.01, gt=0)
    lagrange_mode: Literal["dual", "pid", "plain"] = "dual"
    lagrange_init: float = Field(0.1, gt=0)
    lagrange_lr: float = Field(0.01, gt=0)
    lagrange_warmup: int = Field(500, ge=0)
    tau: float = Field(0.05, gt=0, le=1)
    target_network_update_freq: int = Field(1, ge=1)
    support_threshold: float = Field(0.3, ge=0, le=1)
    support_data: Literal["safe", "all"] = "safe"
    support_top: float = Field(1.0, gt=0, le=1)
    bc_weight: float = Field(1.0, ge=0)
    cost_upper_alpha: float = Field(0.0, ge=0)
