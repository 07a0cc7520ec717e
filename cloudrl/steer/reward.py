"""The learner: a Bradley-Terry reward model over per-tick traces, from labels only.

Per tick, :func:`tick_features` (hour of day as sin/cos, price, carbon, the tick's energy,
carbon and SLA dollars, violations and waiting work per class, toggles, the controls in
force and their change, active servers; normalised by the pool's mean and spread). The
score of a trace:

    R = sum_w  v . tanh(C_w(tanh(W1 x_t + b1)))  +  sum_t  l . x_t  +  sum_{day, server} g(toggles)

a per-tick MLP, a one-hour window encoder (a strided 1-D convolution: non-overlapping
windows) with a nonlinearity per window, a linear per-tick term, and a learned scalar
nonlinearity ``g`` of each server's toggles per day. Higher is preferred. An ensemble of
``members`` (different initialisations) gives the active-querying uncertainty; the mean
member is the reward. Trained by full-batch Adam on the Bradley-Terry loss.

This module reads traces and labels (segment keys and a choice); it never imports an
operator's utility.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cloudrl.algorithms.bradley_terry import fit_pairs, pair_accuracy
from cloudrl.steer.trace import Trace

FEATURE_NAMES = ("hour_sin", "hour_cos", "price", "carbon", "grid_kwh", "energy_usd",
                 "carbon_usd", "sla_usd", "viol_lc", "viol_batch", "queued_lc",
                 "queued_batch", "pool_cores", "transitions", "release_util", "ready_cores",
                 "ready_change", "active")
LABEL_OF = {"a": 1.0, "b": 0.0, "equal": 0.5}


def tick_features(tr: Trace) -> np.ndarray:
    """(T, F) raw per-tick features, in :data:`FEATURE_NAMES` order."""
    t = tr.ticks
    ang = 2.0 * np.pi * t["hour"] / 24.0
    share = 1.0 / tr.fleet_cores
    change = np.abs(np.diff(t["ready_cores"], prepend=t["ready_cores"][:1]))
    cols = [np.sin(ang), np.cos(ang), t["price"], t["carbon"], t["grid_kwh"], t["energy_usd"],
            t["carbon_usd"], t["sla_usd"], t["viol_lc"], t["viol_batch"],
            t["queued_lc"] * share, t["queued_batch"] * share, t["pool_cores"] * share,
            t["transitions"], t["release_util"], t["ready_cores"], change, t["active"]]
    return np.stack(cols, axis=1)


class _Net(torch.nn.Module):
    def __init__(self, n_features: int, window: int, hidden: int) -> None:
        super().__init__()
        self.tick = torch.nn.Linear(n_features, hidden)
        self.win = torch.nn.Conv1d(hidden, hidden, kernel_size=window, stride=window)
        self.out = torch.nn.Linear(hidden, 1)
        self.lin = torch.nn.Linear(n_features, 1, bias=False)
        self.wear = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(),
                                        torch.nn.Linear(8, 1))

    def forward(self, x: torch.Tensor, toggles: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.tick(x)).transpose(1, 2)  # (N, H, T)
        w = torch.tanh(self.win(h)).transpose(1, 2)  # (N, windows, H)
        seq = self.out(w).squeeze(-1).sum(-1)
        lin = self.lin(x).squeeze(-1).mean(-1) * 10.0
        wear = self.wear(toggles.unsqueeze(-1)).squeeze(-1).sum(-1) / 10.0
        return seq + lin + wear


@dataclass
class Inputs:
    """A pool of traces as tensors: per-tick features (N, T, F), toggles (N, D*S)."""

    x: torch.Tensor
    toggles: torch.Tensor


class SequenceReward:
    """An ensemble of :class:`_Net` over normalised traces; ``score`` higher is preferred."""

    def __init__(self, mean: np.ndarray, std: np.ndarray, window: int, members: int = 3,
                 hidden: int = 16, seed: int = 0) -> None:
        self.mean, self.std, self.window = np.asarray(mean), np.asarray(std), int(window)
        self.nets = []
        for m in range(members):
            torch.manual_seed(seed * 1000 + m)
            self.nets.append(_Net(len(self.mean), self.window, hidden))

    @classmethod
    def for_pool(cls, traces: list[Trace], members: int = 3, seed: int = 0) -> SequenceReward:
        feats = np.concatenate([tick_features(t) for t in traces])
        std = feats.std(0)
        window = max(1, int(round(3600.0 / traces[0].tick_seconds)))
        return cls(feats.mean(0), np.where(std > 1e-9, std, 1.0), window, members, seed=seed)

    def inputs(self, traces: list[Trace]) -> Inputs:
        x = np.stack([(tick_features(t) - self.mean) / self.std for t in traces])
        g = np.stack([t.toggles.ravel() for t in traces])
        return Inputs(torch.as_tensor(x, dtype=torch.float32),
                      torch.as_tensor(g / 10.0, dtype=torch.float32))

    def member_scores(self, inp: Inputs) -> np.ndarray:
        """(members, N) scores."""
        with torch.no_grad():
            return np.stack([net(inp.x, inp.toggles).numpy() for net in self.nets]).astype(float)

    def score(self, inp: Inputs) -> np.ndarray:
        return self.member_scores(inp).mean(0)

    def fit(self, inp: Inputs, a: np.ndarray, b: np.ndarray, label: np.ndarray,
            steps: int = 300, lr: float = 0.01, weight_decay: float = 1e-3) -> float:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            losses = []
            rng = np.random.default_rng(len(a))
            for net in self.nets:  # each member on a bootstrap of the pairs
                idx = rng.integers(0, len(a), len(a)) if len(self.nets) > 1 else np.arange(len(a))
                losses.append(fit_pairs(lambda x, net=net: net(x, inp.toggles),
                                        list(net.parameters()), inp.x, a[idx], b[idx],
                                        label[idx], steps, lr, weight_decay))
            return float(np.mean(losses))
        finally:
            torch.set_num_threads(threads)

    def prob_a(self, inp: Inputs, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        r = self.score(inp)
        return 1.0 / (1.0 + np.exp(-np.clip(r[a] - r[b], -60, 60)))

    def pair_gaps(self, inp: Inputs, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(members, P) score gaps R(a) - R(b): what active querying ranks by."""
        s = self.member_scores(inp)
        return s[:, a] - s[:, b]


