"""Registers the cluster envs as gymnasium ids and as RLlib env names (same strings)."""

from __future__ import annotations

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


def register_rllib_envs() -> None:
    """``AlgorithmConfig().environment("cloudrl/ClusterScheduling-v0", env_config=...)``."""
    from ray.tune.registry import register_env

    from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv

    register_env(FLAT_ID, lambda ctx: ClusterSchedulingEnv(ctx))
    register_env(BRANCHING_ID, lambda ctx: ClusterBranchingEnv(ctx))
