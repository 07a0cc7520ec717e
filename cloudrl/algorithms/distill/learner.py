"""Fit a :class:`models.scenario_policy.ScenarioPolicyModule` to expert actions.

A plain torch loop (RLlib's offline ``BCLearner`` would need the data as an RLlib
offline dataset and a Ray Data pipeline, which costs more than the whole fit at a few
thousand rows on a 2-core machine): minibatch Adam on the sum over action branches of
the cross-entropy between the module's branch logits and the expert's sub-action.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from models.scenario_policy import ScenarioPolicyModule


def imitation_loss(module: ScenarioPolicyModule, obs: torch.Tensor,
                   actions: torch.Tensor) -> torch.Tensor:
    """Mean over rows of the summed per-branch cross-entropy."""
    logits = module.branch_logits(obs)
    return sum(F.cross_entropy(lg, actions[:, d]) for d, lg in enumerate(logits))


def evaluate_loss(module: ScenarioPolicyModule, obs: np.ndarray, actions: np.ndarray
                  ) -> float:
    with torch.no_grad():
        return float(imitation_loss(module, torch.as_tensor(obs),
                                    torch.as_tensor(actions, dtype=torch.int64)))


def fit(module: ScenarioPolicyModule, obs: np.ndarray, actions: np.ndarray, epochs: int,
        batch_size: int, lr: float, weight_decay: float, seed: int,
        optimizer: torch.optim.Optimizer | None = None) -> torch.optim.Optimizer:
    """``epochs`` passes of minibatch Adam; returns the optimizer (to continue with it)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.as_tensor(obs, dtype=torch.float32)
    y = torch.as_tensor(actions, dtype=torch.int64)
    opt = optimizer or torch.optim.Adam(module.parameters(), lr=lr, weight_decay=weight_decay)
    module.train()
    n = len(x)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for k in range(0, n, batch_size):
            idx = perm[k:k + batch_size]
            loss = imitation_loss(module, x[idx], y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    module.eval()
    return opt
