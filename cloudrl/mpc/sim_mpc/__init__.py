"""Plant-true planning on the scenario simulator: the sim-MPC and the hindsight oracle.

:class:`SimMPC` re-plans by the cross-entropy method over rollouts of the real
:class:`envs.scenario.sim.ScenarioSim` on sampled futures (never the realised one);
:class:`SimHindsightOracle` runs the same search on the realised future.
"""

from cloudrl.mpc.sim_mpc.controller import SimMPC, SimMPCConfig
from cloudrl.mpc.sim_mpc.hindsight import HINDSIGHT_DEFAULTS, SimHindsightOracle

__all__ = ["HINDSIGHT_DEFAULTS", "SimHindsightOracle", "SimMPC", "SimMPCConfig"]