# ------------------------------------------------------------------ labels from the store
def operator_labels(conn: sqlite3.Connection) -> dict[str, list[dict[str, Any]]]:
    """Per operator name: its non-skip labels in label order, each ``a``, ``b`` (segment
    keys, the pair's own orientation), ``label`` (1: a preferred, 0: b, 0.5: equal) and
    ``at`` (time)."""
    rows = conn.execute(
        "SELECT o.name, sa.seg_key, sb.seg_key, l.choice, l.created_at FROM labels l "
        "JOIN operators o ON o.id = l.operator_id JOIN pairs p ON p.id = l.pair_id "
        "JOIN segments sa ON sa.id = p.a_seg JOIN segments sb ON sb.id = p.b_seg "
        "WHERE l.choice != 'skip' ORDER BY l.id").fetchall()
    out: dict[str, list[dict[str, Any]]] = {}
    for name, a, b, choice, at in rows:
        out.setdefault(name, []).append({"a": a, "b": b, "label": LABEL_OF[choice],
                                         "at": float(at)})
    return out


def learn(traces: dict[str, Trace], labels: list[dict[str, Any]], seed: int = 0,
          holdout: float = 0.2, steps: int = 200, members: int = 3
          ) -> tuple[SequenceReward, dict[str, Any]]:
    """Fit on (1 - holdout) of ``labels`` (the model returned); its pair accuracy on the
    rest (ties left out)."""
    keys = list(traces)
    index = {k: i for i, k in enumerate(keys)}
    a = np.array([index[r["a"]] for r in labels], dtype=np.int64)
    b = np.array([index[r["b"]] for r in labels], dtype=np.int64)
    y = np.array([r["label"] for r in labels], float)
    pool = [traces[k] for k in keys]
    model = SequenceReward.for_pool(pool, members=members, seed=seed)
    inp = model.inputs(pool)
    order = np.random.default_rng([seed, 7]).permutation(len(a))
    n_test = int(round(holdout * len(a))) if len(a) >= 10 else 0
    test, train = order[:n_test], order[n_test:]
    loss = model.fit(inp, a[train], b[train], y[train], steps=steps)
    info: dict[str, Any] = {"labels": int(len(a)), "train": int(len(train)),
                            "heldout": int(n_test), "train_loss": loss,
                            "heldout_acc": float("nan")}
    if n_test:
        info["heldout_acc"] = pair_accuracy(model.prob_a(inp, a[test], b[test]), y[test])
    model.keys = keys  # type: ignore[attr-defined]
    return model, info


