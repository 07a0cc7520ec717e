"""``CQLLagTorchLearner``: the constrained fitted-Q update and the multiplier's update.

Each update: the losses of :mod:`.losses` on the batch (TD on both heads, CQL on the
reward head, optionally on the cost head, BC of the behaviour head whose support
filters the policy's actions, optionally the upward cost penalty), one optimizer step
on their sum, then one
step of the :class:`~.lagrange.LagrangeController` on the batch's cost estimate against
the per-step threshold (λ frozen for the first ``lagrange_warmup`` updates); the new λ is
written into the module's ``lagrange`` buffer (the policy the checkpoint serves). Target
networks are Polyak-averaged, θ' ← τθ + (1-τ)θ' (``tau``, 0.05 by default), every
``target_network_update_freq`` updates (1 by default; ``tau`` = 1 is a hard copy).
Logged per update: every loss term, ``lagrange``, ``cost_estimate``, ``cost_threshold``,
mean Q of the data actions, ``supported_actions`` (mean count per state). The module's
``support_threshold`` buffer is set from the config at build, so checkpoints act with
the τ they were trained with.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.learner.utils import update_target_network
from ray.rllib.core.rl_module.apis import QNetAPI, TargetNetworkAPI

from cloudrl.algorithms.cql_lag.connectors import COSTS, EPISODE_COSTS, SUPPORT_EPISODES
from cloudrl.algorithms.cql_lag.lagrange import LagrangeController
from cloudrl.algorithms.cql_lag.losses import constrained_q_losses
from models import cql_lag as M


def update_targets(pairs: Any, updates: int, freq: int, tau: float) -> bool:
    """θ' ← τθ + (1-τ)θ' for each (main, target) pair when ``updates`` is a multiple of
    ``freq``; returns whether it did."""
    if updates % freq:
        return False
    for main, target in pairs:
        update_target_network(main_net=main, target_net=target, tau=tau)
    return True


def safe_steps(batch: dict[str, Any], config: Any) -> Any:
    """The BC head's samples: steps of episodes whose cost is within the budget when
    ``support_data`` is "safe" (and the batch has episode costs), else None (all); a
    batch without any such step falls back to all (no safe episode in the data). With
    ``support_top`` < 1, the steps of the episodes the data loader marked (the top share
    by return of those episodes, ``LocalEpisodeData``)."""
    if getattr(config, "support_top", 1.0) < 1 and SUPPORT_EPISODES in batch:
        mask = batch[SUPPORT_EPISODES] > 0.5
        return mask if bool(mask.any()) else None
    if config.support_data != "safe" or EPISODE_COSTS not in batch:
        return None
    mask = batch[EPISODE_COSTS] <= float(config.cost_budget) + 1e-6
    return mask if bool(mask.any()) else None


class CQLLagTorchLearner(TorchLearner):
    """Discrete CQL + cost critic + Lagrangian on one (flat, masked) module."""

    def build(self) -> None:
        super().build()
        self.controllers: dict[str, LagrangeController] = {}
        self.updates = 0
        for module_id, module in self.module._rl_modules.items():
            module.unwrapped().make_target_networks()
            cfg = self.config.get_config_for_module(module_id)
            ctl = cfg.lagrange_controller()
            lam = float(module.unwrapped().lagrange)
            if lam > 0:  # resumed from a checkpoint: go on from its λ
                ctl.set_value(lam)
            else:
                module.unwrapped().lagrange.fill_(ctl.value)
            module.unwrapped().support_threshold.fill_(float(cfg.support_threshold))
            self.controllers[module_id] = ctl

    @classmethod
    def rl_module_required_apis(cls) -> list[type]:
        return [QNetAPI, TargetNetworkAPI]

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict[str, Any],
                                fwd_out: dict[str, Any]) -> Any:
        module = self.module[module_id].unwrapped()
        ctl = self.controllers[module_id]
        lam = float(ctl.value)
        terms = constrained_q_losses(
            qr=fwd_out[M.QR], qc=fwd_out[M.QC], qr_next=fwd_out[M.QR_NEXT],
            qc_next=fwd_out[M.QC_NEXT], qr_target_next=fwd_out[M.QR_TARGET_NEXT],
            qc_target_next=fwd_out[M.QC_TARGET_NEXT], feasible=fwd_out[M.FEASIBLE],
            next_feasible=fwd_out[M.NEXT_FEASIBLE], actions=batch[Columns.ACTIONS],
            rewards=batch[Columns.REWARDS], costs=batch[COSTS],
            terminateds=batch[Columns.TERMINATEDS], lagrange=lam, gamma=config.gamma,
            cql_alpha=config.cql_alpha, cql_cost_alpha=config.cql_cost_alpha,
            reward_scale=config.reward_scale, cost_scale=config.cost_scale,
            bc_logits=fwd_out[M.BC], next_bc_logits=fwd_out[M.BC_NEXT],
            support_threshold=config.support_threshold, bc_weight=config.bc_weight,
            cost_upper_alpha=config.cost_upper_alpha,
            bc_mask=safe_steps(batch, config))
        threshold = config.cost_threshold()
        new_lam = ctl.update(float(terms.cost_estimate), threshold)
        module.lagrange.fill_(new_lam)
        self.metrics.log_dict({
            "loss": terms.total.item(), "td_reward": terms.td_reward.item(),
            "td_cost": terms.td_cost.item(), "cql_reward": terms.cql_reward.item(),
            "cql_cost": terms.cql_cost.item(), "cost_estimate": terms.cost_estimate.item(),
            "cost_threshold": threshold, "lagrange": new_lam,
            "q_reward": terms.q_reward.item(), "q_cost": terms.q_cost.item(),
            "bc": terms.bc.item(), "cost_upper": terms.cost_upper.item(),
            "supported_actions": terms.supported.item(),
        }, key=module_id, window=1)
        return terms.total

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        self.updates += 1
        for module_id, module in self.module._rl_modules.items():
            cfg = self.config.get_config_for_module(module_id)
            update_targets(module.unwrapped().get_target_network_pairs(), self.updates,
                           cfg.target_network_update_freq, cfg.tau)
