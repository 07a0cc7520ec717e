"""The learned reward of preference alignment: r(s, s') per step on the shared cluster encoder.

``RewardNet`` maps one transition, the observation a step started from and the one it
led to (Dicts of the cluster envs: ``macro`` (..., M), ``servers`` (..., N, Fs), ``jobs``
(..., K, Fj)), to a scalar reward through the same fused macro + micro
:class:`~models.encoders.ClusterEncoder` the policies use, then a small MLP head. A
segment's return is the sum of its T per-step rewards (Christiano et al. 2017): segment
observations carry a step axis just before the feature axes (``macro`` (B, T+1, M), ...)
and :meth:`RewardNet.segment_return` sums over the T transitions. Without transition
features (below) the net is a state reward r(s'), scoring every observation it is given.

Why (s, s') and not (s, a, s'): the teacher ranks segments by their outcomes (SLA
violations, overload, slowdown spread, energy), which the observations carry, and the
action spaces differ between the flat and the branching interface while the observation
is the same; an observation-only reward serves PPO, APPO and BDQ alike, and the phase-3
connector needs only the observations. Why (s, s') and not s': the SLA violations of a
step (late finishes + drops, a third of the teacher's decisions) are not in any single
observation; the macro ``violation_rate`` is their EMA, ``ema' = ema + a (v - ema)``.

Derived transition features (``TransitionFeatures``, optional): the post-step macro
vector gets one more column, the step's violations recovered from the two EMA values,
``v = (ema' - (1 - a) ema) / a`` (a = the simulator's ``envs.sim._EMA``, 0.05; exact up to
float32 rounding, checked against the env's ``info["violations"]`` in the tests). The
other inputs are those of s'. A net fed the raw (s, s') pair, or s' plus the difference
s' - s, has to learn the division by a from a few hundred labels; with the column the
held-out pair accuracy at 1,000 labels went from 0.86 (r(s')) to 0.93
(``experiments/benchmarks/bench_reward_model.py``).

Derived server features (``ServerFeatures``, optional): each server row gets two more
columns before the encoder, its utilisation ``max(cpu_util, 1 - mem_free / mem_cap)`` and
the indicator ``utilisation > threshold``. The teacher counts overloaded server-steps with
exactly this indicator; a row MLP fed only the raw columns has to learn the max and the
step from a few hundred segment-level labels, and does not (held-out pair accuracy 0.81
with the utilisation column alone vs 0.88 with the indicator too, 1,000 labels). The
columns are a function of the observation.

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


@dataclasses.dataclass(frozen=True)
class TransitionFeatures:
    """Where the violation EMA sits in the macro vector, and the EMA's weight a."""

    violation_rate: int
    ema: float = 0.05

    def violations(self, prev_macro: torch.Tensor, next_macro: torch.Tensor) -> torch.Tensor:
        """The step's SLA violations from the EMA before and after it: (...)."""
        i, a = self.violation_rate, self.ema
        return (next_macro[..., i] - (1.0 - a) * prev_macro[..., i]) / a

    def augment(self, prev_macro: torch.Tensor, next_macro: torch.Tensor) -> torch.Tensor:
        """(..., M) twice -> (..., M + 1): the post-step macro and the step's violations."""
        return torch.cat([next_macro, self.violations(prev_macro, next_macro).unsqueeze(-1)],
                         -1)


def _steps(obs: Mapping[str, torch.Tensor], part_slice: slice) -> dict[str, torch.Tensor]:
    """The step-axis slice of segment observations (the axis before each part's features)."""
    return {"macro": obs["macro"][..., part_slice, :],
            "servers": obs["servers"][..., part_slice, :, :],
            "jobs": obs["jobs"][..., part_slice, :, :]}


def obs_space_from_dims(macro_dim: int, n_servers: int, server_dim: int, k_slots: int,
                        job_dim: int) -> gym.spaces.Dict:
    """The observation space the encoder needs, from the pair dataset's shape columns."""
    def box(*shape: int) -> gym.spaces.Box:
        return gym.spaces.Box(-np.inf, np.inf, shape=shape, dtype=np.float32)

    return gym.spaces.Dict({"macro": box(macro_dim), "servers": box(n_servers, server_dim),
                            "jobs": box(k_slots, job_dim)})


