"""Implicit Q-learning on logged transitions, in a plain torch loop.

The offline data here is a few tens of thousands of 15-minute decisions, so one process
fits it in a minute or two; RLlib's offline pipeline would spend more on Ray Data than on
the updates (the same trade as :mod:`cloudrl.algorithms.distill.learner`). The steps
(Kostrikov et al. 2021):

1. **Critic** (``critic_steps``): a twin Q network over the joint action (``n_1 · ... ·
   n_D`` outputs) regresses ``r + γ (1 - done) V(s')`` on the taken action; V regresses
   the upper ``expectile`` of the target-Q of the data's action (asymmetric L2), so V
   approaches the value of the best action the data supports without ever querying an
   action outside it.
2. **Extraction** (``policy_steps``), ``extract="awr"``: the branching policy module
   maximises ``Σ exp(β · A(s, a)) · log π(a | s)`` over the data's actions, ``A = min Q -
   V`` (advantage-weighted regression), the joint log-probability the sum over branches.
   ``extract="support"``: the module first clones the behaviours' own actions, then is
   fitted to the action of highest Q among those that clone gives at least ``support``
   times its likeliest action's probability (discrete BCQ's rule on IQL's critic).

``critic="paired"`` replaces step 1 where every logged episode has siblings played on the
same seed (the same jobs, prices and forecasts, other actions): Q and V regress each step's
discounted return-to-go less the mean of its siblings' at the same step. The seed's own
luck (a spike, a burst of jobs) is common to the siblings and cancels, so what is left is
what the actions changed; Q(s, a) - V(s) ranks the data's actions as the plain return
would, at a fraction of its variance (common random numbers as a control variate). It is
Monte Carlo, so it values one step of improvement over the data's own continuation
(one-step RL, Brandfonbrener et al. 2021).

Rewards are divided by their mean absolute value first, so ``beta`` means the same on
any scenario; the returned diagnostics say what that scale was.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from cloudrl.algorithms.iql.config import IQLConfig


@dataclass
class Transitions:
    """Logged decisions: ``obs`` (N, d), ``actions`` (N, D) per-branch indices, ``rewards``
    (N,), ``next_obs`` (N, d), ``dones`` (N,) 1 where the episode ended."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    dones: np.ndarray
    behaviour_actions: np.ndarray | None = None  # the behaviour's own, where noise was injected
    paired_returns: np.ndarray | None = None  # the critic "paired" regresses these

    def __post_init__(self) -> None:
        n = len(self.obs)
        for name in ("actions", "rewards", "next_obs", "dones", "behaviour_actions",
                     "paired_returns"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValueError(f"Transitions.{name} has {len(getattr(self, name))} rows, "
                                 f"obs {n}")
        if n == 0:
            raise ValueError("Transitions: no rows")


def _mlp(width: int, hiddens: tuple[int, ...], out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hiddens:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, out))


