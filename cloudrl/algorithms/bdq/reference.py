"""The BDQ learner as it was before the learner speed work, kept as a reference.

``ReferenceBDQConfig`` builds ``ReferenceBDQModule`` + ``ReferenceBDQLearner``: the same
parameters (names, shapes, initialisation, so state dicts load both ways) and the same
loss as ``BDQConfig``, computed the old way:

* every MLP with out-of-place ReLU (``models.encoders.mlp`` now applies it in place);
* trunk: ``ClusterEncoder`` layer by layer, the online network run WITH gradients on
  ``cat(obs, next_obs)`` (2B rows), although only the first B rows get a gradient;
* heads: one ``nn.Sequential`` call per branch, padded and stacked in a Python loop;
* per-branch feasibility built in a Python loop over branches;
* learner: RLlib's default single-tensor ``torch.optim.Adam`` and
  ``TorchLearner.apply_gradients`` (an ``isfinite`` check per gradient tensor).

Used by ``experiments/benchmarks/bench_learner.py`` (old vs new in one run) and by
``tests/test_learner_speed.py`` (same loss and gradients on fixed inputs). Not for
training.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.dqn.dqn_learner import QF_NEXT_PREDS, QF_PREDS, QF_TARGET_NEXT_PREDS
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from torch import nn

from cloudrl.algorithms.bdq.bdq import BDQConfig
from cloudrl.algorithms.bdq.bdq_learner import BDQTorchLearner
from models.alignment_head import scale_grad
from models.bdq import REPRESENTATION, BDQTorchRLModule
from models.encoders import MASK_KEY, ClusterEncoder


def reference_branch_feasibility(mask: torch.Tensor | None, sizes: list[int], batch: int,
                                 device: torch.device) -> torch.Tensor:
    """Bool ``(B, D, max_n)``, built branch by branch (the old ``branch_feasibility``)."""
    max_n = max(sizes)
    valid = torch.zeros(len(sizes), max_n, dtype=torch.bool, device=device)
    for d, n in enumerate(sizes):
        valid[d, :n] = True
    if mask is None:
        return valid.expand(batch, -1, -1).clone()
    parts = torch.split(mask > 0.5, sizes, dim=-1)
    feasible = torch.zeros(batch, len(sizes), max_n, dtype=torch.bool, device=device)
    for d, part in enumerate(parts):
        feasible[:, d, : sizes[d]] = part
    return feasible | (valid & ~feasible.any(dim=-1, keepdim=True))


def reference_seq(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``net(x)`` with every ReLU out of place (the old ``models.encoders.mlp``)."""
    for layer in net:
        x = torch.relu(x) if isinstance(layer, nn.ReLU) else layer(x)
    return x


def reference_encode(encoder: ClusterEncoder, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The old ``ClusterEncoder.forward``: three MLPs, mean|max pooling, fusion MLP."""
    servers = reference_seq(encoder.server_net, obs["servers"].float())
    jobs = reference_seq(encoder.job_net, obs["jobs"].float())
    macro = reference_seq(encoder.macro_net, obs["macro"].float())
    fused = torch.cat([macro, servers.mean(-2), servers.amax(-2), jobs.mean(-2),
                       jobs.amax(-2)], dim=-1)
    return reference_seq(encoder.fusion, fused)


def reference_trunk(trunk: nn.Sequential, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Encoder then trunk MLP, the old way."""
    return reference_seq(trunk[1], reference_encode(trunk[0], obs))


class ReferenceBDQModule(BDQTorchRLModule):
    """``BDQTorchRLModule`` with the original (pre-speed-work) forward passes (same parameters)."""

    def representation(self, batch: dict[str, Any]) -> torch.Tensor:
        return reference_trunk(self.trunk, batch[Columns.OBS])

    def feasibility(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = obs.get(MASK_KEY) if isinstance(obs, dict) else None
        ref = mask if mask is not None else next(iter(obs.values()))
        return reference_branch_feasibility(mask, self.branch_sizes, ref.shape[0], ref.device)

    def q_from_representation(self, rep: torch.Tensor, feasible: torch.Tensor,
                              value_head: nn.Module | None = None,
                              advantage_heads: nn.ModuleList | None = None) -> torch.Tensor:
        value_head = self.value_head if value_head is None else value_head
        advantage_heads = self.advantage_heads if advantage_heads is None else advantage_heads
        max_n = feasible.shape[-1]
        adv = torch.stack([nn.functional.pad(reference_seq(h, rep), (0, max_n - n))
                           for h, n in zip(advantage_heads, self.branch_sizes, strict=True)],
                          dim=1)
        weights = feasible.to(adv.dtype)
        adv_mean = (adv * weights).sum(-1, keepdim=True) / weights.sum(-1, keepdim=True)
        sizes = torch.as_tensor(self.branch_sizes, device=feasible.device)
        valid = (torch.arange(max_n, device=feasible.device) < sizes[:, None]).to(torch.float32)
        return (reference_seq(value_head, rep)[:, :, None] + adv - adv_mean) * valid

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        feasible = self.feasibility(obs)
        with torch.no_grad():
            q = self.q_from_representation(reference_trunk(self._target_trunk, obs), feasible,
                                           self._target_value_head, self._target_advantage_heads)
        return {QF_PREDS: self.mask_q(q, feasible)}

    def compute_q_values(self, batch: dict[str, Any]) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        feasible = self.feasibility(obs)
        rep = reference_trunk(self.trunk, obs)
        return {QF_PREDS: self.mask_q(self.q_from_representation(rep, feasible), feasible)}

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        obs, next_obs = batch[Columns.OBS], batch[Columns.NEXT_OBS]
        feasible, next_feasible = self.feasibility(obs), self.feasibility(next_obs)
        b = feasible.shape[0]
        if self.uses_double_q:
            both = {k: torch.cat([obs[k], next_obs[k]], dim=0) for k in obs}
            rep_both = reference_trunk(self.trunk, both)
            rep, rep_next = rep_both[:b], rep_both[b:]
        else:
            rep, rep_next = reference_trunk(self.trunk, obs), None
        out: dict[str, Any] = {REPRESENTATION: rep}
        if self.scale_trunk_grad and rep.requires_grad:
            rep = scale_grad(rep, 1.0 / (self.num_branches + 1))
            if rep_next is not None:
                rep_next = scale_grad(rep_next, 1.0 / (self.num_branches + 1))
        out[QF_PREDS] = self.q_from_representation(rep, feasible)
        if rep_next is not None:
            out[QF_NEXT_PREDS] = self.mask_q(self.q_from_representation(rep_next, next_feasible),
                                             next_feasible)
        out[QF_TARGET_NEXT_PREDS] = self.forward_target({Columns.OBS: next_obs})[QF_PREDS]
        return out


class ReferenceBDQLearner(BDQTorchLearner):
    """``BDQTorchLearner`` with RLlib's default optimizer and gradient application."""

    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        TorchLearner.configure_optimizers_for_module(self, module_id, config)

    def apply_gradients(self, gradients_dict: Any) -> None:
        TorchLearner.apply_gradients(self, gradients_dict)


class ReferenceBDQConfig(BDQConfig):
    """``BDQConfig`` building the reference module and learner."""

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=ReferenceBDQModule, model_config=self.model_config)

    def get_default_learner_class(self) -> type[ReferenceBDQLearner]:
        return ReferenceBDQLearner
