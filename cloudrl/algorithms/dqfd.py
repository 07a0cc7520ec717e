"""DQfD's large-margin loss (Hester et al. 2018) over the branches of a factored Q-function.

Behaviour cloning's branching loss and the anchored fine-tuning's pull towards the
demonstrations both use it.
"""

from __future__ import annotations

from typing import Any


def dqfd_margin_loss(q: Any, actions: Any, feasible: Any, margin: float) -> Any:
    """DQfD's large-margin loss per sample, averaged over branches: ``(B,)``.

    ``q`` ``(B, D, n)`` Q-values (padding anything), ``actions`` ``(B, D)`` the
    demonstrated sub-actions, ``feasible`` bool ``(B, D, n)``. Per branch
    ``max_{a feasible or a = a_E} [Q_d(s, a) + margin * (a != a_E)] - Q_d(s, a_E)``:
    masked sub-actions (and padding) never enter the max; the demonstrated one always
    does, so the loss is >= 0 and 0 exactly when a_E beats every other feasible
    sub-action by the margin.
    """
    import torch

    actions = actions.long()
    expert = torch.zeros_like(feasible).scatter_(-1, actions[..., None], True)
    allowed = feasible | expert
    bonus = margin * (~expert).to(q.dtype)
    best = (q + bonus).masked_fill(~allowed, float("-inf")).amax(dim=-1)
    q_expert = torch.gather(q, -1, actions[..., None]).squeeze(-1)
    return (best - q_expert).mean(dim=-1)
