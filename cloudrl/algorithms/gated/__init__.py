"""A gated controller over the power-aware heuristic, learned with masked Double DQN.

* :mod:`.controller`: the heuristic with P presets of its headroom knobs (preset 0 = the
  heuristic itself) as the controller of the gated env (:mod:`envs.gated_env`);
* :mod:`.config`: ``GatedDQNConfig`` (a ``DQNConfig``) and the algorithm row's hook that
  trains on the gated env;
* :mod:`.hparams`: ``GatedHparams`` (``cloudrl train --algo gated_dqn --hparams ...``).

The agent picks a preset every ``decision_every`` ticks; every choice is a sane policy, so
exploration is cheap and the policy starts near the heuristic. It can only win where a
state-dependent setting beats the best constant one.
"""
