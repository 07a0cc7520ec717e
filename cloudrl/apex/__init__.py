"""Ape-X style distributed BDQ on RLlib: asynchronous actors, replay shards, one learner.

RLlib 2.60 has no Ape-X (its DQN samples synchronously into a driver-local buffer); this
package builds one from RLlib primitives (env runner groups with async requests,
``FaultTolerantActorManager``, ``LearnerGroup``) and ``cloudrl.replay``:

* :mod:`cloudrl.apex.config`: :class:`ApexBDQConfig` (shards, capacity, broadcast interval,
  per-actor epsilon) and :func:`runner_epsilon`;
* :mod:`cloudrl.apex.runner`: what an actor (env runner) does per request;
* :mod:`cloudrl.apex.shard`: :class:`ReplayShard`, the replay actor (initial priorities);
* :mod:`cloudrl.apex.algorithm`: :class:`ApexBDQ` and its asynchronous ``training_step``.
"""

from cloudrl.apex.algorithm import APEX_RESULTS, ApexBDQ, ApexCounters
from cloudrl.apex.config import ApexBDQConfig, runner_epsilon
from cloudrl.apex.shard import ReplayShard

__all__ = ["APEX_RESULTS", "ApexBDQ", "ApexBDQConfig", "ApexCounters", "ReplayShard",
           "runner_epsilon"]
