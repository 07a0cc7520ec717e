"""cloudrl's algorithms, one home each (as RLlib's ``rllib/algorithms/<name>/``).

* :mod:`cloudrl.algorithms.bdq`: Branching Dueling Q-Network (config + algorithm,
  learner, device-replay training step, typed hyperparameters);
* :mod:`cloudrl.algorithms.apex_bdq`: Ape-X BDQ (asynchronous actors, replay shards);
* :mod:`cloudrl.algorithms.ppo`, :mod:`~cloudrl.algorithms.dqn`,
  :mod:`~cloudrl.algorithms.appo`, :mod:`~cloudrl.algorithms.impala`: RLlib's own
  algorithms, here only their typed hyperparameter defaults;
  :mod:`~cloudrl.algorithms.masked_ppo`: RLlib's PPO config and learner plus the
  preference-alignment head (:mod:`~cloudrl.algorithms.alignment_head`, shared with BDQ);
* :mod:`cloudrl.algorithms.specs`: the table of all of them (``ALGORITHMS``).

Importing this package does not import Ray: the table names classes by import path.
"""
