"""A mixin for RLModules whose layers do not depend on train/eval mode.

RLlib's ``TorchRLModule.forward_exploration`` / ``forward_inference`` wrap every call in
``self.eval()`` and ``self.train()``: two walks over all submodules per env-runner step
(~5% of masked PPO's and ~20% of BDQ's sampling time at 32 envs). A module without
dropout or batch norm computes the same in either mode, so the mixin calls the forward
passes directly. ``tests/test_envs_sampling_path.py`` checks both conditions per module.
"""

from __future__ import annotations

from typing import Any


class ModeFreeForwardMixin:
    """Put first in the bases, before ``TorchRLModule``."""

    def forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward_exploration(batch, **kwargs)

    def forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward_inference(batch, **kwargs)
