"""Masked PPO: RLlib's PPO with the preference-alignment head (``cloudrl train --algo ppo``).

``MaskedPPOConfig`` is a ``PPOConfig`` (algorithm class ``PPO``, every PPO setting and
default unchanged) whose ``training(...)`` also takes the alignment head's settings
(``alignment_pairs``, ``alignment_weight``, ``alignment_batch``,
``alignment_trunk_grad_scale``; :mod:`cloudrl.algorithms.alignment_head`).
``MaskedPPOTorchLearner`` is ``PPOTorchLearner`` plus ``alignment_weight * BT`` on each
minibatch; with weight 0 it is ``PPOTorchLearner`` exactly. The RLModule is
``models.masked_ppo.MaskedPPOTorchRLModule`` (the head on its policy encoder); its typed
hyperparameters are :class:`cloudrl.algorithms.ppo.PPOHparams`.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner

from cloudrl.algorithms.alignment_head import (
    add_alignment_loss,
    configure_alignment,
    head_model_config,
    init_alignment,
    validate_alignment,
)


class MaskedPPOTorchLearner(PPOTorchLearner):
    """PPO's loss plus the preference-alignment head's Bradley-Terry term when configured."""

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict[str, Any],
                                fwd_out: dict[str, Any]) -> Any:
        loss = super().compute_loss_for_module(module_id=module_id, config=config,
                                               batch=batch, fwd_out=fwd_out)
        return add_alignment_loss(self, module_id, config, loss)


class MaskedPPOConfig(PPOConfig):
    """``PPOConfig`` with the alignment head's settings and :class:`MaskedPPOTorchLearner`."""

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class)
        init_alignment(self)

    def training(self, *, alignment_pairs: str | None = NotProvided,
                 alignment_weight: float | None = NotProvided,
                 alignment_batch: int | None = NotProvided,
                 alignment_trunk_grad_scale: float | None = NotProvided,
                 **kwargs: Any) -> MaskedPPOConfig:
        """``PPOConfig.training`` plus the alignment head's settings."""
        super().training(**kwargs)
        configure_alignment(self, {
            "alignment_pairs": alignment_pairs, "alignment_weight": alignment_weight,
            "alignment_batch": alignment_batch,
            "alignment_trunk_grad_scale": alignment_trunk_grad_scale})
        return self

    @property
    def _model_config_auto_includes(self) -> dict[str, Any]:
        return super()._model_config_auto_includes | head_model_config(self)

    def get_default_learner_class(self) -> type[MaskedPPOTorchLearner]:
        if self.framework_str != "torch":
            self._value_error("masked PPO is implemented for torch only")
        return MaskedPPOTorchLearner

    def validate(self) -> None:
        super().validate()
        validate_alignment(self)
