"""The Bradley-Terry preference model: loss, pair accuracy and calibration.

Segment returns R_a, R_b give P(A preferred to B) = sigmoid(R_a - R_b). With label y the
probability that A is preferred (1, 0, or 0.5 for a tie; any value in [0, 1] as a soft
label) the loss is the cross-entropy

    loss = -[y log sigmoid(R_a - R_b) + (1 - y) log sigmoid(R_b - R_a)]

computed with ``logsigmoid`` so it stays finite for any return gap. ``pair_accuracy``
scores the sign of the predicted gap against decided labels (ties excluded);
``calibration`` bins the predicted probabilities and compares each bin's mean with the
mean label in it (reliability diagram; expected calibration error, ECE).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


def bt_loss(return_a: torch.Tensor, return_b: torch.Tensor, label: torch.Tensor,
            reduction: str = "mean") -> torch.Tensor:
    """Bradley-Terry cross-entropy per pair (``reduction`` "none"), or its "mean" / "sum"."""
    delta = return_a - return_b
    label = label.to(delta.dtype)
    loss = -(label * F.logsigmoid(delta) + (1.0 - label) * F.logsigmoid(-delta))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean()
    raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")


def fit_pairs(forward: Callable[[torch.Tensor], torch.Tensor],
              params: list[torch.nn.Parameter], x: torch.Tensor, a: np.ndarray,
              b: np.ndarray, label: np.ndarray, steps: int, lr: float,
              weight_decay: float = 0.0) -> float:
    """Full-batch Adam on the Bradley-Terry loss of ``forward(x)`` (one score per row) over
    the pairs ``(a[i], b[i])`` with labels ``label``; the last step's loss."""
    ia, ib = torch.as_tensor(a), torch.as_tensor(b)
    y = torch.as_tensor(label, dtype=torch.float32)
    opt = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        opt.zero_grad()
        r = forward(x)
        loss = bt_loss(r[ia], r[ib], y)
        loss.backward()
        opt.step()
    return float(loss.detach())


def preference_prob(return_a: torch.Tensor, return_b: torch.Tensor) -> torch.Tensor:
    """P(A preferred to B) = sigmoid(R_a - R_b)."""
    return torch.sigmoid(return_a - return_b)


def pair_accuracy(prob_a: np.ndarray, label: np.ndarray) -> float:
    """Share of decided pairs (label != 0.5) whose predicted side (prob > 0.5) is the
    preferred one; a prediction of exactly 0.5 counts as wrong. NaN without decided pairs."""
    prob_a, label = np.asarray(prob_a, dtype=np.float64), np.asarray(label, dtype=np.float64)
    decided = label != 0.5
    if not decided.any():
        return float("nan")
    predicted_a = prob_a[decided] > 0.5
    predicted_b = prob_a[decided] < 0.5
    label_a = label[decided] > 0.5
    correct = np.where(label_a, predicted_a, predicted_b)
    return float(correct.mean())


@dataclass(frozen=True)
class Calibration:
    """Reliability bins over [0, 1]: per bin the count, mean prediction and mean label.

    Empty bins hold NaN means and count 0. ``ece`` = sum_b count_b / total *
    |mean_pred_b - mean_label_b|.
    """

    edges: np.ndarray
    counts: np.ndarray
    mean_pred: np.ndarray
    mean_label: np.ndarray
    ece: float

    def as_dict(self) -> dict[str, list[float] | float]:
        return {"edges": self.edges.tolist(), "counts": self.counts.tolist(),
                "mean_pred": self.mean_pred.tolist(), "mean_label": self.mean_label.tolist(),
                "ece": self.ece}


def calibration(prob_a: np.ndarray, label: np.ndarray, n_bins: int = 10) -> Calibration:
    """Equal-width bins ``[i/n, (i+1)/n)`` (the last one closed) of the predicted P(A > B)."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    prob_a = np.asarray(prob_a, dtype=np.float64).ravel()
    label = np.asarray(label, dtype=np.float64).ravel()
    if prob_a.shape != label.shape:
        raise ValueError(f"{prob_a.shape[0]} predictions for {label.shape[0]} labels")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    index = np.clip(np.floor(prob_a * n_bins).astype(np.int64), 0, n_bins - 1)
    counts = np.bincount(index, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_pred = np.bincount(index, prob_a, n_bins) / counts
        mean_label = np.bincount(index, label, n_bins) / counts
    total = counts.sum()
    filled = counts > 0
    ece = float((counts[filled] / total * np.abs(mean_pred[filled] - mean_label[filled])).sum()
                ) if total else float("nan")
    return Calibration(edges, counts, mean_pred, mean_label, ece)
