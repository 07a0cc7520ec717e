"""Constrained fitted-Q RLModule (flat, masked): reward-Q, cost-Q and behaviour heads.

``ClusterEncoder`` (shared) -> ``qr`` head Q_r(s, a), ``qc`` head Q_c(s, a) and ``bc``
head (behaviour-cloned logits, BCQ's generative model), each over the flat action
space, plus target copies of the encoder and both Q heads. The Lagrange multiplier λ
and BCQ's support threshold τ live in the module as buffers (``lagrange``,
``support_threshold``; set by the learner, saved in checkpoints), so the module acts on
its own: the policy is the argmax of ``Q_r - λ·Q_c`` over the VALID actions whose
behaviour-cloned probability is at least τ times the most likely valid action's
(τ = 0: every valid action). ``compute_q_values`` returns those masked scores as
``qf_preds`` (what ``cloudrl.checkpoint_policy`` and the decision service read), and
``qr``/``qc``/``bc``.

``_forward_train`` returns the unmasked online Q and behaviour logits of the current
observations (the loss gathers the data action and takes CQL's logsumexp over the valid
ones), the online Q and behaviour logits of the next observations (to pick the next
action) and the target Q of the next observations.

``model_config``: ``encoder`` (``EncoderConfig`` fields), ``head_hiddens`` (default (128,)).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.utils import make_target_network
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI, QNetAPI, TargetNetworkAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.torch_utils import FLOAT_MIN
from torch import nn

from models.encoders import (
    ClusterEncoder,
    EncoderConfig,
    feasible_actions,
    head,
    model_config_dict,
)
from models.masked_ppo import flat_action_count

NEG_INF = float("-inf")

DEFAULT_HEAD_HIDDENS = (128,)
QF_PREDS = "qf_preds"  # masked Q_r - λ·Q_c (the policy's scores)
QR, QC, BC = "qr", "qc", "bc"  # online heads on the current observations (unmasked)
QR_NEXT, QC_NEXT, BC_NEXT = "qr_next", "qc_next", "bc_next"  # ... on the next observations
QR_TARGET_NEXT, QC_TARGET_NEXT = "qr_target_next", "qc_target_next"
NEXT_FEASIBLE, FEASIBLE = "next_feasible", "feasible"


def supported(bc_logits: torch.Tensor, feasible: torch.Tensor,
              threshold: torch.Tensor | float) -> torch.Tensor:
    """Valid actions with π_b(a|s) >= τ·max π_b(·|s) (τ <= 0: every valid action)."""
    tau = float(threshold)
    if tau <= 0:
        return feasible
    logp = torch.log_softmax(bc_logits.masked_fill(~feasible, NEG_INF), dim=-1)
    return feasible & (logp >= logp.max(dim=-1, keepdim=True).values + math.log(tau))


def policy_scores(qr: torch.Tensor, qc: torch.Tensor, lagrange: torch.Tensor | float,
                  feasible: torch.Tensor) -> torch.Tensor:
    """``Q_r - λ·Q_c`` with unsupported actions at ``FLOAT_MIN`` (argmax: the policy)."""
    return (qr - lagrange * qc).masked_fill(~feasible, FLOAT_MIN)


class CQLLagTorchRLModule(TorchRLModule, QNetAPI, TargetNetworkAPI, InferenceOnlyAPI):
    """Masked two-head Q-network with target copies and the multiplier λ."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["catalog_class"] = None  # no RLlib catalog reads the cluster Dict space
        super().__init__(*args, **kwargs)

    def setup(self) -> None:
        n_actions = self.output_size()
        cfg = model_config_dict(self.model_config)
        enc_cfg = EncoderConfig.from_model_config(cfg)
        hiddens = tuple(cfg.get("head_hiddens", DEFAULT_HEAD_HIDDENS))
        self.encoder = ClusterEncoder(self.observation_space, enc_cfg)
        self.qr_head = head(enc_cfg.hidden, hiddens, n_actions, enc_cfg.activation)
        self.qc_head = head(enc_cfg.hidden, hiddens, n_actions, enc_cfg.activation)
        self.bc_head = head(enc_cfg.hidden, hiddens, n_actions, enc_cfg.activation)
        self.register_buffer("lagrange", torch.zeros(()))
        self.register_buffer("support_threshold", torch.zeros(()))

    # -- the action layout (the branching subclass overrides these three) -------------
    def output_size(self) -> int:
        """Outputs of each head: one per flat action."""
        return flat_action_count(type(self).__name__, self.action_space)

    def shaped(self, out: torch.Tensor) -> torch.Tensor:
        """A head's output in the layout the losses take: (B, A) here."""
        return out

    def feasible(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Bool mask of the valid actions, the layout of :meth:`shaped`."""
        return feasible_actions(obs)

    # -- InferenceOnlyAPI / TargetNetworkAPI ------------------------------------------
    def get_non_inference_attributes(self) -> list[str]:
        return ["_target_encoder", "_target_qr", "_target_qc"]

    def make_target_networks(self) -> None:
        self._target_encoder = make_target_network(self.encoder)
        self._target_qr = make_target_network(self.qr_head)
        self._target_qc = make_target_network(self.qc_head)

    def get_target_network_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.encoder, self._target_encoder), (self.qr_head, self._target_qr),
                (self.qc_head, self._target_qc)]

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        with torch.no_grad():
            emb = self._target_encoder(batch[Columns.OBS])
            return {QR: self.shaped(self._target_qr(emb)), QC: self.shaped(self._target_qc(emb))}

    # -- heads --------------------------------------------------------------------------
    def heads(self, obs: dict[str, torch.Tensor]
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Unmasked online (Q_r, Q_c, behaviour logits), each (B, A)."""
        emb = self.encoder(obs)
        return (self.shaped(self.qr_head(emb)), self.shaped(self.qc_head(emb)),
                self.shaped(self.bc_head(emb)))

    def compute_q_values(self, batch: dict[str, Any]) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        qr, qc, bc = self.heads(obs)
        allowed = supported(bc, self.feasible(obs), self.support_threshold)
        return {QF_PREDS: policy_scores(qr, qc, self.lagrange, allowed),
                QR: qr, QC: qc, BC: bc}

    # -- forward passes ---------------------------------------------------------------
    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        with torch.no_grad():
            return {Columns.ACTIONS: self.compute_q_values(batch)[QF_PREDS].argmax(-1)}

    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward_inference(batch)  # offline: no exploration

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if self.inference_only:
            raise RuntimeError("forward_train on an inference-only CQLLagTorchRLModule")
        obs, next_obs = batch[Columns.OBS], batch[Columns.NEXT_OBS]
        both = {k: torch.cat([obs[k], next_obs[k]], dim=0) for k in obs}
        qr, qc, bc = self.heads(both)
        qr_curr, qr_next = torch.chunk(qr, 2, dim=0)
        qc_curr, qc_next = torch.chunk(qc, 2, dim=0)
        bc_curr, bc_next = torch.chunk(bc, 2, dim=0)
        target = self.forward_target({Columns.OBS: next_obs})
        return {QR: qr_curr, QC: qc_curr, BC: bc_curr, QR_NEXT: qr_next.detach(),
                QC_NEXT: qc_next.detach(), BC_NEXT: bc_next.detach(),
                QR_TARGET_NEXT: target[QR],
                QC_TARGET_NEXT: target[QC], FEASIBLE: self.feasible(obs),
                NEXT_FEASIBLE: self.feasible(next_obs)}
