"""``OfflineConfig``: typed settings of ``cloudrl offline record|train|evaluate``.

Every field has a default that runs (``experiments/configs/offline.yaml`` spells them out);
``--config``, ``CLOUDRL__TRAIN__UPDATES=...``-style variables and flags override them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from envs.env_config import EnvConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class RecordSection(_Strict):
    """The logged dataset: which behaviours, how noisy, how many episodes each."""

    policies: list[str] = Field(default_factory=lambda: ["power_aware", "sjf", "ffd",
                                                         "round_robin"], min_length=1,
                                description="heuristic names or checkpoint dirs")
    epsilons: list[float] = Field(default_factory=lambda: [0.0, 0.2], min_length=1,
                                  description="ε of the ε-random-valid variants; 0: as is")
    episodes: int = Field(2, ge=1, le=50, description="episodes per (policy, ε), train seeds")
    max_steps: int | None = Field(None, ge=1, description="cut episodes after this many steps")
    overload_weight: float = Field(0.0, ge=0, description="cost per overloaded server-step")
    overload_threshold: float = Field(0.9, gt=0, le=1)
    noise_seed: int = 0
    out: str = "results/offline/data"


class TrainSection(_Strict):
    """The CQL-Lagrangian learner (``cloudrl.algorithms.cql_lag``) and its baselines."""

    algo: Literal["cql_lag", "bc", "marwil"] = "cql_lag"
    data: str = "results/offline/data"
    budget: float | None = Field(None, gt=0, description="SLA violations per episode; None: "
                                 "the best behaviour's mean in the dataset (at least 0.5)")
    budget_fraction: float = Field(1.0, gt=0, le=10,
                                   description="multiplies the budget (0.5: half of it)")
    iterations: int = Field(100, ge=1, description="training iterations")
    train_batch_size: int = Field(1024, ge=8, description="transitions per iteration")
    minibatch_size: int = Field(256, ge=8)
    num_epochs: int = Field(1, ge=1, description="passes over each sampled batch")
    torch_threads: int | None = Field(1, ge=1, description="torch intra-op threads of the "
                                      "(local) learner; None: torch's default")
    lr: float = Field(3e-4, gt=0)
    gamma: float = Field(0.95, gt=0, lt=1, description="0.95: the cost critic converges "
                         "in ~1,000 updates (Q_c = c/(1-γ) needs ~1/(τ(1-γ)) of them)")
    cql_alpha: float = Field(1.0, ge=0)
    cql_cost_alpha: float = Field(0.0, ge=0, description="CQL on the cost head (ablation)")
    reward_scale: float = Field(0.01, gt=0)
    lagrange_mode: Literal["dual", "pid", "plain"] = Field(
        "dual", description="plain: the source's unnormalised dual ascent (ablation)")
    lagrange_init: float = Field(0.1, gt=0)
    lagrange_lr: float = Field(0.01, gt=0)
    lagrange_max: float = Field(100.0, gt=0)
    lagrange_warmup: int = Field(500, ge=0, description="updates with λ frozen")
    tau: float = Field(0.05, gt=0, le=1, description="Polyak rate of the target networks")
    target_network_update_freq: int = Field(1, ge=1)
    support_threshold: float = Field(0.3, ge=0, le=1, description="BCQ's filter: only "
                                     "actions with behaviour-cloned prob >= τ·max; 0: all")
    support_data: Literal["safe", "all"] = Field(
        "safe", description="the behaviour head learns from: episodes within the budget "
        "(safe) or all")
    support_top: float = Field(1.0, gt=0, le=1, description="the behaviour head learns "
                               "from this share of those episodes, highest return first "
                               "(%BC); 1: all")
    bc_weight: float = Field(1.0, ge=0, description="the behaviour head's cross-entropy")
    cost_upper_alpha: float = Field(0.0, ge=0, description="raises Q_c off the data "
                                    "(pessimism on cost in the right direction)")
    hidden: int = Field(64, ge=4)
    seed: int = 0
    out: str = "results/offline/cql_lag"


class EvaluateSection(_Strict):
    """Policies on the held-out test seeds; cost normalised by the budget."""

    checkpoints: list[str] = Field(default_factory=list)
    policies: list[str] = Field(default_factory=lambda: ["power_aware", "sjf", "ffd",
                                                         "round_robin"])
    budget: float | None = Field(None, gt=0, description="None: the checkpoint's budget")
    n_seeds: int = Field(10, ge=1, le=50)
    out: str = "results/offline/eval"


def _default_env() -> EnvConfig:
    return EnvConfig.model_validate({"n_servers": 15})


class OfflineConfig(_Strict):
    """The offline constrained agent's config (``experiments/configs/offline.yaml``)."""

    env: EnvConfig = Field(default_factory=_default_env)
    interface: Literal["flat", "branching"] = Field(
        "flat", description="the action interface datasets are recorded on (training "
        "follows the dataset's, evaluation the checkpoints')")
    record: RecordSection = Field(default_factory=RecordSection)
    train: TrainSection = Field(default_factory=TrainSection)
    evaluate: EvaluateSection = Field(default_factory=EvaluateSection)
    experiment: str = "cloudrl-offline"
    tracking_uri: str | None = None
    mlflow: bool = True
