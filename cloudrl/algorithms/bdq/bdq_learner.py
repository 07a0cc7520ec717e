"""The BDQ loss on RLlib's DQN learner: ``bdq_td_errors`` and ``BDQTorchLearner``.

Loss (Tavakoli et al. 2018, with n-step returns and prioritized replay):

* one target shared by all D branches (double Q, feasible-masked next-state Q):
  ``y = r + gamma^n (1 - done) * (1/D) sum_d Q'_d(s', argmax_{a feasible} Q_d(s', a))``
  (``double_q=False``: ``max_{a feasible} Q'_d(s', a)`` instead);
* per-branch error ``delta_d = y - Q_d(s, a_d)``;
* ``loss = mean_batch(IS weight * mean_d L(delta_d))`` with ``L`` Huber (delta 1) or
  squared error (``td_error_loss_fn``);
* replay priorities: ``sum_d |delta_d|``, logged under ``TD_ERROR_KEY`` exactly where
  ``DQN.training_step`` reads it to update the ``PrioritizedEpisodeReplayBuffer``.

The 1/(D+1) trunk-gradient rescaling lives in ``models.bdq.BDQTorchRLModule._forward_train``.

Why stock ``DQNTorchLearner`` does not do: it gathers ``Q (B, A)`` with
``actions.view(B, D, 1)`` (rank mismatch) and would log a ``(B, D)`` TD error where the
prioritized buffer needs one value per sampled transition. Here: gather per branch,
summed priorities. Actions arrive as int32 ``(D,)`` rows (RLlib's ``TensorToNumpy``
connector narrows the module's int64 actions); the loss casts them to int64.

Preference-alignment head (``alignment_weight > 0`` with ``alignment_pairs``): the loss
returned is ``TD loss + alignment_weight * BT`` (:mod:`cloudrl.algorithms.alignment_head`);
``qf_loss`` stays the TD part alone. Weight 0 adds nothing and draws nothing.

With the device replay the batch carries a per-sample ``discounts`` column (``gamma**k``,
``k`` truncated at episode ends) that the loss reads instead of ``n_step``.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.dqn.dqn import DQNConfig
from ray.rllib.algorithms.dqn.dqn_learner import (
    QF_LOSS_KEY,
    QF_MAX_KEY,
    QF_MEAN_KEY,
    QF_MIN_KEY,
    QF_NEXT_PREDS,
    QF_PREDS,
    QF_TARGET_NEXT_PREDS,
    TD_ERROR_MEAN_KEY,
)
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.utils.metrics import TD_ERROR_KEY
from torch import nn

from cloudrl.algorithms.alignment_head import add_alignment_loss

DISCOUNTS = "discounts"
REPLAY_INDICES = "replay_indices"  # replay slots of a batch sent to remote learners
FUSED_ADAM_DEVICES = ("cpu", "cuda")


def bdq_td_errors(fwd_out: dict[str, torch.Tensor], batch: dict[str, Any], gamma: float,
                  double_q: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_selected (B, D), target y (B,))`` of the branching double-Q loss (y detached).

    The bootstrap discount is ``batch["discounts"]`` when present (per-sample ``gamma**k``
    from ``DeviceReplayBuffer``, ``k`` truncated at episode ends), else
    ``gamma ** batch["n_step"]`` (episode replay), else ``gamma``.
    """
    actions = batch[Columns.ACTIONS].long()
    q_selected = torch.gather(fwd_out[QF_PREDS], -1, actions[..., None]).squeeze(-1)
    q_target_next = fwd_out[QF_TARGET_NEXT_PREDS]
    if double_q:
        best = fwd_out[QF_NEXT_PREDS].argmax(dim=-1, keepdim=True)
        q_next = torch.gather(q_target_next, -1, best).squeeze(-1)
    else:
        q_next = q_target_next.max(dim=-1).values
    not_done = 1.0 - batch[Columns.TERMINATEDS].float()
    discounts = batch.get(DISCOUNTS)
    if discounts is not None:  # per-sample gamma**k from the device replay
        discount = discounts.float()
    else:
        n_step = batch.get("n_step")
        discount = gamma ** (n_step.float() if n_step is not None
                             else torch.ones_like(not_done))
    target = batch[Columns.REWARDS].float() + discount * not_done * q_next.mean(dim=-1)
    return q_selected, target.detach()


