"""The alignment head of the scenario RLHF phases: a second preference model that explains
the operator's labels by the per-class SLA violation rates alone.

Shape: ``h(x) = -sum_c a_c * softplus(k_c * (z_c - t_c))`` over the classes' normalised
violation rates ``z_c`` (latency-critical and batch), with ``a_c, k_c > 0``: never higher
for more violations (monotone), flat below a learned threshold ``t_c`` and steep above it,
the shape of a safety bound. It is fitted by Bradley-Terry on the same comparisons as the
main reward model (the same held-out pairs), so it uses no label the main model did not see.

Its score is in the same units as the main model's (log-odds of a preference), so the
policy's objective with the head is ``r(x) + weight * h(x)``: the labels' evidence about
safety counted once more, the lever an operator pulls when violations matter more than the
rest of the trade-off. ``weight = 0`` is the main model alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cloudrl.algorithms.bradley_terry import fit_pairs, pair_accuracy

SAFETY_FEATURES = ("sla_lc", "sla_batch")


class SafetyHead:
    """``score(x)``: the head's log-odds score of episodes' summary rows (higher: preferred);
    ``columns``: where the safety features sit in those rows."""

    def __init__(self, columns: list[int], mean: np.ndarray, std: np.ndarray,
                 seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.columns = list(columns)
        self.mean, self.std = np.asarray(mean, float), np.asarray(std, float)
        c = len(self.columns)
        self.log_a = torch.nn.Parameter(torch.zeros(c))
        self.log_k = torch.nn.Parameter(torch.zeros(c))
        self.t = torch.nn.Parameter(torch.zeros(c))

    def parameters(self) -> list[torch.nn.Parameter]:
        return [self.log_a, self.log_k, self.t]

    def _z(self, feats: np.ndarray) -> torch.Tensor:
        x = np.atleast_2d(np.asarray(feats, float))[:, self.columns]
        return torch.as_tensor((x - self.mean) / self.std, dtype=torch.float32)

    def _forward(self, z: torch.Tensor) -> torch.Tensor:
        a, k = torch.nn.functional.softplus(self.log_a), torch.nn.functional.softplus(self.log_k)
        return -(a * torch.nn.functional.softplus(k * (z - self.t))).sum(-1)

    def score(self, feats: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self._forward(self._z(feats)).numpy().astype(float)

    def bound(self) -> dict[str, float]:
        """Each class's learned threshold, back in violation-rate units."""
        t = self.t.detach().numpy()
        return {f"{name}_threshold": float(self.mean[i] + t[i] * self.std[i])
                for i, name in enumerate(SAFETY_FEATURES)}

    def fit(self, feats: np.ndarray, a: np.ndarray, b: np.ndarray, label: np.ndarray,
            steps: int = 400, lr: float = 0.05) -> float:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fit_pairs(self._forward, self.parameters(), self._z(feats), a, b, label,
                             steps, lr)
        finally:
            torch.set_num_threads(threads)


def learn_head(feats: np.ndarray, names: tuple[str, ...], a: np.ndarray, b: np.ndarray,
               label: np.ndarray, true_label: np.ndarray, seed: int, holdout: float = 0.2
               ) -> tuple[SafetyHead, dict[str, Any]]:
    """Fit the head on the comparisons the main reward model trains on (the same split as
    :func:`cloudrl.scenarios.steering.learn_reward`: ``default_rng([seed, 7])``); its
    held-out pair accuracy against the noisy and the true labels."""
    cols = [names.index(f) for f in SAFETY_FEATURES]
    x = np.asarray(feats, float)[:, cols]
    std = x.std(0)
    head = SafetyHead(cols, x.mean(0), np.where(std > 0, std, 1.0), seed=seed)
    n = len(a)
    order = np.random.default_rng([seed, 7]).permutation(n)
    n_test = int(round(holdout * n)) if n >= 5 else 0
    test, train = order[:n_test], order[n_test:]
    loss = head.fit(feats, a[train], b[train], label[train])
    info: dict[str, Any] = {"train_loss": loss, **head.bound(),
                            "heldout_acc_noisy": float("nan"), "heldout_acc_true": float("nan")}
    if n_test:
        r = head.score(feats)
        p = 1.0 / (1.0 + np.exp(-(r[a[test]] - r[b[test]])))
        info["heldout_acc_noisy"] = pair_accuracy(p, label[test])
        info["heldout_acc_true"] = pair_accuracy(p, true_label[test])
    return head, info
