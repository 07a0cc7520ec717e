"""The policy interface every evaluator, trainer and service talks to.

A policy maps one observation of a cluster env (the Dict with ``macro``,
``servers``, ``jobs``, ``action_mask``) to an action of that env's interface:
an ``int`` for the flat env, an int vector for the branching env. Heuristics
and trained RLModules both implement it, so evaluation and serving have one
code path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

import numpy as np

from envs.env_config import EnvConfig

Interface = Literal["flat", "branching"]
INTERFACES: tuple[Interface, ...] = ("flat", "branching")


class Policy(Protocol):
    """Acts on observations of one env interface; ``reset`` is called at episode start."""

    name: str
    interface: Interface

    def reset(self) -> None: ...

    def act(self, obs: dict[str, np.ndarray]) -> int | np.ndarray: ...


def branch_layout(obs: dict[str, np.ndarray]) -> tuple[int, int, int, int]:
    """(K slots, N servers, T tiers, L priority levels) of a branching observation."""
    from envs.observation import SERVER_COLS

    k = obs["jobs"].shape[0]
    n = obs["servers"].shape[0]
    t = obs["servers"].shape[1] - len(SERVER_COLS)
    levels = obs["action_mask"].shape[0] - k * (n + 1) - 3 * t
    return k, n, t, levels


def make_env(env_config: EnvConfig | Mapping[str, Any] | None, interface: Interface):
    """The gymnasium env of ``interface`` (flat or branching) on ``env_config``."""
    from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv

    cls = ClusterSchedulingEnv if interface == "flat" else ClusterBranchingEnv
    return cls(EnvConfig.coerce(env_config))
