"""PPO (RLlib's, with ``models.masked_ppo.MaskedPPOTorchRLModule``): typed hyperparameters.

The config and learner (RLlib's PPO plus the preference-alignment head) are in
:mod:`cloudrl.algorithms.masked_ppo`; this module stays free of Ray.
"""

from __future__ import annotations

from pydantic import Field

from cloudrl.algorithms.hparams import AlignmentHparams


class PPOHparams(AlignmentHparams):
    """``PPOConfig.training(...)`` arguments with cloudrl's defaults (flat interface).

    Batches of 2,000 env steps, 4 epochs of 250-step minibatches; ``lambda_`` is GAE's.
    The ``alignment_*`` fields are the preference-alignment head's (``MaskedPPOConfig``).
    """

    lr: float = Field(default=3e-4, gt=0)
    gamma: float = Field(default=0.99, ge=0, le=1)
    lambda_: float = Field(default=0.95, ge=0, le=1)
    train_batch_size_per_learner: int = Field(default=2000, ge=1)
    minibatch_size: int = Field(default=250, ge=1)
    num_epochs: int = Field(default=4, ge=1)
    entropy_coeff: float = Field(default=0.01, ge=0)
    clip_param: float = Field(default=0.2, gt=0)
    vf_loss_coeff: float = Field(default=0.5, ge=0)
    vf_clip_param: float = Field(default=100.0, gt=0)
    grad_clip: float | None = Field(default=1.0, gt=0, description="None: no clipping")
    use_kl_loss: bool | None = None
    kl_coeff: float | None = Field(default=None, ge=0)
    kl_target: float | None = Field(default=None, gt=0)
