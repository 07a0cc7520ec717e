"""The scenario env with a gated action: the agent picks one of a controller's presets, the
controller sets the two controls.

``GatedScenarioEnv(config)`` takes :class:`~envs.scenario.env.ScenarioEnv`'s keys plus
``controller`` (an object, or an import path ``"package.module:factory"`` called as
``factory(controller_config)``, as :mod:`envs.gated_env` resolves it, so this package does
not depend on the one that defines the controller) and ``controller_config``. The
controller has ``n_choices`` (P), ``reset(sim)`` (episode start) and ``controls(view,
choice)`` returning ``(release target, ready cores)`` from what an online controller sees
(a :class:`~envs.scenario.control.PlanView`). The action is ``Discrete(P)``; observation,
reward and ``info`` are the scenario env's, one step per decision period. Every action is a
complete, sane policy (a preset of a tuned rule), so exploration never wrecks the episode
and a learner starts at the rule: the constant choice 0 is the rule itself when preset 0
is its base.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces

from envs.gated_env import resolve_controller
from envs.scenario.base import ScenarioEnv
from envs.scenario.control import PlanView
from envs.scenario.sim import ScenarioSim

GATED_SCENARIO_KEYS = ("controller", "controller_config")


class ScenarioPresets(Protocol):
    """Turns (plan view, choice) into the scenario's two controls."""

    n_choices: int

    def reset(self, sim: ScenarioSim) -> None: ...

    def controls(self, view: PlanView, choice: int) -> tuple[float, float]: ...


class GatedScenarioEnv(ScenarioEnv):
    """``Discrete(P)`` choice of a scenario controller's preset; see the module docstring."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        cfg = dict(config or {})
        if "controller" not in cfg:
            raise ValueError("GatedScenarioEnv needs config['controller'] "
                             "('package.module:factory' or a controller object)")
        controller = resolve_controller(cfg.pop("controller"), cfg.pop("controller_config", None))
        super().__init__(cfg)
        self.controller = controller
        self.n_choices = int(controller.n_choices)
        if self.n_choices < 1:
            raise ValueError(f"the controller offers {self.n_choices} choices; need >= 1")
        self.action_space = spaces.Discrete(self.n_choices)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        out = super().reset(seed=seed, options=options)
        self.controller.reset(self.sim)
        return out

    def controls(self, action) -> tuple[float, float]:
        a = np.asarray(action).reshape(-1)
        if a.shape != (1,) or not 0 <= int(a[0]) < self.n_choices or int(a[0]) != a[0]:
            raise ValueError(f"action {action!r} outside Discrete({self.n_choices})")
        return self.controller.controls(self._view, int(a[0]))