def drift_report(model: SequenceReward, traces: dict[str, Trace],
                 labels: list[dict[str, Any]], recent_fraction: float = 0.3
                 ) -> dict[str, Any]:
    """The model's accuracy on the newest ``recent_fraction`` of an operator's labels vs the
    older ones (ties left out): a drop says the operator's trade-off moved."""
    keys = list(traces)
    index = {k: i for i, k in enumerate(keys)}
    inp = model.inputs([traces[k] for k in keys])
    a = np.array([index[r["a"]] for r in labels])
    b = np.array([index[r["b"]] for r in labels])
    y = np.array([r["label"] for r in labels], float)
    p = model.prob_a(inp, a, b)
    n_recent = max(1, int(round(len(labels) * recent_fraction)))
    old, new = slice(0, len(labels) - n_recent), slice(len(labels) - n_recent, None)
    acc_old, acc_new = pair_accuracy(p[old], y[old]), pair_accuracy(p[new], y[new])
    return {"older": {"labels": len(labels) - n_recent, "accuracy": acc_old},
            "recent": {"labels": n_recent, "accuracy": acc_new},
            "accuracy_change": acc_new - acc_old}


def drift_forward(traces: dict[str, Trace], labels: list[dict[str, Any]],
                  recent_fraction: float = 0.3, seed: int = 0, steps: int = 200,
                  members: int = 3) -> dict[str, Any]:
    """A model of the older ``1 - recent_fraction`` of the labels (fit on 80% of them)
    predicting the newest labels vs its held-out older ones (ties left out): when the
    operator's trade-off moved, the older model predicts the new labels worse than it
    predicts labels of its own time. ``accuracy_change`` = recent - held-out older, with
    the standard error of that difference (two independent proportions)."""
    n_recent = max(1, int(round(len(labels) * recent_fraction)))
    older, recent = labels[:-n_recent], labels[-n_recent:]
    model, info = learn(traces, older, seed=seed, steps=steps, members=members)
    keys = list(traces)
    index = {k: i for i, k in enumerate(keys)}
    inp = model.inputs([traces[k] for k in keys])
    a = np.array([index[r["a"]] for r in recent])
    b = np.array([index[r["b"]] for r in recent])
    y = np.array([r["label"] for r in recent], float)
    acc = pair_accuracy(model.prob_a(inp, a, b), y)
    p0, n0 = info["heldout_acc"], max(int(info["heldout"]), 1)
    se = float(np.sqrt(p0 * (1 - p0) / n0 + acc * (1 - acc) / max(n_recent, 1)))
    return {"older_labels": len(older), "older_heldout_accuracy": p0,
            "recent_labels": n_recent, "recent_accuracy": acc,
            "accuracy_change": acc - p0, "standard_error": se}
