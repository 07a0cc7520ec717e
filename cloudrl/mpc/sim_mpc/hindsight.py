"""The hindsight oracle: the sim-MPC's search run on the realised future.

It plans exactly as :class:`SimMPC` does, but on one future only, the true one (every
arrival and signal value of the episode: ``samples = 1``, clairvoyant), with a longer
search budget, and warm-started also from the fluid oracle's replayed schedule
(:class:`cloudrl.mpc.oracle.ClairvoyantOracle`, moved to the nearest menu point). The
plans it finds are played through the simulator, so its cost is that of a schedule the
simulator ran: achievable, the best this search finds with hindsight - not a bound.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from cloudrl.mpc.oracle import ClairvoyantOracle
from cloudrl.mpc.sim_mpc.controller import SimMPC, SimMPCConfig, menu_point
from envs.scenario.control import PlanView
from envs.scenario.sim import ScenarioSim

HINDSIGHT_DEFAULTS = SimMPCConfig(samples=1, horizon=12, block_periods=2, iterations=4,
                                  population=24, elites=5)


class SimHindsightOracle(SimMPC):
    """:class:`SimMPC` on the realised future; see the module docstring."""

    name = "sim_hindsight"
    clairvoyant = True

    def __init__(self, config: SimMPCConfig | None = None, warm_oracle: bool = True,
                 **overrides) -> None:
        super().__init__(replace(config or HINDSIGHT_DEFAULTS, samples=1), **overrides)
        self.warm_oracle = warm_oracle

    def reset(self, sim: ScenarioSim) -> None:
        super().reset(sim)
        if self.warm_oracle:
            oracle = ClairvoyantOracle()
            oracle.reset(sim)
            self._oracle_controls = oracle._schedule  # (release, ready) per period
        else:
            self._oracle_controls = []

    def futures(self, sim: ScenarioSim, v: PlanView) -> list[ScenarioSim]:
        return [sim.clone()]

    def warm_starts(self, sim: ScenarioSim, v: PlanView) -> list[np.ndarray]:
        out = super().warm_starts(sim, v)
        p = sim.t // sim.cfg.decision_ticks
        if p < len(self._oracle_controls):
            cfg = self.config
            first = menu_point(v, *self._oracle_controls[p])
            # later periods' ready cores depend on states not reached yet: their release
            # levels are the oracle's, their margins the first period's
            rel = [self._oracle_controls[min(p + i, len(self._oracle_controls) - 1)][0]
                   for i in range(0, cfg.horizon, cfg.block_periods)][:cfg.blocks]
            plan = np.repeat(first[None, :], cfg.blocks, axis=0)
            plan[:, 0] = np.clip(rel, 0.0, 1.0)
            out.insert(0, plan)
        return out
