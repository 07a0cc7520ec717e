"""The scenario env in the masked Dict layout RLlib trains on, over its three interfaces.

:class:`MaskedScenarioEnv` wraps the flat, branching (:mod:`envs.scenario.base`) or gated
(:mod:`envs.scenario.gated`) scenario env. The single env itself lives in
:mod:`envs.scenario.base`; its names are re-exported here, where checkpoints and callers
have always found them (``envs.scenario.env.ScenarioEnv``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.scenario.base import (
    OBS_NAMES,
    READY_MARGINS,
    RELEASE_LEVELS,
    ScenarioEnv,
    ScenarioFlatEnv,
    observe,
)
from envs.scenario.gated import GatedScenarioEnv

__all__ = [
    "MASKED_OBS_KEYS",
    "OBS_NAMES",
    "READY_MARGINS",
    "RELEASE_LEVELS",
    "MaskedScenarioEnv",
    "ScenarioEnv",
    "ScenarioFlatEnv",
    "masked_observation",
    "observe",
]

MASKED_OBS_KEYS = ("macro", "servers", "jobs", "action_mask")


def masked_observation(obs: np.ndarray, mask_size: int) -> dict[str, np.ndarray]:
    """The scenario observation in the layout of the cluster envs' masked RLModules: the
    34 floats as ``macro``, one all-zero row each for ``servers`` and ``jobs``, and an
    all-ones ``action_mask`` of ``mask_size`` (every scenario action is always feasible)."""
    return {"macro": np.asarray(obs, dtype=np.float32),
            "servers": np.zeros((1, 1), np.float32), "jobs": np.zeros((1, 1), np.float32),
            "action_mask": np.ones(mask_size, np.float32)}


class MaskedScenarioEnv(gym.Wrapper):
    """The scenario env with the Dict observation the project's masked RLModules read.

    ``config``: :class:`ScenarioEnv`'s keys plus ``interface`` (``"flat"``: the
    ``Discrete`` :class:`ScenarioFlatEnv`, a 24-long mask; ``"branching"``: the
    ``MultiDiscrete`` :class:`ScenarioEnv`, the two branch masks concatenated, 6 + 4;
    ``"gated"``: :class:`envs.scenario.gated.GatedScenarioEnv`, one entry per preset) and
    ``seed_pool`` (a list of episode seeds: each reset plays one drawn from it by the
    wrapper's generator, which ``reset(seed=s)`` reseeds, so RLlib's per-env reset seeds
    stay inside the pool; None: ``reset(seed=s)`` plays episode ``s``). The observation is
    :func:`masked_observation`: the modules' encoder sees the 34 floats as its macro input
    and one constant row of servers and of jobs; the all-ones mask leaves every action
    open. Rewards, actions and ``info`` are the inner env's.
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        cfg = dict(config or {})
        interface = cfg.pop("interface", "branching")
        pool = cfg.pop("seed_pool", None)
        if interface == "flat":
            env: ScenarioEnv = ScenarioFlatEnv(cfg)
            self.mask_size = int(env.action_space.n)
        elif interface == "branching":
            env = ScenarioEnv(cfg)
            self.mask_size = int(env.action_space.nvec.sum())
        elif interface == "gated":
            env = GatedScenarioEnv(cfg)
            self.mask_size = int(env.action_space.n)
        else:
            raise ValueError(f"MaskedScenarioEnv: interface must be 'flat', 'branching' or "
                             f"'gated', got {interface!r}")
        super().__init__(env)
        self.interface = interface
        self.seed_pool = [int(s) for s in pool] if pool is not None else None
        self._rng = np.random.default_rng()
        self.observation_space = spaces.Dict({
            "macro": env.observation_space,
            "servers": spaces.Box(-1.0, 1.0, (1, 1), np.float32),  # always 0
            "jobs": spaces.Box(-1.0, 1.0, (1, 1), np.float32),
            "action_mask": spaces.Box(0.0, 1.0, (self.mask_size,), np.float32)})

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self.seed_pool is not None:
            if seed is not None:
                self._rng = np.random.default_rng(seed)
            seed = self.seed_pool[int(self._rng.integers(len(self.seed_pool)))]
        obs, info = self.env.reset(seed=seed, options=options)
        return masked_observation(obs, self.mask_size), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return masked_observation(obs, self.mask_size), reward, terminated, truncated, info