class BDQTorchLearner(DQNTorchLearner):
    """DQN learner with the branching (shared-target, per-branch error) loss.

    With ``config.td_errors_on_device`` (device replay or Ape-X, local learner,
    ``num_learners=0``) the per-sample priorities ``sum_d |delta_d|`` stay on the device
    in ``device_td_errors[module_id]`` (read by the device-replay training step and by
    Ape-X BDQ) instead of going through the metrics logger, which would copy them
    to the host.
    """

    def build(self) -> None:
        super().build()
        self.device_td_errors: dict[str, torch.Tensor] = {}

    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        """RLlib's default (Adam, lr from ``config.lr``), as one fused kernel per step.

        Stock ``TorchLearner`` builds ``torch.optim.Adam(params)``, which on CPU runs the
        per-tensor Python loop (a dozen small ops per parameter tensor); ``fused=True``
        computes the same update (float rounding aside) in one pass. Devices without a
        fused Adam keep the default.
        """
        params = self.get_parameters(self._module[module_id])
        fused = all(p.device.type in FUSED_ADAM_DEVICES and p.is_floating_point()
                    for p in params)
        self.register_optimizer(module_id=module_id,
                                optimizer=torch.optim.Adam(params, fused=fused or None),
                                params=params, lr_or_lr_schedule=config.lr)

    def apply_gradients(self, gradients_dict: dict[Any, torch.Tensor]) -> None:
        """``TorchLearner.apply_gradients`` with one finiteness check for all gradients.

        Stock RLlib tests ``isfinite(grad).all()`` per gradient tensor inside a Python
        ``if`` (a host sync each on an accelerator); here one ``_foreach_norm`` over all of
        them decides, and only a non-finite result takes the stock path (which zeroes the
        non-finite gradients with a warning), so the applied update is the same. LR
        schedulers, grad scalers and missing gradients take the stock path too.
        """
        grads = [g for g in gradients_dict.values() if g is not None]
        stock = (self._lr_scheduler_classes is not None or self._grad_scalers is not None
                 or len(grads) < len(gradients_dict))
        if stock or (grads and not self.config.torch_skip_nan_gradients and not bool(
                torch.isfinite(torch.stack(torch._foreach_norm(grads))).all())):
            return super().apply_gradients(gradients_dict)
        for pid, grad in gradients_dict.items():
            self._params[pid].grad = grad
        for module_id, optimizer_names in self._module_optimizers.items():
            for optimizer_name in optimizer_names:
                self.get_optimizer(module_id, optimizer_name).step()

    def compute_loss_for_module(self, *, module_id: str, config: DQNConfig,
                                batch: dict[str, Any],
                                fwd_out: dict[str, torch.Tensor]) -> torch.Tensor:
        if Columns.LOSS_MASK in batch:
            raise ValueError("BDQTorchLearner does not support stateful (sequence) modules")
        q_selected, target = bdq_td_errors(fwd_out, batch, config.gamma, config.double_q)
        target_b = target[:, None].expand_as(q_selected)
        loss_fn = nn.HuberLoss if config.td_error_loss_fn == "huber" else nn.MSELoss
        per_branch = loss_fn(reduction="none")(q_selected, target_b)
        weights = batch.get("weights")
        per_sample = per_branch.mean(dim=-1)
        if weights is not None:
            per_sample = weights.float() * per_sample
        total_loss = per_sample.mean()
        td_error = (target_b - q_selected).abs().sum(dim=-1).detach()
        if getattr(config, "td_errors_on_device", False):
            self.device_td_errors[module_id] = td_error
        else:
            self.metrics.log_value(key=(module_id, TD_ERROR_KEY), value=td_error,
                                   reduce="item_series")
            if REPLAY_INDICES in batch:  # remote learner: slots travel with their errors
                self.metrics.log_value(key=(module_id, REPLAY_INDICES),
                                       value=batch[REPLAY_INDICES], reduce="item_series")
        self.metrics.log_dict(
            {QF_LOSS_KEY: total_loss, QF_MEAN_KEY: q_selected.mean(),
             QF_MAX_KEY: q_selected.max(), QF_MIN_KEY: q_selected.min(),
             TD_ERROR_MEAN_KEY: td_error.mean()},
            key=module_id, window=1)
        return add_alignment_loss(self, module_id, config, total_loss)
