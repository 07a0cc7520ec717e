"""The input-driven model: which observation columns are inputs, and an ensemble that
steps the rest (the endogenous state) and the period's cost under any action."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from cloudrl.algorithms.model_es.config import ModelESConfig


def input_columns(obs_by_seed: dict[int, list[np.ndarray]]) -> np.ndarray:
    """Boolean mask of the columns that are inputs: equal, at every step both reach, in
    every logged episode of the same seed (``obs_by_seed``: seed -> its episodes'
    observation arrays ``(T + 1, D)``). The episodes of a seed differ only in their
    actions, so a column they all share is one the actions do not move. A ValueError where
    no seed has two episodes to compare."""
    mask: np.ndarray | None = None
    for eps in obs_by_seed.values():
        if len(eps) < 2:
            continue
        n = min(len(o) for o in eps)
        same = np.all([np.all(o[:n] == eps[0][:n], axis=0) for o in eps[1:]], axis=0)
        mask = same if mask is None else mask & same
    if mask is None:
        raise ValueError("input columns: no seed has two logged episodes to compare; record "
                         "the behaviours with --noise or --window-noise")
    return mask


def _mlp(n_in: int, hiddens: tuple[int, ...], n_out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = n_in
    for h in hiddens:
        layers += [nn.Linear(width, h), nn.SiLU()]
        width = h
    layers.append(nn.Linear(width, n_out))
    return nn.Sequential(*layers)


class InputDrivenModel:
    """An ensemble predicting, from an observation and a flat action, the change of the
    endogenous columns and the period's cost. Rollouts replay the inputs from a log and
    take the endogenous columns from the model, clipped to the range the data covers
    (a state the data never saw is not trusted beyond its edge)."""

    def __init__(self, inputs: np.ndarray, n_actions: int, cfg: ModelESConfig,
                 n_extra: int = 0) -> None:
        self.inputs = np.asarray(inputs, bool)
        self.endo = np.flatnonzero(~self.inputs)
        if not len(self.endo):
            raise ValueError("input-driven model: every column is an input; nothing to model")
        self.n_actions = int(n_actions)
        self.n_extra = int(n_extra)  # further per-period counts (e.g. violations per class)
        self.cfg = cfg
        n_in = len(self.inputs) + self.n_actions
        self.members = [_mlp(n_in, cfg.hiddens, len(self.endo) + 1 + self.n_extra)
                        for _ in range(cfg.members)]
        self.stats: dict[str, torch.Tensor] = {}

    def _features(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        onehot = nn.functional.one_hot(actions.long(), self.n_actions).float()
        return (torch.cat([obs, onehot], 1) - self.stats["mu_x"]) / self.stats["sd_x"]

    def fit(self, obs: np.ndarray, actions: np.ndarray, costs: np.ndarray,
            next_obs: np.ndarray, log: Callable[[str], None] = print,
            extra: np.ndarray | None = None) -> dict[str, float]:
        """Fit every member on the logged transitions (``costs``: $ per period;
        ``extra``: ``(N, n_extra)`` further counts per period); returns the mean squared
        error per member on its last batches, in normalised units."""
        cfg = self.cfg
        x_obs = torch.as_tensor(obs, dtype=torch.float32)
        acts = torch.as_tensor(actions, dtype=torch.int64)
        if acts.min() < 0 or acts.max() >= self.n_actions:
            raise ValueError(f"input-driven model: actions outside 0..{self.n_actions - 1}")
        extra = np.zeros((len(obs), 0)) if extra is None else np.asarray(extra, np.float64)
        if extra.shape != (len(obs), self.n_extra):
            raise ValueError(f"input-driven model: extra targets of shape {extra.shape}, "
                             f"expected {(len(obs), self.n_extra)}")
        y = np.concatenate([next_obs[:, self.endo] - obs[:, self.endo],
                            np.asarray(costs, np.float64)[:, None], extra],
                           1).astype(np.float32)
        onehot = nn.functional.one_hot(acts, self.n_actions).float()
        raw = torch.cat([x_obs, onehot], 1)
        self.stats = {"mu_x": raw.mean(0), "sd_x": raw.std(0) + 1e-6,
                      "mu_y": torch.as_tensor(y.mean(0)), "sd_y": torch.as_tensor(y.std(0) + 1e-6),
                      "lo": torch.as_tensor(obs[:, self.endo].min(0)),
                      "hi": torch.as_tensor(obs[:, self.endo].max(0)),
                      "cost_lo": torch.tensor(float(np.min(costs))),
                      "cost_hi": torch.tensor(float(np.max(costs)))}
        xt = (raw - self.stats["mu_x"]) / self.stats["sd_x"]
        yt = (torch.as_tensor(y) - self.stats["mu_y"]) / self.stats["sd_y"]
        losses = {}
        for k, member in enumerate(self.members):
            torch.manual_seed(cfg.run_seed * 1000 + k)
            member.train()
            for p in member.parameters():  # a second fit starts over, trainable again
                p.requires_grad_(True)
            for layer in member:
                if isinstance(layer, nn.Linear):
                    layer.reset_parameters()
            rng = np.random.default_rng([cfg.run_seed, k])
            opt = torch.optim.Adam(member.parameters(), lr=cfg.model_lr, weight_decay=1e-5)
            tail = []
            for step in range(cfg.model_steps):
                idx = torch.as_tensor(rng.integers(0, len(xt), cfg.model_batch))
                loss = ((member(xt[idx]) - yt[idx]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step >= cfg.model_steps - 50:
                    tail.append(float(loss.detach()))
            member.eval()
            for p in member.parameters():
                p.requires_grad_(False)
            losses[f"member{k}"] = float(np.mean(tail))
            log(f"input-driven model: member {k + 1}/{cfg.members}, loss "
                f"{losses[f'member{k}']:.3f} (normalised; 1 is the data's variance)")
        return losses

    @torch.no_grad()
    def step(self, obs: torch.Tensor, actions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(next endogenous columns, mean cost, the members' standard deviation of the
        cost, the mean extra counts (at least 0)) for a batch of observations and flat
        actions."""
        x = self._features(obs, actions)
        pred = torch.stack([m(x) for m in self.members]) * self.stats["sd_y"] + \
            self.stats["mu_y"]
        mean = pred.mean(0)
        k = len(self.endo)
        nxt = torch.minimum(torch.maximum(obs[:, self.endo] + mean[:, :k], self.stats["lo"]),
                            self.stats["hi"])
        cost = mean[:, k].clamp(float(self.stats["cost_lo"]), float(self.stats["cost_hi"]))
        spread = pred[:, :, k].std(0) if len(self.members) > 1 else torch.zeros_like(cost)
        return nxt, cost, spread, mean[:, k + 1:].clamp(min=0.0)

    def held_out_r2(self, obs: np.ndarray, actions: np.ndarray, costs: np.ndarray,
                    next_obs: np.ndarray) -> dict[str, float]:
        """R^2 of the ensemble mean on transitions it did not fit: per endogenous column
        change (``d<column index>``) and the cost."""
        nxt, cost, _, _ = self.step(torch.as_tensor(obs, dtype=torch.float32),
                                    torch.as_tensor(actions, dtype=torch.int64))
        out = {}
        true = next_obs[:, self.endo] - obs[:, self.endo]
        pred = nxt.numpy() - obs[:, self.endo]
        for j, col in enumerate(self.endo):
            var = float(np.var(true[:, j]))
            out[f"d{int(col)}"] = 1.0 - float(np.mean((pred[:, j] - true[:, j]) ** 2)) / var \
                if var > 0 else float("nan")
        var = float(np.var(costs))
        out["cost"] = 1.0 - float(np.mean((cost.numpy() - costs) ** 2)) / var if var > 0 \
            else float("nan")
        return out