def joint_index(actions: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Per-branch indices (B, D) -> the joint index, the first branch most significant."""
    idx = torch.zeros(len(actions), dtype=torch.int64)
    for d, n in enumerate(sizes):
        idx = idx * n + actions[:, d]
    return idx


def expectile_loss(diff: torch.Tensor, tau: float) -> torch.Tensor:
    """Mean of ``|tau - 1(diff < 0)| · diff²`` (diff = target - prediction)."""
    weight = torch.where(diff < 0, 1.0 - tau, tau)
    return (weight * diff.pow(2)).mean()


def train_iql(module: Any, data: Transitions, cfg: IQLConfig, log: Any = print
              ) -> dict[str, float]:
    """Fit the critics on ``data``, then ``module`` (a branching policy with
    ``branch_logits``) by advantage-weighted regression; diagnostics."""
    gen = torch.Generator().manual_seed(cfg.run_seed)
    torch.manual_seed(cfg.run_seed)
    sizes = [int(n) for n in module.branch_sizes]
    n_joint = int(np.prod(sizes))
    scale = float(np.mean(np.abs(data.rewards))) or 1.0
    x = torch.as_tensor(data.obs, dtype=torch.float32)
    x2 = torch.as_tensor(data.next_obs, dtype=torch.float32)
    a = joint_index(torch.as_tensor(data.actions, dtype=torch.int64), sizes)
    r = torch.as_tensor(data.rewards / scale, dtype=torch.float32)
    done = torch.as_tensor(data.dones, dtype=torch.float32)
    n = len(x)
    stats: dict[str, float] = {"reward_scale": scale, "rows": float(n)}
    if cfg.critic == "paired":
        if data.paired_returns is None:
            raise ValueError("IQLConfig.critic 'paired' needs Transitions.paired_returns")
        y = torch.as_tensor(data.paired_returns / scale, dtype=torch.float32)
        q_all, v_all = _paired_critic(x, a, y, n_joint, cfg, gen, stats, log)
    else:
        q_all, v_all = _expectile_critic(x, x2, a, r, done, n_joint, cfg, gen, stats, log)
    with torch.no_grad():
        adv = q_all.gather(1, a[:, None])[:, 0] - v_all
        weights = torch.clamp(torch.exp(cfg.beta * adv), max=cfg.max_weight)
        greedy_gain = (q_all.max(1).values - q_all.gather(1, a[:, None])[:, 0]).mean()
        stats.update({"v_mean": float(v_all.mean()), "adv_mean": float(adv.mean()),
                      "adv_std": float(adv.std()), "weight_mean": float(weights.mean()),
                      "weight_capped_share": float((weights >= cfg.max_weight).float().mean()),
                      "q_greedy_minus_data": float(greedy_gain)})
    if cfg.extract == "awr":
        acts = torch.as_tensor(data.actions, dtype=torch.int64)
        stats["policy_loss"] = _weighted_fit(module, x, acts, weights, cfg, gen)
    else:
        own = data.actions if data.behaviour_actions is None else data.behaviour_actions
        _weighted_fit(module, x, torch.as_tensor(own, dtype=torch.int64),
                      torch.ones(n), cfg, gen)
        labels, moved = support_greedy(module, x, q_all, sizes, cfg.support)
        stats["support_greedy_moved_share"] = moved
        stats["policy_loss"] = _weighted_fit(module, x, labels, torch.ones(n), cfg, gen)
    return stats


def _weighted_fit(module: Any, x: torch.Tensor, acts: torch.Tensor, weights: torch.Tensor,
                  cfg: IQLConfig, gen: torch.Generator) -> float:
    """``policy_steps`` minibatch steps of the weighted joint log-likelihood of ``acts``."""
    opt = torch.optim.Adam(module.parameters(), lr=cfg.lr)
    module.train()
    loss = torch.zeros(())
    for _ in range(cfg.policy_steps):
        idx = torch.randint(len(x), (cfg.batch_size,), generator=gen)
        logits = module.branch_logits(x[idx])
        logp = sum(F.log_softmax(lg, -1).gather(1, acts[idx, k:k + 1])[:, 0]
                   for k, lg in enumerate(logits))
        loss = -(weights[idx] * logp).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    module.eval()
    return loss.item()


@torch.no_grad()
def support_greedy(module: Any, x: torch.Tensor, q: torch.Tensor, sizes: list[int],
                   support: float) -> tuple[torch.Tensor, float]:
    """Per state, the joint action of highest ``q`` among those the behaviour model
    ``module`` gives at least ``support`` times its likeliest action's probability
    (discrete BCQ, Fujimoto et al. 2019), as per-branch indices; and the share of states
    where that is not the behaviour model's own likeliest action."""
    logp = torch.zeros(len(x), 1)
    for lg in module.branch_logits(x):  # joint log-probability, first branch outermost
        logp = (logp[:, :, None] + F.log_softmax(lg, -1)[:, None, :]).reshape(len(x), -1)
    allowed = logp >= logp.max(1, keepdim=True).values + float(np.log(support))
    best = torch.where(allowed, q, torch.full_like(q, -torch.inf)).argmax(1)
    moved = float((best != logp.argmax(1)).float().mean())
    out = []
    for n in reversed(sizes):
        out.append(best % n)
        best = best // n
    return torch.stack(out[::-1], dim=1), moved


def _expectile_critic(x: torch.Tensor, x2: torch.Tensor, a: torch.Tensor, r: torch.Tensor,
                      done: torch.Tensor, n_joint: int, cfg: IQLConfig, gen: torch.Generator,
                      stats: dict[str, float], log: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """IQL's critic: twin Q on TD targets through V, V an upper expectile of the target
    Q of the data's actions; (min target Q of every state and action, V of every state)."""
    d, n = x.shape[1], len(x)
    q1, q2 = _mlp(d, cfg.hiddens, n_joint), _mlp(d, cfg.hiddens, n_joint)
    q1_t, q2_t = copy.deepcopy(q1), copy.deepcopy(q2)
    v = _mlp(d, cfg.hiddens, 1)
    q_opt = torch.optim.Adam([*q1.parameters(), *q2.parameters()], lr=cfg.lr)
    v_opt = torch.optim.Adam(v.parameters(), lr=cfg.lr)
    for step in range(cfg.critic_steps):
        idx = torch.randint(n, (cfg.batch_size,), generator=gen)
        s, s2, act = x[idx], x2[idx], a[idx]
        with torch.no_grad():
            q_data = torch.minimum(q1_t(s), q2_t(s)).gather(1, act[:, None])[:, 0]
        v_loss = expectile_loss(q_data - v(s)[:, 0], cfg.expectile)
        v_opt.zero_grad()
        v_loss.backward()
        v_opt.step()
        with torch.no_grad():
            target = r[idx] + cfg.gamma * (1.0 - done[idx]) * v(s2)[:, 0]
        q_loss = sum(F.mse_loss(q(s).gather(1, act[:, None])[:, 0], target) for q in (q1, q2))
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()
        with torch.no_grad():
            for net, tgt in ((q1, q1_t), (q2, q2_t)):
                for p, pt in zip(net.parameters(), tgt.parameters(), strict=True):
                    pt.mul_(1.0 - cfg.polyak).add_(p, alpha=cfg.polyak)
        if (step + 1) % max(cfg.critic_steps // 4, 1) == 0:
            log(f"iql critic {step + 1}/{cfg.critic_steps}: q loss {q_loss.item():.4f}, "
                f"v loss {v_loss.item():.4f}")
    stats.update({"q_loss": q_loss.item(), "v_loss": v_loss.item()})
    with torch.no_grad():
        return torch.minimum(q1_t(x), q2_t(x)), v(x)[:, 0]


def _paired_critic(x: torch.Tensor, a: torch.Tensor, y: torch.Tensor, n_joint: int,
                   cfg: IQLConfig, gen: torch.Generator, stats: dict[str, float], log: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and V regress the paired return ``y`` (the discounted return-to-go less the other
    episodes' of the same seed at the same step): Q on the data's action, V on the state
    alone (the data's mean over its actions); (Q of every state and action, V)."""
    d, n = x.shape[1], len(x)
    q, v = _mlp(d, cfg.hiddens, n_joint), _mlp(d, cfg.hiddens, 1)
    opt = torch.optim.Adam([*q.parameters(), *v.parameters()], lr=cfg.lr)
    for step in range(cfg.critic_steps):
        idx = torch.randint(n, (cfg.batch_size,), generator=gen)
        s, target = x[idx], y[idx]
        q_loss = F.mse_loss(q(s).gather(1, a[idx, None])[:, 0], target)
        v_loss = F.mse_loss(v(s)[:, 0], target)
        opt.zero_grad()
        (q_loss + v_loss).backward()
        opt.step()
        if (step + 1) % max(cfg.critic_steps // 4, 1) == 0:
            log(f"paired critic {step + 1}/{cfg.critic_steps}: q loss {q_loss.item():.4f}, "
                f"v loss {v_loss.item():.4f}")
    stats.update({"q_loss": q_loss.item(), "v_loss": v_loss.item(),
                  "paired_return_std": float(y.std())})
    with torch.no_grad():
        return q(x), v(x)[:, 0]
