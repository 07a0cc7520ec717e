"""Ape-X style distributed BDQ on RLlib: asynchronous actors, replay shards, one learner.

RLlib 2.60 has no Ape-X (its DQN samples synchronously into a driver-local buffer); this
package builds one from RLlib primitives (env runner groups with async requests,
``FaultTolerantActorManager``, ``LearnerGroup``) and ``cloudrl.replay``:

* :mod:`.apex_bdq`: :class:`ApexBDQConfig` (shards, capacity, broadcast interval,
  per-actor epsilon) and :class:`ApexBDQ` with its asynchronous ``training_step``;
* :mod:`.runner`: what an actor (env runner) does per request, and
  :func:`runner_epsilon`;
* :mod:`.actor_side`: the actor's n-step windows and initial priorities;
* :mod:`.shard`: :class:`ReplayShard`, the replay actor.

The loss and the module are BDQ's (:mod:`cloudrl.algorithms.bdq`, ``models.bdq``).
Names are exported lazily (importing the package does not import Ray).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "APEX_RESULTS": ".apex_bdq", "ApexBDQ": ".apex_bdq", "ApexBDQConfig": ".apex_bdq",
    "ApexCounters": ".apex_bdq", "ReplayShard": ".shard", "runner_epsilon": ".runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name], __name__), name)
