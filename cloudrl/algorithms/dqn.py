"""DQN (RLlib's, with ``models.masked_dqn.MaskedDQNTorchRLModule``): typed hyperparameters.

:class:`QLearningHparams` holds what every Q-learner here shares (DQN, BDQ, Ape-X BDQ):
n-step returns, a target network, prioritized replay, the learning-start threshold.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cloudrl.algorithms.hparams import Hparams, RunShape

# [[timestep, value], ...]: RLlib's piecewise-linear schedule
Schedule = list[tuple[int, float]]


class ReplayBufferSettings(BaseModel):
    """``replay_buffer_config``: RLlib's prioritized episode replay by default."""

    model_config = ConfigDict(extra="forbid")

    type: str = "PrioritizedEpisodeReplayBuffer"
    capacity: int = Field(default=100_000, ge=1)
    alpha: float = Field(default=0.6, ge=0)
    beta: float = Field(default=0.4, ge=0)


class QLearningHparams(Hparams):
    """Settings shared by the Q-learners.

    ``num_steps_sampled_before_learning_starts`` defaults to ``min(2000, env_steps // 5)``.
    """

    lr: float = Field(default=5e-4, gt=0)
    gamma: float = Field(default=0.99, ge=0, le=1)
    train_batch_size_per_learner: int = Field(default=64, ge=1)
    n_step: int | tuple[int, int] = Field(default=3, description="int, or a [min, max] range")
    target_network_update_freq: int = Field(default=1000, ge=0)
    num_steps_sampled_before_learning_starts: int | None = Field(
        default=None, ge=0, description="None: min(2000, env_steps // 5)")
    replay_buffer_config: ReplayBufferSettings = Field(default_factory=ReplayBufferSettings)
    grad_clip: float | None = Field(default=10.0, gt=0, description="None: no clipping")
    tau: float | None = Field(default=None, gt=0, le=1)
    td_error_loss_fn: Literal["huber", "mse"] | None = None
    training_intensity: float | None = Field(default=None, gt=0)

    def run_defaults(self, run: RunShape) -> dict[str, Any]:
        return {"num_steps_sampled_before_learning_starts": min(2000, run.env_steps // 5)}


class EpsilonGreedyHparams(QLearningHparams):
    """A Q-learner exploring with one epsilon schedule: 1.0 to 0.05 over half the budget."""

    epsilon: float | Schedule | None = Field(
        default=None, description="None: [[0, 1.0], [max(1, env_steps // 2), 0.05]]")

    def run_defaults(self, run: RunShape) -> dict[str, Any]:
        return {**super().run_defaults(run),
                "epsilon": [[0, 1.0], [max(1, run.env_steps // 2), 0.05]]}


class DQNHparams(EpsilonGreedyHparams):
    """``DQNConfig.training(...)`` arguments with cloudrl's defaults: masked Double DQN."""

    double_q: bool = True
    dueling: bool = False
