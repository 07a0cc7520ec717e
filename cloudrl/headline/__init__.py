"""The headline result: tuned heuristic, learned policy, clairvoyant bound, one command.

* :mod:`cloudrl.headline.tuning`: ``cloudrl tune-heuristic``, a Ray Tune sweep over
  ``PowerAwareConfig`` on the train seeds, and the tuned-parameters JSON it writes;
* :mod:`cloudrl.headline.config`: the typed ``experiments/configs/headline.yaml``;
* :mod:`cloudrl.headline.pipeline`: ``cloudrl headline``: tune, train, select on the
  validation seeds, evaluate on the test seeds;
* :mod:`cloudrl.headline.report`: paired statistics, the table, the Pareto plot.
"""
