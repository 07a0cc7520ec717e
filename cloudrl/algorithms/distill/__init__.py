"""Distil the forecast MPC of a scenario into a small learned policy (behaviour cloning +
DAgger), so that MPC-quality decisions come at the cost of one MLP forward pass.

* :mod:`.actions` maps the MPC's continuous controls to the env's nearest discrete action
  (and back), and the "MPC rounded to env actions" controller that measures what the
  discretisation alone costs;
* :mod:`.data` records (observation, expert action) pairs on TRAIN seeds: the expert's
  own episodes, and the states the learned policy visits labelled by the expert (DAgger);
* :mod:`.learner` fits the :class:`models.scenario_policy.ScenarioPolicyModule` RLModule
  by per-branch cross-entropy (a plain torch loop over the module's parameters);
* :mod:`.policy` plays a module as a scenario controller and saves / loads checkpoints;
* :mod:`.algorithm` runs the rounds and selects the round on validation seeds.
"""

from cloudrl.algorithms.distill.config import DistillConfig

__all__ = ["DistillConfig"]
