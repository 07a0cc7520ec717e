"""Offline policy search in an input-driven model of the logged data.

In a scheduling system most of what a policy observes does not depend on what it does:
prices, carbon, solar, their forecasts, the arrival forecasts and the clock are inputs
(Mao et al. 2019, "Variance reduction for reinforcement learning in input-driven
environments"). Only the fleet's own state (awake, suspended and booting cores, committed
work, queues, the held pool and its deadlines) follows the actions. So a model of the
logged data need not learn the world, only that endogenous part: the inputs of any logged
day are replayed exactly as they were recorded, and an ensemble of networks steps the
endogenous state and the period's cost under any action.

* :mod:`.dynamics`: which observation columns are inputs (those every logged episode of a
  seed shares at every step), and the ensemble (:class:`InputDrivenModel`) fitted on every
  logged transition; its states stay inside the range the data covers.
* :mod:`.search`: evolution strategies on a policy's weights inside that model, along the
  logged days' input traces, on the mean model cost plus ``penalty`` times the ensemble's
  disagreement on it (the uncertainty penalty of MOPO, Yu et al. 2020); the iteration kept
  is the one with the lowest penalised cost on held-out logged days, the start competing;
  constrained, each class's predicted violations are held at the start's level along the
  rollouts and, optionally, at the logged states themselves (:func:`logged_counts`).
* :mod:`.gate`: for a release-capped search, the states the logs show to be nearly free
  of latency-critical violations, where the policy may release more than its anchor
  (:func:`cap_gate`).

No environment step is taken: everything comes from the logged episodes.
"""

from cloudrl.algorithms.model_es.config import ModelESConfig
from cloudrl.algorithms.model_es.dynamics import InputDrivenModel, input_columns
from cloudrl.algorithms.model_es.gate import cap_gate, counts_ahead
from cloudrl.algorithms.model_es.search import logged_counts, model_rollout, search

__all__ = ["InputDrivenModel", "ModelESConfig", "cap_gate", "counts_ahead", "input_columns",
           "logged_counts", "model_rollout", "search"]
