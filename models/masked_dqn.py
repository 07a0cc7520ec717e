"""Masked (Double) DQN RLModule for the flat env, for RLlib's stock DQN learner.

``ClusterEncoder`` -> Q head (optionally dueling: V + A - mean of A over feasible
actions). Infeasible actions get Q = ``FLOAT_MIN`` in ``compute_q_values`` and
``forward_target``, so:

* inference is the argmax over feasible actions;
* epsilon-greedy draws its random action uniformly among feasible actions only;
* the bootstrap target is mask-correct with RLlib's ``DQNTorchLearner`` unchanged:
  ``_forward_train`` returns the online next-state Q (``qf_next_preds``) and the
  target next-state Q (``qf_target_next_preds``) both masked by the NEXT
  observation's mask, so double-Q takes the online argmax over feasible next
  actions and reads the target net there (plain DQN: max of the masked target).

``qf_preds`` of the current state stay unmasked in ``_forward_train``: the loss
gathers them at the replayed action, which must give a finite value even for an
action that was infeasible (e.g. replayed from another behaviour policy).

``model_config``: ``encoder`` (``EncoderConfig`` fields), ``head_hiddens`` (default
(128,)); from DQNConfig: ``double_q``, ``dueling``, ``epsilon`` (constant or
``[(t, eps), ...]`` schedule), ``num_atoms`` (must be 1: no distributional Q).
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.dqn.dqn_learner import (
    QF_NEXT_PREDS,
    QF_PREDS,
    QF_TARGET_NEXT_PREDS,
)
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.utils import make_target_network
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI, QNetAPI, TargetNetworkAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.schedules.scheduler import Scheduler
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

DEFAULT_HEAD_HIDDENS = (128,)
DEFAULT_EPSILON = [(0, 1.0), (10000, 0.05)]  # DQNConfig's default schedule


def mask_q_values(q: torch.Tensor, feasible: torch.Tensor) -> torch.Tensor:
    """Q with infeasible actions set to ``FLOAT_MIN`` (never an argmax while one is feasible)."""
    return q.masked_fill(~feasible, FLOAT_MIN)


class MaskedDQNTorchRLModule(TorchRLModule, QNetAPI, TargetNetworkAPI, InferenceOnlyAPI):
    """Action-masked Q-network with a target copy; works with ``DQNConfig`` (new API stack)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # DQNCatalog cannot read this Dict space; the module builds its own networks.
        kwargs["catalog_class"] = None
        super().__init__(*args, **kwargs)

    def setup(self) -> None:
        n_actions = flat_action_count(type(self).__name__, self.action_space)
        cfg = model_config_dict(self.model_config)
        if int(cfg.get("num_atoms", 1)) > 1:
            raise ValueError("MaskedDQNTorchRLModule supports num_atoms=1 only (expected Q)")
        enc_cfg = EncoderConfig.from_model_config(cfg)
        head_hiddens = tuple(cfg.get("head_hiddens", DEFAULT_HEAD_HIDDENS))
        self.uses_dueling = bool(cfg.get("dueling", False))
        self.uses_double_q = bool(cfg.get("double_q", True))
        self.epsilon_schedule = Scheduler(
            fixed_value_or_schedule=cfg.get("epsilon", DEFAULT_EPSILON), framework="torch")
        self.encoder = ClusterEncoder(self.observation_space, enc_cfg)
        self.af = head(enc_cfg.hidden, head_hiddens, n_actions, enc_cfg.activation)
        self.vf = (head(enc_cfg.hidden, head_hiddens, 1, enc_cfg.activation)
                   if self.uses_dueling else None)

    # -- InferenceOnlyAPI / TargetNetworkAPI ------------------------------------------
    def get_non_inference_attributes(self) -> list[str]:
        return ["_target_encoder", "_target_af", "_target_vf"]

    def make_target_networks(self) -> None:
        self._target_encoder = make_target_network(self.encoder)
        self._target_af = make_target_network(self.af)
        self._target_vf = make_target_network(self.vf) if self.vf is not None else None

    def get_target_network_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        pairs = [(self.encoder, self._target_encoder), (self.af, self._target_af)]
        if self.vf is not None:
            pairs.append((self.vf, self._target_vf))
        return pairs

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Masked target-network Q-values ``{"qf_preds": (B, A)}``."""
        obs = batch[Columns.OBS]
        feasible = feasible_actions(obs)
        with torch.no_grad():
            q = self._q(obs, feasible, self._target_encoder, self._target_af, self._target_vf)
        return {QF_PREDS: mask_q_values(q, feasible)}

    # -- QNetAPI ------------------------------------------------------------------------
    def compute_q_values(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Masked online Q-values ``{"qf_preds": (B, A)}``."""
        obs = batch[Columns.OBS]
        feasible = feasible_actions(obs)
        return {QF_PREDS: mask_q_values(self._q(obs, feasible), feasible)}

    def _q(self, obs: dict[str, torch.Tensor], feasible: torch.Tensor,
           encoder: nn.Module | None = None, af: nn.Module | None = None,
           vf: nn.Module | None = None) -> torch.Tensor:
        """Unmasked Q (B, A) of the online net, or of the given (target) nets."""
        encoder = self.encoder if encoder is None else encoder
        af = self.af if af is None else af
        vf = self.vf if vf is None else vf
        embeddings = encoder(obs)
        adv = af(embeddings)
        if not self.uses_dueling:
            return adv
        value = vf(embeddings)
        weights = feasible.to(adv.dtype)
        adv_mean = (adv * weights).sum(-1, keepdim=True) / weights.sum(-1, keepdim=True)
        return value + adv - adv_mean

    # -- forward passes ---------------------------------------------------------------
    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        with torch.no_grad():
            q = self.compute_q_values(batch)[QF_PREDS]
        return {Columns.ACTIONS: q.argmax(dim=-1)}

    def _forward_exploration(self, batch: dict[str, Any], t: int | None = None,
                             **kwargs: Any) -> dict[str, Any]:
        """Epsilon-greedy; the random branch is uniform over feasible actions only."""
        with torch.no_grad():
            obs = batch[Columns.OBS]
            feasible = feasible_actions(obs)
            greedy = mask_q_values(self._q(obs, feasible), feasible).argmax(dim=-1)
            if t is not None:
                self.epsilon_schedule.update(t)
            epsilon = self.epsilon_schedule.get_current_value()
            flat = feasible.reshape(-1, feasible.shape[-1]).to(torch.float32)
            random = torch.multinomial(flat, num_samples=1).reshape(greedy.shape)
            explore = torch.rand(greedy.shape, device=greedy.device) < epsilon
            return {Columns.ACTIONS: torch.where(explore, random, greedy)}

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if self.inference_only:
            raise RuntimeError("forward_train on an inference-only MaskedDQNTorchRLModule")
        obs, next_obs = batch[Columns.OBS], batch[Columns.NEXT_OBS]
        feasible = feasible_actions(obs)
        next_feasible = feasible_actions(next_obs)
        out: dict[str, Any] = {}
        if self.uses_double_q:
            both = {k: torch.cat([obs[k], next_obs[k]], dim=0) for k in obs}
            q_both = self._q(both, torch.cat([feasible, next_feasible], dim=0))
            q_curr, q_next = torch.chunk(q_both, 2, dim=0)
            out[QF_NEXT_PREDS] = mask_q_values(q_next, next_feasible)
        else:
            q_curr = self._q(obs, feasible)
        out[QF_PREDS] = q_curr
        out[QF_TARGET_NEXT_PREDS] = self.forward_target({Columns.OBS: next_obs})[QF_PREDS]
        return out
