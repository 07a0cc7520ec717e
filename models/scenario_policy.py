"""A small MLP policy for the scenario env's branching action space, as an RLlib RLModule.

For a flat ``Box`` observation and a ``MultiDiscrete([n_1, ..., n_D])`` action space
(the scenario env: one branch for the release level, one for the ready margin):

* trunk: MLP over the observation (``hiddens``, default (128, 128), ReLU);
* one linear logits head per branch; ``_forward`` returns the branch logits concatenated
  as ``Columns.ACTION_DIST_INPUTS`` (shape ``(B, sum(n_d))``), the layout of RLlib's
  ``TorchMultiCategorical`` (the action distribution of all three passes);
* :meth:`greedy` gives the per-branch argmax as an int64 ``(B, D)`` action, the
  deterministic action a deployed policy plays.

It is trained by imitation (cross-entropy per branch against an expert's action), so it
has no value head; ``model_config``: ``hiddens`` (tuple of widths). Imports nothing from
``cloudrl``.

:class:`ReleaseCappedPolicyModule` is the same policy with a fixed anchor network beside
it whose release level its greedy action never passes (a one-sided trust region around a
behaviour clone), everywhere or, with a gate, only in the states where one observation
column is above a threshold.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchMultiCategorical
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch import nn

from models.encoders import model_config_dict

DEFAULT_HIDDENS = (128, 128)


class ScenarioPolicyModule(TorchRLModule):
    """MLP trunk + one logits head per action branch; see the module docstring."""

    def setup(self) -> None:
        obs, act = self.observation_space, self.action_space
        if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
            raise ValueError(f"ScenarioPolicyModule needs a flat Box observation, got {obs}")
        if not isinstance(act, gym.spaces.MultiDiscrete) or act.nvec.ndim != 1:
            raise ValueError(f"ScenarioPolicyModule needs a 1-D MultiDiscrete action space, "
                             f"got {act}")
        cfg = model_config_dict(self.model_config)
        hiddens: Sequence[int] = tuple(int(h) for h in cfg.get("hiddens", DEFAULT_HIDDENS))
        self.branch_sizes = [int(n) for n in act.nvec]
        layers: list[nn.Module] = []
        width = int(obs.shape[0])
        for h in hiddens:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.logits = nn.Linear(width, sum(self.branch_sizes))
        nn.init.orthogonal_(self.logits.weight, gain=0.01)
        nn.init.zeros_(self.logits.bias)

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        obs = torch.as_tensor(batch[Columns.OBS], dtype=torch.float32)
        return {Columns.ACTION_DIST_INPUTS: self.logits(self.trunk(obs))}

    def branch_logits(self, obs: torch.Tensor) -> list[torch.Tensor]:
        """The logits of each branch, ``[(B, n_1), ..., (B, n_D)]``."""
        out = self._forward({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        return list(torch.split(out, self.branch_sizes, dim=-1))

    @torch.no_grad()
    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The per-branch argmax action, int64 ``(B, D)``."""
        return torch.stack([lg.argmax(-1) for lg in self.branch_logits(obs)], dim=-1)

    def _dist_cls(self):
        return TorchMultiCategorical.get_partial_dist_cls(input_lens=self.branch_sizes)

    def get_inference_action_dist_cls(self):
        return self._dist_cls()

    def get_exploration_action_dist_cls(self):
        return self._dist_cls()

    def get_train_action_dist_cls(self):
        return self._dist_cls()


class ReleaseCappedPolicyModule(ScenarioPolicyModule):
    """A :class:`ScenarioPolicyModule` whose release level never passes a fixed anchor's.

    Two networks of the same shape: the policy's own (``trunk``, ``logits``) and an anchor
    (``anchor_trunk``, ``anchor_logits``; for example the behaviour clone a search started
    from). :meth:`greedy` plays the policy's ready margin and the lower of the two release
    levels (branch 0's levels rise with the index), so the policy may hold batch work back
    where the anchor would release it, never release more. :meth:`searched_parameters`
    are the policy's own weights, the only ones a search should move; ``_forward`` (the
    logits) is the policy's own, uncapped.

    ``model_config["cap_gate"]`` (optional, ``{"column": int, "above": float}``): the cap
    holds only where observation column ``column`` is above ``above``; elsewhere the
    policy plays its own release level. Without it the cap holds everywhere."""

    def setup(self) -> None:
        super().setup()
        self.anchor_trunk = copy.deepcopy(self.trunk)
        self.anchor_logits = copy.deepcopy(self.logits)
        gate = model_config_dict(self.model_config).get("cap_gate")
        self.cap_gate: tuple[int, float] | None = None
        if gate is not None:
            column, above = int(gate["column"]), float(gate["above"])
            if not 0 <= column < int(self.observation_space.shape[0]):
                raise ValueError(f"cap_gate column {column} outside the observation's "
                                 f"{self.observation_space.shape[0]} columns")
            self.cap_gate = (column, above)

    def searched_parameters(self) -> list[nn.Parameter]:
        """The policy's own weights (the trunk and logits), not the anchor's."""
        return [*self.trunk.parameters(), *self.logits.parameters()]

    def set_anchor(self, module: ScenarioPolicyModule) -> None:
        """Copy ``module``'s weights (same shapes) into the anchor."""
        self.anchor_trunk.load_state_dict(module.trunk.state_dict())
        self.anchor_logits.load_state_dict(module.logits.state_dict())

    def capped_rows(self, obs: torch.Tensor) -> torch.Tensor:
        """Bool ``(B,)``: the observations where the cap holds."""
        if self.cap_gate is None:
            return torch.ones(obs.shape[0], dtype=torch.bool, device=obs.device)
        column, above = self.cap_gate
        return obs[:, column] > above

    @torch.no_grad()
    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        own = super().greedy(obs)
        anchor = self.anchor_logits(self.anchor_trunk(obs))[:, :self.branch_sizes[0]]
        capped = torch.minimum(own[:, 0], anchor.argmax(-1))
        own[:, 0] = torch.where(self.capped_rows(obs), capped, own[:, 0])
        return own
