"""The hierarchical supervisor's RLModule: an actor-critic MLP over the macro state.

``SupervisorPPOTorchRLModule`` reads the supervisor's observation of
``envs.hierarchical_env`` (the cluster's ``macro`` vector, a Box) and outputs
logits over the ``m`` sub-agents (``Discrete(m)``) and a state value, for RLlib's
PPO learner. ``model_config`` keys: ``hidden`` (width of the two hidden layers,
default 64) and ``hierarchy`` (a dict describing the sub-agents and ``k``; not read
by the network, kept so that a checkpoint of the module says what it supervises).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule

from models.encoders import head, model_config_dict


class SupervisorPPOTorchRLModule(TorchRLModule, ValueFunctionAPI):
    """Policy and value MLPs over the macro vector; one logit per sub-agent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["catalog_class"] = None  # builds its own networks
        super().__init__(*args, **kwargs)

    def setup(self) -> None:
        if not isinstance(self.action_space, gym.spaces.Discrete):
            raise ValueError(f"SupervisorPPOTorchRLModule needs a Discrete action space "
                             f"(one action per sub-agent), got {self.action_space}")
        if not isinstance(self.observation_space, gym.spaces.Box) \
                or len(self.observation_space.shape) != 1:
            raise ValueError(f"SupervisorPPOTorchRLModule needs a 1-D Box observation "
                             f"(the macro vector), got {self.observation_space}")
        cfg = model_config_dict(self.model_config)
        hidden = int(cfg.get("hidden", 64))
        n_in = int(self.observation_space.shape[0])
        self.pi = head(n_in, (hidden, hidden), int(self.action_space.n), "tanh", out_std=0.01)
        self.vf = head(n_in, (hidden, hidden), 1, "tanh", out_std=1.0)

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self.pi(batch[Columns.OBS].float())}

    def compute_values(self, batch: dict[str, Any], embeddings: Any | None = None
                       ) -> torch.Tensor:
        return self.vf(batch[Columns.OBS].float()).squeeze(-1)
