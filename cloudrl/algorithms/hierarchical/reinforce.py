"""The source benchmark's gate: a REINFORCE supervisor (linear softmax over the macro state).

:class:`ReinforceGate` picks sub-agent ``i`` with probability ``softmax(W x + b)_i``
(``x`` the macro vector, clipped); :func:`train_reinforce_gate` runs whole episodes
of ``envs.hierarchical_env.HierarchicalClusterEnv`` (sub-agents embedded, frozen) on
the given seeds and after each updates ``W, b`` by ``lr * sum_t (G_t - baseline)
grad log pi(a_t | x_t)``, with ``G_t`` the discounted return-to-go of the supervisor's
(scaled) rewards and a running-mean baseline per decision index. Plain numpy: no
Ray. Greedy (argmax) at evaluation, like the PPO supervisor; it has
``choose(macro)`` so ``HierarchicalPolicy`` runs it. Sensitive to ``lr``: 0.05 learnt
to avoid a bad sub-agent in 30 short episodes, 0.2 locked onto it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from envs.hierarchical_env import SUPERVISOR, HierarchicalClusterEnv


class ReinforceGate:
    """Linear softmax gate; ``greedy`` picks the argmax, else samples with its own rng."""

    name = "reinforce"

    def __init__(self, n_in: int, n_out: int, seed: int = 0, greedy: bool = True) -> None:
        self.w = np.zeros((n_out, n_in))
        self.b = np.zeros(n_out)
        self.greedy, self.seed = greedy, seed
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def features(self, macro: np.ndarray) -> np.ndarray:
        """The macro vector (already in unit-ish ranges), clipped to [-3, 3]."""
        return np.clip(np.asarray(macro, dtype=np.float64), -3.0, 3.0)

    def probs(self, macro: np.ndarray) -> np.ndarray:
        z = self.w @ self.features(macro) + self.b
        p = np.exp(z - z.max())
        return p / p.sum()

    def choose(self, macro: np.ndarray) -> int:
        p = self.probs(macro)
        return int(np.argmax(p)) if self.greedy else int(self.rng.choice(len(p), p=p))


def train_reinforce_gate(env_config: dict[str, Any], sub_agents: Sequence[Any], k: int,
                         seeds: Sequence[int], lr: float = 0.05, gamma: float = 0.99,
                         reward_scale: float = 0.01, seed: int = 0, interface: str = "flat"
                         ) -> tuple[ReinforceGate, list[float]]:
    """A gate trained by REINFORCE, one episode per seed; returns (gate, episode returns)."""
    env = HierarchicalClusterEnv({"env": env_config, "k": k, "reward_scale": reward_scale,
                                  "interface": interface},
                                 sub_agents=sub_agents)
    obs, _ = env.reset(seed=int(seeds[0]))
    n_in = int(obs[SUPERVISOR].shape[0])
    gate = ReinforceGate(n_in, env.m, seed=seed, greedy=False)
    baseline, returns = None, []
    for ep_seed in seeds:
        obs, _ = env.reset(seed=int(ep_seed))
        xs, acts, rewards, done = [], [], [], False
        while not done:
            x = obs[SUPERVISOR]
            a = gate.choose(x)
            obs, r, _, trunc, _ = env.step({SUPERVISOR: a})
            xs.append(x)
            acts.append(a)
            rewards.append(r[SUPERVISOR])
            done = trunc["__all__"]
        g, togo = 0.0, np.empty(len(rewards))
        for t in range(len(rewards) - 1, -1, -1):
            g = rewards[t] + gamma * g
            togo[t] = g
        # per-decision-index baseline (episodes have the same length): the return-to-go
        # shrinks along the episode whatever the gate does, which is not its credit
        if baseline is None or len(baseline) != len(togo):
            baseline = togo.copy()
        adv = togo - baseline
        baseline = 0.8 * baseline + 0.2 * togo
        scale = max(1e-8, float(np.abs(adv).max()))
        for x, a, adv_t in zip(xs, acts, adv / scale, strict=True):
            p = gate.probs(x)
            grad = -p
            grad[a] += 1.0  # d log pi(a) / d logits
            gate.w += lr * adv_t * np.outer(grad, gate.features(x))
            gate.b += lr * adv_t * grad
        returns.append(float(sum(rewards)))
    gate.greedy = True
    return gate, returns
