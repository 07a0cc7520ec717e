"""APPO (RLlib's, with ``models.masked_appo.MaskedAPPOTorchRLModule``): typed hyperparameters.

IMPALA's settings plus PPO's clipped surrogate against a target policy. The circular
buffer holds 8 batches and trains on each at most twice; the target policy is copied
from the learner's (``tau`` 1) every ``2 * 8 * 2`` batch updates
(``target_network_update_freq`` x buffer size x passes: RLlib's rule and defaults).
"""

from __future__ import annotations

from pydantic import Field

from cloudrl.algorithms.impala import IMPALAHparams


class APPOHparams(IMPALAHparams):
    """``APPOConfig.training(...)`` arguments with cloudrl's defaults."""

    clip_param: float = Field(default=0.2, gt=0)
    use_kl_loss: bool = False
    kl_coeff: float | None = Field(default=None, ge=0)
    kl_target: float | None = Field(default=None, gt=0)
    circular_buffer_num_batches: int = Field(default=8, ge=1)
    circular_buffer_iterations_per_batch: int = Field(default=2, ge=1)
    target_network_update_freq: int = Field(default=2, ge=1)
    tau: float | None = Field(default=None, gt=0, le=1)
