"""The env's discrete actions and the MPC's continuous controls, both ways.

The scenario env turns action ``(i, j)`` into the controls ``(RELEASE_LEVELS[i],
ready(j))`` with ``ready(j) = min(lc_peak * (1 + READY_MARGINS[j]) + batch_now + spare,
fleet)`` (:func:`envs.scenario.control.release_and_ready`). The MPC sets ``(release_util,
ready_cores)`` freely; :func:`nearest_action` picks the release level nearest to its
``release_util`` and the margin whose ready cores are nearest to its ``ready_cores``
(the two controls are set independently, so this is the nearest action jointly; ties go
to the lower index). :class:`RoundedController` plays any controller through that
rounding: its cost minus the controller's is what the discretisation alone costs.

A learned policy may carry its own, finer grid of release levels (``release_levels``;
:data:`FINE_RELEASE_LEVELS`): the env's six levels lose what the MPC gains where its
release lies between them (on ``scarcity_low_load`` the MPC rounded to the env's grid
costs 5% more than the MPC, rounded to steps of 0.05 under 1% more), and its own grid of
ready margins (``ready_margins``; :data:`FINE_READY_MARGINS`).
"""

from __future__ import annotations

import numpy as np

from envs.scenario.control import Controller, PlanView, plan_view, release_and_ready
from envs.scenario.env import READY_MARGINS, RELEASE_LEVELS
from envs.scenario.sim import ScenarioSim

FINE_RELEASE_LEVELS = tuple(round(0.05 * i, 2) for i in range(21))  # 0, 0.05, ..., 1


# ready cores for the forecast peak times 1 + margin: finer steps, and below the peak
FINE_READY_MARGINS = (-0.5, -0.25, 0.0, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)


def check_release_levels(levels: tuple[float, ...], name: str = "release_levels",
                         lo: float = 0.0, hi: float = 1.5) -> tuple[float, ...]:
    """``levels`` as floats if they are a strictly increasing grid inside [lo, hi] with at
    least two levels; else a ValueError naming ``name`` and what is wrong."""
    out = tuple(float(x) for x in levels)
    if len(out) < 2 or any(not lo <= x <= hi for x in out) or \
            any(b <= a for a, b in zip(out, out[1:], strict=False)):
        raise ValueError(f"{name} {list(levels)}: expected at least 2 strictly "
                         f"increasing levels in [{lo:g}, {hi:g}]")
    return out


def check_ready_margins(margins: tuple[float, ...]) -> tuple[float, ...]:
    """A grid of ready margins: strictly increasing, inside [-1, 3]."""
    return check_release_levels(margins, "ready_margins", -1.0, 3.0)


def action_controls(v: PlanView, action: tuple[int, int],
                    release_levels: tuple[float, ...] = RELEASE_LEVELS,
                    ready_margins: tuple[float, ...] = READY_MARGINS) -> tuple[float, float]:
    """The controls the env sets for ``action`` in the state seen by ``v`` (with other
    grids, what a policy on those grids sets)."""
    i, j = int(action[0]), int(action[1])
    return release_and_ready(v, release_levels[i], ready_margins[j])


def nearest_action(v: PlanView, release_util: float, ready_cores: float,
                   release_levels: tuple[float, ...] = RELEASE_LEVELS,
                   ready_margins: tuple[float, ...] = READY_MARGINS) -> tuple[int, int]:
    """The action (on ``release_levels`` x ``ready_margins``) whose controls are nearest to
    ``(release_util, ready_cores)``."""
    i = int(np.argmin(np.abs(np.asarray(release_levels, dtype=float) - release_util)))
    ready = np.array([release_and_ready(v, 0.0, m)[1] for m in ready_margins])
    j = int(np.argmin(np.abs(ready - ready_cores)))
    return i, j


class RoundedController:
    """``inner``'s decisions rounded to the nearest env action (see the module docstring)."""

    clairvoyant = False

    def __init__(self, inner: Controller,
                 release_levels: tuple[float, ...] = RELEASE_LEVELS,
                 ready_margins: tuple[float, ...] = READY_MARGINS) -> None:
        self.inner = inner
        self.release_levels = release_levels
        self.ready_margins = ready_margins
        self.name = f"{inner.name}_rounded"

    @property
    def solve_times(self) -> list[float]:
        return getattr(self.inner, "solve_times", [])

    def reset(self, sim: ScenarioSim) -> None:
        self.inner.reset(sim)

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        release, ready = self.inner.decide(sim)
        v = plan_view(sim)
        a = nearest_action(v, release, ready, self.release_levels, self.ready_margins)
        return action_controls(v, a, self.release_levels, self.ready_margins)
