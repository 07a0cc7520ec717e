"""The constrained fitted-Q losses, as plain torch functions (hand-checkable in tests).

For a batch of transitions (s, a, r, c, s', done) with online heads Q_r, Q_c, target
heads Q_r', Q_c' and the multiplier λ:

* support (BCQ's action filter, Fujimoto et al. 2019, discrete form; OSRL's BCQ-Lag): a
  behaviour-cloned head π_b (cross-entropy on the data actions over the valid ones; on
  the steps of episodes within the budget only when ``bc_mask`` says so, as OSRL's
  BC-Safe) marks the actions whose π_b(a|s) >= τ·max_a' π_b(a'|s); the policy, its next action
  and its cost estimate only consider those (τ = 0: every valid action);
* next action (the current policy at s'): a' = argmax over supported a of
  Q_r(s', a) - λ Q_c(s', a);
* TD targets: y_r = reward_scale·r + γ(1-done)·Q_r'(s', a'),
  y_c = cost_scale·c + γ(1-done)·Q_c'(s', a');
* TD losses: Huber(Q_r(s, a) - y_r), Huber(Q_c(s, a) - y_c), batch means;
* discrete CQL on the reward head: logsumexp over VALID actions of Q_r(s, ·) minus
  Q_r(s, a) (pushes down the Q of actions the data does not take); the same term on the
  cost head (``cql_cost_alpha`` > 0) is the source's formulation, kept as an ablation:
  it pushes Q_c DOWN off the data, an optimistic cost (the wrong direction);
* cost pessimism in the right direction (``cost_upper_alpha`` > 0): the same term on
  -Q_c, logsumexp(-Q_c(s, ·)) + Q_c(s, a), raises Q_c of the actions the data does not
  take (an upper bound on their cost, as CPQ's penalty of out-of-data actions);
* cost estimate: (1-γ)·mean over the batch of Q_c(s, π(s)) - a per-step cost rate of the
  current policy on the data's states, in the units of the per-step threshold.

Branching (Tavakoli et al.'s BDQ, actions (B, D) over D branches, heads (B, D, A) with
padding infeasible): every per-action term above is taken per branch (its own valid
actions, support and argmax) and averaged over the branches; the joint Q of an action
is the mean over branches of its sub-actions' Q (BDQ's mean operator), so both TD
targets and the cost estimate use that mean, and every branch regresses to the same
target. With D = 1 this is the flat form exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.cql_lag import supported

NEG_INF = float("-inf")


def gather(q: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Q(s, a) (B,) of (B, A) values at integer actions (B,); branching: (B, D) of
    (B, D, A) at (B, D)."""
    return q.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def joint(per_action: torch.Tensor, branching: bool) -> torch.Tensor:
    """The joint action's value (B,): the mean over branches (BDQ), or as is (flat)."""
    return per_action.mean(dim=-1) if branching else per_action


def cql_penalty(q: torch.Tensor, actions: torch.Tensor, feasible: torch.Tensor) -> torch.Tensor:
    """Per-sample discrete CQL term (B,): logsumexp over valid actions of Q minus Q(s, a)."""
    return torch.logsumexp(q.masked_fill(~feasible, NEG_INF), dim=-1) - gather(q, actions)


def greedy_actions(qr: torch.Tensor, qc: torch.Tensor, lagrange: torch.Tensor | float,
                   feasible: torch.Tensor) -> torch.Tensor:
    """argmax over valid (or supported) actions of Q_r - λ·Q_c (B,)."""
    return (qr - lagrange * qc).masked_fill(~feasible, NEG_INF).argmax(dim=-1)


def supported_actions(bc_logits: torch.Tensor | None, feasible: torch.Tensor,
                      threshold: float) -> torch.Tensor:
    """BCQ's filter (B, A): valid actions with π_b(a|s) >= τ·max π_b(·|s) (π_b: the
    softmax of the behaviour-cloned logits over the valid actions, no gradient); τ <= 0
    or no logits: every valid action. The most likely valid action always passes. The
    module's own rule (:func:`models.cql_lag.supported`), so training and acting agree."""
    if bc_logits is None:
        return feasible
    return supported(bc_logits.detach(), feasible, threshold)


def bc_loss(bc_logits: torch.Tensor, actions: torch.Tensor,
            feasible: torch.Tensor) -> torch.Tensor:
    """Cross-entropy (B,) of the data action under the softmax over valid actions."""
    return -gather(torch.log_softmax(bc_logits.masked_fill(~feasible, NEG_INF), dim=-1),
                   actions)


