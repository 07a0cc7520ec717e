"""Masked actor-critic for APPO: ``MaskedPPOTorchRLModule`` plus RLlib's ``TargetNetworkAPI``.

APPO's learner (``APPOTorchLearner``) needs, besides the value function, a
*target* policy: a slowly updated copy of the actor that the clipped surrogate
and the V-trace importance weights are computed against. It calls
``make_target_networks()`` once after the module is built,
``get_target_network_pairs()`` at every target update (Polyak with ``tau``),
and ``forward_target(batch)`` in the loss, whose
``TARGET_NETWORK_ACTION_DIST_INPUTS`` it reads as logits of the same
categorical distribution as the main policy.

The target logits are masked exactly like the main ones
(``clamp(log(mask), FLOAT_MIN)`` added), so the target distribution puts zero
mass on infeasible actions too: the IS ratio and the optional KL term compare
two distributions over the same feasible set. The target copies are not
needed to act, so inference-only modules (env runners, ``CheckpointPolicy``)
ignore them. IMPALA needs no target network and uses
``MaskedPPOTorchRLModule`` itself.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.utils import make_target_network
from ray.rllib.core.rl_module.apis import TARGET_NETWORK_ACTION_DIST_INPUTS, TargetNetworkAPI

from models.masked_ppo import MaskedPPOTorchRLModule, mask_logits


class MaskedAPPOTorchRLModule(MaskedPPOTorchRLModule, TargetNetworkAPI):
    """``MaskedPPOTorchRLModule`` with a masked target actor (encoder + policy head copy)."""

    def make_target_networks(self) -> None:
        self._old_encoder = make_target_network(self.encoder)
        self._old_pi = make_target_network(self.pi)

    def get_target_network_pairs(self) -> list[tuple[Any, Any]]:
        return [(self.encoder, self._old_encoder), (self.pi, self._old_pi)]

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        logits = self._old_pi(self._old_encoder(obs))
        return {TARGET_NETWORK_ACTION_DIST_INPUTS: mask_logits(logits, obs)}

    def get_non_inference_attributes(self) -> list[str]:
        return [*super().get_non_inference_attributes(), "_old_encoder", "_old_pi"]
