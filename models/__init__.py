"""RLModules: encoders, masked PPO/DQN, BDQ."""

from __future__ import annotations

from importlib import import_module
from typing import Any

# Lazy exports: `import models.encoders` must not pull in RLlib.
_EXPORTS = {
    "ClusterEncoder": "models.encoders",
    "EncoderConfig": "models.encoders",
    "feasible_actions": "models.encoders",
    "MaskedPPOTorchRLModule": "models.masked_ppo",
    "MaskedDQNTorchRLModule": "models.masked_dqn",
    "BDQTorchRLModule": "models.bdq",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