@dataclass
class LossTerms:
    """Every term of one update (tensors; ``total`` carries the gradient)."""

    total: torch.Tensor
    td_reward: torch.Tensor
    td_cost: torch.Tensor
    cql_reward: torch.Tensor
    cql_cost: torch.Tensor
    cost_estimate: torch.Tensor
    q_reward: torch.Tensor  # mean Q_r(s, a) of the data actions
    q_cost: torch.Tensor  # mean Q_c(s, a) of the data actions
    bc: torch.Tensor  # cross-entropy of the behaviour-cloned head (0 without one)
    cost_upper: torch.Tensor  # the upward cost penalty (logged even when its weight is 0)
    supported: torch.Tensor  # mean number of supported actions per state


def constrained_q_losses(*, qr: torch.Tensor, qc: torch.Tensor, qr_next: torch.Tensor,
                         qc_next: torch.Tensor, qr_target_next: torch.Tensor,
                         qc_target_next: torch.Tensor, feasible: torch.Tensor,
                         next_feasible: torch.Tensor, actions: torch.Tensor,
                         rewards: torch.Tensor, costs: torch.Tensor,
                         terminateds: torch.Tensor, lagrange: float, gamma: float,
                         cql_alpha: float, cql_cost_alpha: float = 0.0,
                         reward_scale: float = 1.0, cost_scale: float = 1.0,
                         bc_logits: torch.Tensor | None = None,
                         next_bc_logits: torch.Tensor | None = None,
                         support_threshold: float = 0.0, bc_weight: float = 1.0,
                         cost_upper_alpha: float = 0.0,
                         bc_mask: torch.Tensor | None = None) -> LossTerms:
    """The loss of one batch (see the module docstring); λ, the targets and the support
    carry no gradient; ``bc_logits`` (B, A) add ``bc_weight`` x the BC cross-entropy,
    averaged over the samples ``bc_mask`` (B,) marks (default all; e.g. the steps of
    episodes within the budget: the safe behaviour's support). Branching when
    ``actions`` is (B, D) and the heads (B, D, A)."""
    branching = actions.dim() == 2
    allowed = supported_actions(bc_logits, feasible, support_threshold)
    next_allowed = supported_actions(next_bc_logits, next_feasible, support_threshold)
    with torch.no_grad():
        a_next = greedy_actions(qr_next, qc_next, lagrange, next_allowed)
        live = 1.0 - terminateds.float()
        y_r = reward_scale * rewards.float() + \
            gamma * live * joint(gather(qr_target_next, a_next), branching)
        y_c = cost_scale * costs.float() + \
            gamma * live * joint(gather(qc_target_next, a_next), branching)
        a_pi = greedy_actions(qr, qc, lagrange, allowed)
        cost_estimate = (1.0 - gamma) * joint(gather(qc, a_pi), branching).mean()
        if branching:  # every branch regresses to the joint target
            y_r, y_c = y_r.unsqueeze(-1).expand(-1, actions.shape[1]), \
                y_c.unsqueeze(-1).expand(-1, actions.shape[1])
    q_r, q_c = gather(qr, actions), gather(qc, actions)
    td_r = F.smooth_l1_loss(q_r, y_r)
    td_c = F.smooth_l1_loss(q_c, y_c)
    cql_r = cql_penalty(qr, actions, feasible).mean()
    cql_c = cql_penalty(qc, actions, feasible).mean()
    cost_up = cql_penalty(-qc, actions, feasible).mean()
    total = td_r + td_c + cql_alpha * cql_r
    if cql_cost_alpha:
        total = total + cql_cost_alpha * cql_c
    if cost_upper_alpha:
        total = total + cost_upper_alpha * cost_up
    bc = torch.zeros(())
    if bc_logits is not None:
        ce = joint(bc_loss(bc_logits, actions, feasible), branching)
        if bc_mask is None:
            bc = ce.mean()
        else:
            w = bc_mask.float()
            bc = (ce * w).sum() / w.sum().clamp(min=1.0)
        total = total + bc_weight * bc
    return LossTerms(total, td_r, td_c, cql_r, cql_c, cost_estimate, q_r.mean().detach(),
                     q_c.mean().detach(), bc, cost_up,
                     allowed.float().sum(-1).mean())
