"""BDQ's typed hyperparameters (``cloudrl train --algo bdq --hparams ...``)."""

from __future__ import annotations

from pydantic import Field

from cloudrl.algorithms.dqn import EpsilonGreedyHparams
from cloudrl.algorithms.hparams import AlignmentHparams


class BDQHparams(EpsilonGreedyHparams, AlignmentHparams):
    """``BDQConfig.training(...)`` arguments: DQN's defaults, always dueling.

    ``double_q`` left at None keeps ``BDQConfig``'s double-Q target; the device-replay
    switches and the alignment head's ``alignment_*`` settings are ``BDQConfig``'s (see
    :mod:`cloudrl.algorithms.bdq.bdq`).
    """

    double_q: bool | None = None
    device_replay: bool | None = None
    device_replay_capacity: int | None = Field(default=None, ge=1)
    device_replay_checkpoint: bool | None = None
