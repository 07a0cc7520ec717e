"""The env's discrete actions and the MPC's continuous controls, both ways.

The scenario env turns action ``(i, j)`` into the controls ``(RELEASE_LEVELS[i],
ready(j))`` with ``ready(j) = min(lc_peak * (1 + READY_MARGINS[j]) + batch_now + spare,
fleet)`` (:func:`envs.scenario.control.release_and_ready`). The MPC sets ``(release_util,
ready_cores)`` freely; :func:`nearest_action` picks the release level nearest to its
``release_util`` and the margin whose ready cores are nearest to its ``ready_cores``
(the two controls are set independently, so this is the nearest action jointly; ties go
to the lower index). :class:`RoundedController` plays any controller through that
rounding: its cost minus the controller's is what the discretisation alone costs.
"""

from __future__ import annotations

import numpy as np

from envs.scenario.control import Controller, PlanView, plan_view, release_and_ready
from envs.scenario.env import READY_MARGINS, RELEASE_LEVELS
from envs.scenario.sim import ScenarioSim

_RELEASE = np.asarray(RELEASE_LEVELS, dtype=float)


def action_controls(v: PlanView, action: tuple[int, int]) -> tuple[float, float]:
    """The controls the env sets for ``action`` in the state seen by ``v``."""
    i, j = int(action[0]), int(action[1])
    return release_and_ready(v, RELEASE_LEVELS[i], READY_MARGINS[j])


def nearest_action(v: PlanView, release_util: float, ready_cores: float) -> tuple[int, int]:
    """The env action whose controls are nearest to ``(release_util, ready_cores)``."""
    i = int(np.argmin(np.abs(_RELEASE - release_util)))
    ready = np.array([release_and_ready(v, 0.0, m)[1] for m in READY_MARGINS])
    j = int(np.argmin(np.abs(ready - ready_cores)))
    return i, j


class RoundedController:
    """``inner``'s decisions rounded to the nearest env action (see the module docstring)."""

    clairvoyant = False

    def __init__(self, inner: Controller) -> None:
        self.inner = inner
        self.name = f"{inner.name}_rounded"

    @property
    def solve_times(self) -> list[float]:
        return getattr(self.inner, "solve_times", [])

    def reset(self, sim: ScenarioSim) -> None:
        self.inner.reset(sim)

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        release, ready = self.inner.decide(sim)
        v = plan_view(sim)
        return action_controls(v, nearest_action(v, release, ready))
