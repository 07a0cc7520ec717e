"""Registers the cluster envs as gymnasium ids and as RLlib env names (same strings)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

FLAT_ID = "cloudrl/ClusterScheduling-v0"
BRANCHING_ID = "cloudrl/ClusterBranching-v0"
_ENTRY_POINTS = {
    FLAT_ID: "envs.cluster_env:ClusterSchedulingEnv",
    BRANCHING_ID: "envs.cluster_env:ClusterBranchingEnv",
}


def register_gymnasium_envs() -> None:
    """``gym.make("cloudrl/ClusterScheduling-v0", config={...})`` after this (idempotent)."""
    for env_id, entry_point in _ENTRY_POINTS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True)


class _ScaledReward(gym.RewardWrapper):
    """Multiplies rewards by a constant (learning-side scaling; ``info`` keeps raw terms)."""

    def __init__(self, env: gym.Env, scale: float) -> None:
        super().__init__(env)
        self.scale = scale

    def reward(self, reward: float) -> float:
        return reward * self.scale


def make_rllib_env(env_cls: type[gym.Env], env_config: Mapping[str, Any]) -> gym.Env:
    """An env from an RLlib ``EnvContext``; an optional ``reward_scale`` key wraps it."""
    cfg = dict(env_config)
    scale = cfg.pop("reward_scale", None)
    env = env_cls(cfg)
    return _ScaledReward(env, float(scale)) if scale not in (None, 1.0) else env


def register_rllib_envs() -> None:
    """``AlgorithmConfig().environment("cloudrl/ClusterScheduling-v0", env_config=...)``."""
    from ray.tune.registry import register_env

    from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv

    register_env(FLAT_ID, lambda ctx: make_rllib_env(ClusterSchedulingEnv, ctx))
    register_env(BRANCHING_ID, lambda ctx: make_rllib_env(ClusterBranchingEnv, ctx))
