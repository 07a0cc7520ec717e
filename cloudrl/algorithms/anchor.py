"""Anchors to the phase-1 (behaviour-cloned) policy for phase 3 of preference alignment.

Optimising against a learned reward drifts towards states the reward model never saw
(reward hacking); an anchor to the phase-1 policy keeps the policy near the
demonstrations. Two kinds, added to the algorithm's own loss by learner subclasses:

* PPO / APPO: ``anchor_coeff * KL(pi_bc || pi)`` on the batch's observations, averaged
  over the valid (loss-masked) steps. ``pi_bc`` is the phase-1 RLModule
  (``cloudrl align bc --out``, loaded with ``RLModule.from_checkpoint``), frozen and kept
  on the learner (not part of the trained module, so checkpoints stay plain); both
  distributions are the masked ones (infeasible actions have probability 0 in both);
* BDQ: DQfD's large-margin loss (Hester et al. 2018) on a minibatch of demonstrations
  (``cloudrl.algorithms.dqfd.dqfd_margin_loss``: per branch
  ``max_a [Q_d(s, a) + l(a_E, a)] - Q_d(s, a_E)``), ``anchor_coeff`` times its mean.

Settings live in ``config.learner_config_dict["anchor"]`` (:class:`AnchorSettings`:
``coeff``, ``module``, ``demos``, ``batch``, ``margin``, ``seed``), so the stock configs
need no new ``training()`` arguments; :func:`cloudrl.alignment.phase3.configure_phase3`
fills them. ``coeff == 0`` is the plain algorithm, bit for bit: nothing is loaded,
sampled or computed and the loss is returned untouched. The learner class of each
algorithm is its row's ``anchored_learner`` in :mod:`cloudrl.algorithms.specs`.
Logged per module: ``anchor/kl`` or ``anchor/margin_loss``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
from ray.rllib.core.columns import Columns

from cloudrl.algorithms.bdq.bdq_learner import BDQTorchLearner
from cloudrl.algorithms.masked_ppo import MaskedPPOTorchLearner

ANCHOR = "anchor"
KL_KEY = "anchor/kl"
MARGIN_KEY = "anchor/margin_loss"


@dataclass(frozen=True)
class AnchorSettings:
    """``learner_config_dict["anchor"]``: weight and what to anchor to."""

    coeff: float = 0.0
    module: str | None = None  # phase-1 RLModule state dir (PPO/APPO KL reference)
    demos: str | None = None  # recorded demonstrations (BDQ margin loss)
    batch: int = 64
    margin: float = 0.8
    seed: int = 0

    @property
    def active(self) -> bool:
        return self.coeff > 0.0


def anchor_settings(config: Any) -> AnchorSettings:
    """The settings on an algorithm config (defaults: coefficient 0, off)."""
    raw = dict((getattr(config, "learner_config_dict", None) or {}).get(ANCHOR) or {})
    return AnchorSettings(**raw)


def masked_kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(ref) || softmax(logits)) per row; actions the reference gives probability
    0 (masked) contribute 0."""
    ref_logp = torch.log_softmax(ref_logits.float(), dim=-1)
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = ref_logp.exp()
    return torch.where(p > 0, p * (ref_logp - logp), torch.zeros_like(p)).sum(-1)


class PolicyAnchorMixin:
    """``+ coeff * KL(pi_bc || pi)`` for learners whose ``fwd_out`` carries policy logits."""

    def _anchor_reference(self, settings: AnchorSettings) -> Any:
        ref = self.__dict__.get("_anchor_ref")
        if ref is None:
            from ray.rllib.core.rl_module.rl_module import RLModule

            if not settings.module:
                raise ValueError("anchor coeff > 0 needs anchor module (a saved phase-1 "
                                 "RLModule state, cloudrl align bc --out)")
            ref = RLModule.from_checkpoint(settings.module).to(self._device)
            ref.eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            self._anchor_ref = ref
        return ref

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict[str, Any],
                                fwd_out: dict[str, Any]) -> Any:
        loss = super().compute_loss_for_module(module_id=module_id, config=config,
                                               batch=batch, fwd_out=fwd_out)
        settings = anchor_settings(config)
        if not settings.active:
            return loss
        ref = self._anchor_reference(settings)
        with torch.no_grad():
            ref_logits = ref.forward_inference({Columns.OBS: batch[Columns.OBS]})[
                Columns.ACTION_DIST_INPUTS]
        kl = masked_kl(ref_logits, fwd_out[Columns.ACTION_DIST_INPUTS])
        mask = batch.get(Columns.LOSS_MASK)
        if mask is not None:
            mask = mask.reshape(kl.shape).float()
            kl_mean = (kl * mask).sum() / mask.sum().clamp(min=1.0)
        else:
            kl_mean = kl.mean()
        self.metrics.log_value((module_id, KL_KEY), kl_mean.detach(), window=1)
        return loss + settings.coeff * kl_mean


class MarginAnchorMixin:
    """``+ coeff * mean DQfD margin loss`` on demonstrations (branching Q-learners)."""

    def _anchor_demos(self, settings: AnchorSettings) -> dict[str, Any]:
        demos = self.__dict__.get("_anchor_demo_tensors")
        if demos is None:
            from cloudrl.data.demonstrations import load_demonstrations

            if not settings.demos:
                raise ValueError("anchor coeff > 0 needs anchor demos (recorded episodes, "
                                 "cloudrl align record --out)")
            d = load_demonstrations(settings.demos, "branching")
            demos = {"obs": {k: torch.as_tensor(v, device=self._device)
                             for k, v in d.obs.items()},
                     "actions": torch.as_tensor(d.actions, device=self._device),
                     "rng": np.random.default_rng(settings.seed)}
            self._anchor_demo_tensors = demos
        return demos

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict[str, Any],
                                fwd_out: dict[str, Any]) -> Any:
        from cloudrl.algorithms.dqfd import dqfd_margin_loss

        loss = super().compute_loss_for_module(module_id=module_id, config=config,
                                               batch=batch, fwd_out=fwd_out)
        settings = anchor_settings(config)
        if not settings.active:
            return loss
        demos = self._anchor_demos(settings)
        n = int(demos["actions"].shape[0])
        idx = torch.as_tensor(demos["rng"].choice(n, size=settings.batch,
                                                  replace=settings.batch > n),
                              device=demos["actions"].device)
        obs = {k: v[idx] for k, v in demos["obs"].items()}
        module = self.module[module_id].unwrapped()
        feasible = module.feasibility(obs)
        q = module.q_from_representation(module.trunk(obs), feasible)
        margin = dqfd_margin_loss(q, demos["actions"][idx], feasible, settings.margin).mean()
        self.metrics.log_value((module_id, MARGIN_KEY), margin.detach(), window=1)
        return loss + settings.coeff * margin


class AnchoredPPOTorchLearner(PolicyAnchorMixin, MaskedPPOTorchLearner):
    """Masked PPO's learner plus the KL anchor."""


class AnchoredAPPOTorchLearner(PolicyAnchorMixin, APPOTorchLearner):
    """RLlib's APPO learner plus the KL anchor."""


class AnchoredBDQTorchLearner(MarginAnchorMixin, BDQTorchLearner):
    """BDQ's learner plus the DQfD margin anchor on demonstrations."""
