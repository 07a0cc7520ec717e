"""Ape-X BDQ's typed hyperparameters (``cloudrl train --algo apex_bdq --hparams ...``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from cloudrl.algorithms.dqn import QLearningHparams
from cloudrl.algorithms.hparams import AlignmentHparams, RunShape


class ApexBDQHparams(QLearningHparams, AlignmentHparams):
    """``ApexBDQConfig.training(...)`` arguments: BDQ's, without the epsilon schedule
    (Ape-X's actors explore with constant per-actor epsilons); as many replay shards as
    actors, at most 2; the alignment head's ``alignment_*`` settings, inherited from
    ``BDQConfig``. Fields left at None keep ``ApexBDQConfig``'s defaults (see
    :mod:`cloudrl.algorithms.apex_bdq.apex_bdq`)."""

    double_q: bool | None = None
    num_replay_shards: int | None = Field(default=None, ge=1,
                                          description="None: min(2, num_env_runners)")
    replay_shard_capacity: int | None = Field(default=None, ge=1)
    num_cpus_per_replay_shard: float | None = Field(default=None, ge=0)
    max_num_replay_shard_restarts: int | None = Field(default=None, ge=-1)
    replay_requests_in_flight: int | None = Field(default=None, ge=1)
    broadcast_interval: int | None = Field(default=None, ge=1)
    apex_epsilon: float | None = Field(default=None, ge=0, le=1)
    apex_epsilon_alpha: float | None = Field(default=None, ge=0)
    max_replay_ratio: float | None = Field(default=None, gt=0)
    replay_fetch_timeout_s: float | None = Field(default=None, ge=0)
    checkpoint_replay_shards: bool | None = None

    def run_defaults(self, run: RunShape) -> dict[str, Any]:
        return {**super().run_defaults(run), "num_replay_shards": min(2, run.num_env_runners)}
