"""Constrained fitted-Q RLModule on the branching interface (``MultiDiscrete`` actions).

The heads of :class:`models.cql_lag.CQLLagTorchRLModule` (reward-Q, cost-Q, behaviour
logits, target copies, λ and τ as buffers), each laid out per branch as BDQ does:
``(B, D, max_n)`` for D branches (queue slots, tiers, priority), the entries past a
branch's size padding and never feasible. The policy takes, per branch, the argmax of
``Q_r - λ·Q_c`` over that branch's valid sub-actions whose behaviour-cloned probability
(softmax over the branch) is at least τ times the branch's most likely one.
``compute_q_values`` returns those scores as ``qf_preds`` (B, D, max_n), the layout
``cloudrl.checkpoint_policy`` reads for BDQ checkpoints, so evaluation and serving take
it unchanged. The losses (``cloudrl.algorithms.cql_lag.losses``) take the same layout.
"""

from __future__ import annotations

import torch

from models.bdq import branch_feasibility, branch_sizes_of
from models.cql_lag import CQLLagTorchRLModule


class CQLLagBranchingTorchRLModule(CQLLagTorchRLModule):
    """Two-head constrained Q-network per branch, with the behaviour head."""

    def setup(self) -> None:
        self.branch_sizes = branch_sizes_of(self.action_space)
        self.max_n = max(self.branch_sizes)
        super().setup()

    def output_size(self) -> int:
        return len(self.branch_sizes) * self.max_n

    def shaped(self, out: torch.Tensor) -> torch.Tensor:
        return out.view(*out.shape[:-1], len(self.branch_sizes), self.max_n)

    def feasible(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = obs["action_mask"]
        return branch_feasibility(mask, self.branch_sizes, mask.shape[0], mask.device)
