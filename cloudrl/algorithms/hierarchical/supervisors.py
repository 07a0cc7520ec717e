"""Supervisors: map the macro state to the index of the sub-agent that acts next.

* :class:`RuleSupervisor`: the baseline; the SLA specialist when the cluster is
  loaded (mean tier utilisation, queue fill or recent violation rate above a
  threshold), the power specialist otherwise;
* :class:`FixedSupervisor`: always the same sub-agent (tests, ablations);
* :class:`ModuleSupervisor`: a trained ``SupervisorPPOTorchRLModule``, greedy by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.observation import MACRO_TAIL

_QUEUE_FILL = MACRO_TAIL.index("queue_fill") - len(MACRO_TAIL)
_VIOLATIONS = MACRO_TAIL.index("violation_rate") - len(MACRO_TAIL)


def tier_load(macro: np.ndarray) -> float:
    """Mean over tiers of the used-CPU fraction (the first T entries of ``macro``)."""
    n_tiers = (len(macro) - len(MACRO_TAIL)) // 4
    return float(np.mean(macro[:n_tiers]))


@dataclass
class RuleSupervisor:
    """Thresholds on load: ``sla`` when any of load, queue fill, violation rate is high."""

    power: int = 0  # index of the power specialist
    sla: int = 1  # index of the SLA specialist
    load_threshold: float = 0.5
    queue_threshold: float = 0.05
    violation_threshold: float = 0.02
    name: str = "rule"

    def choose(self, macro: np.ndarray) -> int:
        busy = (tier_load(macro) > self.load_threshold
                or macro[_QUEUE_FILL] > self.queue_threshold
                or macro[_VIOLATIONS] > self.violation_threshold)
        return self.sla if busy else self.power


@dataclass
class FixedSupervisor:
    """Always sub-agent ``index``."""

    index: int
    name: str = "fixed"

    def choose(self, macro: np.ndarray) -> int:
        return self.index


class ModuleSupervisor:
    """A trained supervisor module; ``greedy``: most probable sub-agent, else sampled."""

    name = "ppo"

    def __init__(self, module, greedy: bool = True, seed: int = 0) -> None:
        import torch

        self.module, self.greedy, self.seed = module, greedy, seed
        self._torch = torch
        self._rng = np.random.default_rng(seed)

    def reset(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def logits(self, macro: np.ndarray) -> np.ndarray:
        torch = self._torch
        obs = torch.from_numpy(np.asarray(macro, dtype=np.float32)[None])
        with torch.no_grad():
            out = self.module.forward_inference({"obs": obs})["action_dist_inputs"]
        return out[0].numpy()

    def choose(self, macro: np.ndarray) -> int:
        logits = self.logits(macro)
        if self.greedy:
            return int(np.argmax(logits))
        p = np.exp(logits - logits.max())
        return int(self._rng.choice(len(p), p=p / p.sum()))
