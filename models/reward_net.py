"""The learned reward of preference alignment: r(s) per step on the shared cluster encoder.

``RewardNet`` maps one observation (the Dict of the cluster envs: ``macro`` (..., M),
``servers`` (..., N, Fs), ``jobs`` (..., K, Fj)) to a scalar reward through the same fused
macro + micro :class:`~models.encoders.ClusterEncoder` the policies use, then a small MLP
head. A segment's return is the sum of its T per-step rewards (Christiano et al. 2017):
segment observations carry a step axis just before the feature axes
(``macro`` (B, T, M), ...) and :meth:`RewardNet.segment_return` sums over it.

Why r(s) and not r(s, a): the teacher ranks segments by their outcomes (SLA violations,
overload, slowdown spread, energy), which the observations carry (violation rate, power
draw, per-server load); and the action spaces differ between the flat and the branching
interface, while the observation is the same. A state-only reward therefore serves PPO,
APPO and BDQ alike, and the phase-3 reward connector needs only the observations.

Derived server features (``ServerFeatures``, optional): each server row gets two more
columns before the encoder, its utilisation ``max(cpu_util, 1 - mem_free / mem_cap)`` and
the indicator ``utilisation > threshold``. The teacher counts overloaded server-steps with
exactly this indicator; a row MLP fed only the raw columns has to learn the max and the
step from a few hundred segment-level labels, and does not (held-out pair accuracy 0.81
with the utilisation column alone vs 0.88 with the indicator too, 1,000 labels). The
columns are a function of the observation, so the reward stays r(s).

``RewardEnsemble`` holds k independently initialised nets; its prediction is the member
mean and its uncertainty the member standard deviation. torch only; imports nothing from
``cloudrl``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from models.encoders import ClusterEncoder, EncoderConfig, head

DEFAULT_HEAD_HIDDENS = (64,)


@dataclasses.dataclass(frozen=True)
class ServerFeatures:
    """Where the utilisation inputs sit in a server row, and the overload threshold."""

    cpu_util: int
    mem_cap: int
    mem_free: int
    threshold: float = 0.9

    def augment(self, servers: torch.Tensor) -> torch.Tensor:
        """(..., N, Fs) -> (..., N, Fs + 2): utilisation and the overload indicator."""
        cap = servers[..., self.mem_cap]
        used = cap - servers[..., self.mem_free]
        mem = torch.where(cap > 0, used / torch.where(cap > 0, cap, torch.ones_like(cap)),
                          torch.zeros_like(cap))
        util = torch.maximum(servers[..., self.cpu_util], mem)
        over = (util > self.threshold + 1e-6).to(servers.dtype)
        return torch.cat([servers, util.unsqueeze(-1), over.unsqueeze(-1)], -1)


def obs_space_from_dims(macro_dim: int, n_servers: int, server_dim: int, k_slots: int,
                        job_dim: int) -> gym.spaces.Dict:
    """The observation space the encoder needs, from the pair dataset's shape columns."""
    def box(*shape: int) -> gym.spaces.Box:
        return gym.spaces.Box(-np.inf, np.inf, shape=shape, dtype=np.float32)

    return gym.spaces.Dict({"macro": box(macro_dim), "servers": box(n_servers, server_dim),
                            "jobs": box(k_slots, job_dim)})


class RewardNet(nn.Module):
    """r(s): ClusterEncoder -> MLP head -> one scalar per observation."""

    def __init__(self, obs_space: gym.Space, encoder: EncoderConfig | None = None,
                 head_hiddens: Sequence[int] = DEFAULT_HEAD_HIDDENS,
                 server_features: ServerFeatures | None = None) -> None:
        super().__init__()
        self.server_features = server_features
        if server_features is not None:
            n, fs = obs_space["servers"].shape
            obs_space = gym.spaces.Dict({**obs_space.spaces, "servers": gym.spaces.Box(
                -np.inf, np.inf, shape=(n, fs + 2), dtype=np.float32)})
        self.encoder = ClusterEncoder(obs_space, encoder)
        self.head = head(self.encoder.output_dim, tuple(head_hiddens), 1,
                         self.encoder.config.activation, out_std=0.1)

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-observation reward: ``macro`` (..., M) -> (...)."""
        if self.server_features is not None:
            obs = {**obs, "servers": self.server_features.augment(obs["servers"])}
        return self.head(self.encoder(obs)).squeeze(-1)

    def segment_return(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Sum of the per-step rewards of segments (B, T, ...) -> (B,)."""
        return self(obs).sum(-1)


class RewardEnsemble(nn.Module):
    """k reward nets with their own initialisation; outputs stack the members first."""

    def __init__(self, obs_space: gym.Space, size: int = 1, encoder: EncoderConfig | None = None,
                 head_hiddens: Sequence[int] = DEFAULT_HEAD_HIDDENS,
                 server_features: ServerFeatures | None = None) -> None:
        super().__init__()
        if int(size) < 1:
            raise ValueError(f"ensemble size must be >= 1, got {size}")
        self.members = nn.ModuleList(RewardNet(obs_space, encoder, head_hiddens, server_features)
                                     for _ in range(int(size)))

    @property
    def size(self) -> int:
        return len(self.members)

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-step rewards of every member: (k, ...)."""
        return torch.stack([m(obs) for m in self.members])

    def segment_returns(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Segment returns of every member: segments (B, T, ...) -> (k, B)."""
        return self(obs).sum(-1)

    @torch.no_grad()
    def predict(self, obs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-step reward ensemble mean and standard deviation (0 for one member)."""
        rewards = self(obs)
        std = rewards.std(0, unbiased=False) if self.size > 1 else torch.zeros_like(rewards[0])
        return rewards.mean(0), std


def build_reward_ensemble(spec: Mapping[str, Any]) -> RewardEnsemble:
    """A ``RewardEnsemble`` from a plain spec (as stored next to a checkpoint's state dict).

    ``spec``: ``macro_dim``, ``n_servers``, ``server_dim``, ``k_slots``, ``job_dim``,
    ``ensemble_size``, ``encoder`` (``EncoderConfig`` fields), ``head_hiddens``, optional
    ``server_features`` (``ServerFeatures`` fields; absent or None: raw rows only).
    """
    space = obs_space_from_dims(int(spec["macro_dim"]), int(spec["n_servers"]),
                                int(spec["server_dim"]), int(spec["k_slots"]),
                                int(spec["job_dim"]))
    encoder = EncoderConfig(**dict(spec.get("encoder") or {}))
    extra = spec.get("server_features")
    return RewardEnsemble(space, int(spec.get("ensemble_size", 1)), encoder,
                          tuple(spec.get("head_hiddens", DEFAULT_HEAD_HIDDENS)),
                          ServerFeatures(**dict(extra)) if extra else None)


def encoder_spec(config: EncoderConfig) -> dict[str, Any]:
    """``EncoderConfig`` as plain lists/values (JSON- and torch.load-safe)."""
    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(config).items()}
