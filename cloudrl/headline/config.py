"""The typed config of ``cloudrl headline`` (``experiments/configs/headline.yaml``); defaults run.

Every field has a default; an unknown or bad field is a one-line error naming it
(``train.algo``, ``tune.num_samples``). :func:`tiny` shrinks a config to an end-to-end
smoke size (N=5, 2 seeds, 1,500 env steps: two iterations, two candidate checkpoints)
for ``--tiny`` and the fast tests.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from cloudrl.algorithms.specs import ALGOS, checked_hparams, spec_of
from cloudrl.policy import Interface
from cloudrl.protocol import N_SEEDS

Workload = Literal["poisson", "google_v2_like"]
TUNED_MARKER = "tuned"  # train.hparams {"heuristic": "tuned"} -> the tuned parameters dict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TuneSection(_Strict):
    """The heuristic sweep (``cloudrl tune-heuristic``) run per workload."""

    num_samples: int = Field(default=40, ge=1)
    n_seeds: int = Field(default=N_SEEDS, ge=1, le=N_SEEDS, description="train seeds per trial")
    max_concurrent_trials: int = Field(default=2, ge=1)
    confirm_seeds: int = Field(default=N_SEEDS, ge=0, le=N_SEEDS, description=(
        "validation seeds on which the sweep's best must beat the defaults (else they stay)"))


class TrainSection(_Strict):
    """The learned policy: any row of ``cloudrl.algorithms.specs.ALGORITHMS``."""

    algo: str = "bdq"
    env_steps: int = Field(default=200_000, ge=1)
    hparams: dict[str, Any] = Field(default_factory=dict)
    checkpoint_every: int = Field(default=10, ge=1, description="iterations between the "
                                  "checkpoints that compete on the validation seeds")
    num_env_runners: int = Field(default=0, ge=0)
    num_learners: int = Field(default=0, ge=0)
    num_gpus_per_learner: float = Field(default=0.0, ge=0)
    run_seed: int = Field(default=0, ge=0)

    @field_validator("algo")
    @classmethod
    def _known_algo(cls, algo: str) -> str:
        if algo not in ALGOS:
            raise ValueError(f"unknown algorithm {algo!r}; expected one of {list(ALGOS)}")
        return algo

    @field_validator("hparams")
    @classmethod
    def _typed_hparams(cls, hparams: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if info.data.get("algo") is not None:  # "tuned" stands for a parameters dict
            checked_hparams(info.data["algo"], resolved_hparams(hparams, _default_params()))
        return hparams


def _default_params() -> dict[str, Any]:
    from dataclasses import asdict

    from cloudrl.heuristics.power_aware import PowerAwareConfig

    return asdict(PowerAwareConfig())


def resolved_hparams(hparams: dict[str, Any], tuned_params: dict[str, Any]) -> dict[str, Any]:
    """``hparams`` with every ``"tuned"`` value of a ``heuristic`` key replaced by the tuned
    heuristic's parameters (how a recipe gets its base heuristic), at any depth."""
    out: dict[str, Any] = {}
    for key, value in hparams.items():
        if key == "heuristic" and value == TUNED_MARKER:
            out[key] = dict(tuned_params)
        elif isinstance(value, dict):
            out[key] = resolved_hparams(value, tuned_params)
        else:
            out[key] = value
    return out


class HeadlineConfig(_Strict):
    """One headline run: per workload tune, train, select on validation, test."""

    name: str = Field(default="headline", pattern=r"^[A-Za-z0-9_.-]+$")
    workloads: list[Workload] = Field(default_factory=lambda: ["poisson", "google_v2_like"],
                                      min_length=1)
    n_servers: int = Field(default=50, ge=1, le=4096)
    interface: Interface = "branching"
    episode_length: int = Field(default=1000, ge=1)
    tune: TuneSection = Field(default_factory=TuneSection)
    train: TrainSection = Field(default_factory=TrainSection)
    validation_seeds: int = Field(default=20, ge=1, le=N_SEEDS,
                                  description="validation seeds per candidate checkpoint")
    test_seeds: int = Field(default=N_SEEDS, ge=1, le=N_SEEDS)
    eval_workers: int = Field(default=2, ge=1, le=64)
    baselines: list[str] = Field(default_factory=lambda: ["round_robin", "power_aware"])
    violation_margin_pp: float = Field(default=0.05, ge=0, description="goal: paired "
                                       "violation-rate CI upper bound <= this (percentage points)")
    gap_goal: float = Field(default=0.30, ge=0, le=1)
    out_dir: str = "results/headline"
    experiment: str = "cloudrl-headline"
    tracking_uri: str | None = None

    @model_validator(mode="after")
    def _algo_fits_interface(self) -> HeadlineConfig:
        acts_on = spec_of(self.train.algo).interface
        if acts_on != self.interface:
            raise ValueError(f"train.algo: {self.train.algo} acts on the {acts_on} interface, "
                             f"interface is {self.interface}")
        from cloudrl.heuristics import HEURISTICS

        for name in self.baselines:
            if name not in HEURISTICS:
                raise ValueError(f"baselines: unknown heuristic {name!r}; expected some of "
                                 f"{sorted(HEURISTICS)}")
        return self

    def env(self, workload: str) -> dict[str, Any]:
        return {"n_servers": self.n_servers, "workload": workload,
                "sim": {"episode_length": self.episode_length}}


def tiny(cfg: HeadlineConfig) -> HeadlineConfig:
    """``cfg`` at smoke size: N=5, 100-tick episodes, 2 seeds everywhere, 1,500 env steps."""
    data = cfg.model_dump()
    data.update(n_servers=5, episode_length=100, validation_seeds=2, test_seeds=2,
                eval_workers=1, name=f"{cfg.name}-tiny")
    data["tune"] = {**data["tune"], "num_samples": 2, "n_seeds": 2, "confirm_seeds": 2}
    data["train"] = {**data["train"], "env_steps": 1500, "checkpoint_every": 1,
                     "num_env_runners": 0, "num_learners": 0, "num_gpus_per_learner": 0.0}
    return HeadlineConfig.model_validate(data)
