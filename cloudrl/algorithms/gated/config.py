"""``GatedDQNConfig``: masked Double DQN choosing the power-aware heuristic's preset each step.

RLlib's DQN, unchanged, with ``models.masked_dqn.MaskedDQNTorchRLModule`` on the gated env
(:mod:`envs.gated_env`, ``cloudrl/GatedController-v0``): the action is the index of a preset
of the heuristic's knobs (:mod:`cloudrl.algorithms.gated.controller`), and the heuristic
turns it into the branching action. ``training(heuristic=..., presets=...,
decision_every=...)`` sets the controller; :func:`configure_gated` (the algorithm row's
``configure`` hook, run after ``.environment()`` and ``.rl_module()``) points the env at
the gated env with that controller and records the controller in the module's
``model_config["gate"]``, so a checkpoint carries what it needs to act
(:class:`cloudrl.checkpoint_policy.CheckpointPolicy`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.algorithms.dqn.dqn import DQNConfig

from cloudrl.algorithms.gated.controller import CONTROLLER_PATH, DEFAULT_PRESETS
from envs.registration import GATED_ID

GATE_KEY = "gate"  # model_config entry: the gated env's controller settings


class GatedDQNConfig(DQNConfig):
    """``DQNConfig`` plus the controller: ``heuristic`` (PowerAwareConfig fields), ``presets``
    (knob changes per choice; preset 0 = the heuristic) and ``decision_every`` (ticks per
    choice)."""

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class)
        self.heuristic: dict[str, Any] = {}
        self.presets: list[dict[str, Any]] = [dict(p) for p in DEFAULT_PRESETS]
        self.decision_every = 1

    def training(self, *, heuristic: dict[str, Any] | None = NotProvided,
                 presets: list[dict[str, Any]] | None = NotProvided,
                 decision_every: int = NotProvided, **kwargs: Any) -> GatedDQNConfig:
        super().training(**kwargs)
        if heuristic is not NotProvided:
            self.heuristic = dict(heuristic or {})
        if presets is not NotProvided and presets is not None:
            self.presets = [dict(p) for p in presets]
        if decision_every is not NotProvided:
            self.decision_every = int(decision_every)
        return self

    def gate(self) -> dict[str, Any]:
        """The gated env's controller keys."""
        return {"controller": CONTROLLER_PATH,
                "controller_config": {"heuristic": self.heuristic, "presets": self.presets},
                "decision_every": self.decision_every}


def configure_gated(config: GatedDQNConfig) -> None:
    """Train on the gated env with ``config``'s controller; the module records it. On a
    scenario the env is already the gated scenario env (``cloudrl.training``: the
    signal-aware rule's presets, :mod:`cloudrl.algorithms.gated.scenario_presets`): the
    module records its controller."""
    if "scenario" in config.env_config:
        gate = {k: config.env_config[k] for k in ("controller", "controller_config")}
    else:
        gate = config.gate()
        config.environment(GATED_ID, env_config={**config.env_config, **gate})
    spec = config._rl_module_spec  # set by cloudrl.training.build_algo_config
    if spec is not None:
        config.rl_module(rl_module_spec=dataclasses.replace(
            spec, model_config={**(spec.model_config or {}), GATE_KEY: gate}))
