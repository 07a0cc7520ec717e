"""A gated controller env: the agent picks one of a controller's settings, the controller acts.

``GatedControllerEnv`` wraps the branching env (:class:`envs.cluster_env.ClusterBranchingEnv`).
Its action is ``Discrete(P)``: the index of one of the controller's P settings (e.g. presets
of a heuristic's headroom knobs). The controller turns (observation, setting) into the
branching action, every tick, for ``decision_every`` ticks; the step's reward is the sum of
those ticks' rewards and its ``info`` sums their numeric terms (``energy_kwh``,
``violations``, ``toggles`` ...). Every action is then a complete, sane policy, so
exploration never wrecks the cluster and a learner starts near the controller.

The controller is given in ``env_config`` as ``controller``: an object, or an import path
``"package.module:factory"`` called as ``factory(controller_config)`` (the way gymnasium
resolves entry points, so this package does not depend on the one that defines it). It has
``n_choices`` (P), ``reset()`` (episode start) and ``act(obs, choice)`` returning a
branching action for the inner env's observation ``obs``.

Observation: the inner Dict (``macro``, ``servers``, ``jobs``) with an all-ones
``action_mask`` of size P (every setting is always allowed). ``gated_observation`` builds it
from an inner observation, so a trained policy runs on the plain branching env (and on one
served observation, with no history) exactly as it was trained.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.cluster_env import ClusterBranchingEnv

_SUMMED_INFO = ("energy_kwh", "energy_norm", "violations", "late", "dropped", "finished",
                "toggles", "r_energy", "r_sla", "r_toggle", "r_invalid", "placement_conflicts")
GATED_KEYS = ("controller", "controller_config", "decision_every")


class Controller(Protocol):
    """Turns (inner observation, choice) into an action of the branching env."""

    n_choices: int

    def reset(self) -> None: ...

    def act(self, obs: dict[str, np.ndarray], choice: int) -> np.ndarray: ...


def resolve_controller(controller: Any, controller_config: Mapping[str, Any] | None) -> Any:
    """The controller object: as given, or built by the factory at ``"module:factory"``."""
    if not isinstance(controller, str):
        return controller
    module, _, attr = controller.partition(":")
    if not module or not attr:
        raise ValueError(f"controller {controller!r}: expected 'package.module:factory'")
    factory = getattr(importlib.import_module(module), attr)
    return factory(dict(controller_config or {}))


def gated_observation(obs: dict[str, np.ndarray], n_choices: int) -> dict[str, np.ndarray]:
    """The gated env's observation of the inner (branching) observation ``obs``."""
    return {"macro": obs["macro"], "servers": obs["servers"], "jobs": obs["jobs"],
            "action_mask": np.ones(n_choices, dtype=np.float32)}


class GatedControllerEnv(gym.Env):
    """``Discrete(P)`` choice of a controller setting over the branching cluster env."""

    metadata = {"render_modes": []}

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        cfg = dict(config or {})
        if "controller" not in cfg:
            raise ValueError("GatedControllerEnv needs env_config['controller'] "
                             "('package.module:factory' or a controller object)")
        controller = cfg.pop("controller")
        controller_config = cfg.pop("controller_config", None)
        self.decision_every = int(cfg.pop("decision_every", 1))
        if self.decision_every < 1:
            raise ValueError(f"decision_every must be >= 1, got {self.decision_every}")
        self.env = ClusterBranchingEnv(cfg)
        self.controller = resolve_controller(controller, controller_config)
        self.n_choices = int(self.controller.n_choices)
        if self.n_choices < 1:
            raise ValueError(f"the controller offers {self.n_choices} choices; need >= 1")
        self.action_space = spaces.Discrete(self.n_choices)
        inner = self.env.observation_space
        self.observation_space = spaces.Dict({
            "macro": inner["macro"], "servers": inner["servers"], "jobs": inner["jobs"],
            "action_mask": spaces.Box(0.0, 1.0, (self.n_choices,), np.float32),
        })
        self._obs: dict[str, np.ndarray] = {}

    @property
    def sim(self):
        """The simulator (its ``stats`` are the episode's metrics)."""
        return self.env.sim

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._obs, info = self.env.reset(seed=seed)
        self.controller.reset()
        return gated_observation(self._obs, self.n_choices), info

    def step(self, action):
        choice = int(np.asarray(action).reshape(()))
        if not 0 <= choice < self.n_choices:
            raise ValueError(f"action {choice} outside Discrete({self.n_choices})")
        total = 0.0
        summed = dict.fromkeys(_SUMMED_INFO, 0.0)
        invalid = False
        terminated = truncated = False
        for _ in range(self.decision_every):
            self._obs, reward, terminated, truncated, info = self.env.step(
                self.controller.act(self._obs, choice))
            total += reward
            invalid |= bool(info.get("invalid_action", False))
            for key in _SUMMED_INFO:
                summed[key] += float(info.get(key, 0.0))
            if terminated or truncated:
                break
        summed["invalid_action"] = invalid
        summed["choice"] = choice
        return gated_observation(self._obs, self.n_choices), total, terminated, truncated, summed