class RewardNet(nn.Module):
    """r(s, s') (or r(s') without transition features): ClusterEncoder -> MLP head."""

    def __init__(self, obs_space: gym.Space, encoder: EncoderConfig | None = None,
                 head_hiddens: Sequence[int] = DEFAULT_HEAD_HIDDENS,
                 server_features: ServerFeatures | None = None,
                 transition_features: TransitionFeatures | None = None) -> None:
        super().__init__()
        self.server_features = server_features
        self.transition_features = transition_features
        spaces = dict(obs_space.spaces)
        if server_features is not None:
            n, fs = obs_space["servers"].shape
            spaces["servers"] = gym.spaces.Box(-np.inf, np.inf, shape=(n, fs + 2),
                                               dtype=np.float32)
        if transition_features is not None:
            (m,) = obs_space["macro"].shape
            spaces["macro"] = gym.spaces.Box(-np.inf, np.inf, shape=(m + 1,), dtype=np.float32)
        self.encoder = ClusterEncoder(gym.spaces.Dict(spaces), encoder)
        self.head = head(self.encoder.output_dim, tuple(head_hiddens), 1,
                         self.encoder.config.activation, out_std=0.1)

    @property
    def transition(self) -> bool:
        """Whether the reward reads the observation before the step too."""
        return self.transition_features is not None

    def reward(self, prev: Mapping[str, torch.Tensor] | None,
               nxt: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-transition reward of aligned observations ``macro`` (..., M) -> (...);
        ``prev`` (the observation the step started from) is ignored by a state net."""
        obs = dict(nxt)
        if self.transition_features is not None:
            if prev is None:
                raise ValueError("a transition reward r(s, s') needs the observation before "
                                 "the step")
            obs["macro"] = self.transition_features.augment(prev["macro"], nxt["macro"])
        if self.server_features is not None:
            obs["servers"] = self.server_features.augment(obs["servers"])
        return self.head(self.encoder(obs)).squeeze(-1)

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-step rewards of observations with a step axis (``macro`` (..., O, M)):
        a transition net scores the O-1 consecutive pairs, a state net the O observations."""
        if not self.transition:
            return self.reward(None, obs)
        return self.reward(_steps(obs, slice(None, -1)), _steps(obs, slice(1, None)))

    def segment_return(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Sum of the per-step rewards of segments (B, O, ...) -> (B,)."""
        return self(obs).sum(-1)


class RewardEnsemble(nn.Module):
    """k reward nets with their own initialisation; outputs stack the members first."""

    def __init__(self, obs_space: gym.Space, size: int = 1, encoder: EncoderConfig | None = None,
                 head_hiddens: Sequence[int] = DEFAULT_HEAD_HIDDENS,
                 server_features: ServerFeatures | None = None,
                 transition_features: TransitionFeatures | None = None) -> None:
        super().__init__()
        if int(size) < 1:
            raise ValueError(f"ensemble size must be >= 1, got {size}")
        self.members = nn.ModuleList(RewardNet(obs_space, encoder, head_hiddens, server_features,
                                               transition_features)
                                     for _ in range(int(size)))

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def transition(self) -> bool:
        """Whether the members are transition rewards r(s, s') (segments of T+1 observations)."""
        return self.members[0].transition

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-step rewards of every member along the step axis: (k, ...)."""
        return torch.stack([m(obs) for m in self.members])

    def rewards(self, prev: Mapping[str, torch.Tensor] | None,
                nxt: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-transition rewards of every member for aligned observations: (k, ...)."""
        return torch.stack([m.reward(prev, nxt) for m in self.members])

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
    ``server_features`` (``ServerFeatures`` fields; absent or None: raw rows only) and
    ``transition_features`` (``TransitionFeatures`` fields; absent or None, as in
    checkpoints from before transition rewards: a state reward r(s')).
    """
    space = obs_space_from_dims(int(spec["macro_dim"]), int(spec["n_servers"]),
                                int(spec["server_dim"]), int(spec["k_slots"]),
                                int(spec["job_dim"]))
    encoder = EncoderConfig(**dict(spec.get("encoder") or {}))
    extra = spec.get("server_features")
    trans = spec.get("transition_features")
    return RewardEnsemble(space, int(spec.get("ensemble_size", 1)), encoder,
                          tuple(spec.get("head_hiddens", DEFAULT_HEAD_HIDDENS)),
                          ServerFeatures(**dict(extra)) if extra else None,
                          TransitionFeatures(**dict(trans)) if trans else None)


def encoder_spec(config: EncoderConfig) -> dict[str, Any]:
    """``EncoderConfig`` as plain lists/values (JSON- and torch.load-safe)."""
    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(config).items()}
