"""BDQ (Tavakoli et al. 2018) on RLlib's DQN machinery, laid out as ``rllib/algorithms/dqn/``.

* :mod:`.bdq`: ``BDQConfig`` (a ``DQNConfig``) and ``BDQ`` (a ``DQN``);
* :mod:`.bdq_learner`: ``BDQTorchLearner``, the branching double-Q loss;
* :mod:`.training_step`: the training step on the device-resident replay.

The RLModule is ``models.bdq.BDQTorchRLModule``. Names are exported lazily (importing the
package does not import RLlib).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "BDQ": ".bdq", "BDQConfig": ".bdq", "register_bdq": ".bdq",
    "BDQTorchLearner": ".bdq_learner", "bdq_td_errors": ".bdq_learner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name], __name__), name)
