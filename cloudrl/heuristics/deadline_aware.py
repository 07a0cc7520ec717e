"""The deadline-aware rule: the signal-aware deferral, plus release by deadline.

The signal-aware rule (:mod:`cloudrl.heuristics.signal_aware`) holds batch work while the
grid is dear and leaves the rest to the executor, which releases a held job only once its
latest start is ``executor.force_margin_min`` away, whatever its size or the fleet's state.
A forced release that then waits for a booting server, or behind other forced work, misses
its deadline. This rule adds a guard, in earliest-deadline-first order (the order the
executor's pool already keeps):

* a held job is **due** once its slack (latest start minus now) falls below
  ``slack_k`` times its own duration plus ``wait_factor`` times the boot time (the wait of
  a released job when capacity has to be woken first);
* the release level is raised, when it is lower, to cover the committed work plus every due
  job: ``(committed + due cores) / fleet cores``, so the executor releases the due jobs
  first (they head the pool) whether or not the grid is cheap.

Its knobs and the signal-aware ones are tuned together on validation seeds
(:func:`cloudrl.scenarios.tuning.tune` with ``kind="deadline_aware"``). With ``slack_k =
wait_factor = 0`` only overdue jobs are due, which the executor releases anyway, and it
plays as the signal-aware rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cloudrl.heuristics.signal_aware import SignalAwareConfig, SignalAwareDeferral
from envs.scenario.control import PlanView, release_and_ready


@dataclass(frozen=True)
class DeadlineAwareConfig(SignalAwareConfig):
    slack_k: float = 1.0  # due once slack < slack_k x duration + wait_factor x boot time
    wait_factor: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.slack_k <= 20.0:
            raise ValueError(f"DeadlineAwareConfig.slack_k must be in [0, 20], got {self.slack_k}")
        if not 0.0 <= self.wait_factor <= 20.0:
            raise ValueError("DeadlineAwareConfig.wait_factor must be in [0, 20], got "
                             f"{self.wait_factor}")


def due_mask(v: PlanView, slack_k: float, wait_factor: float) -> np.ndarray:
    """Which held jobs are due (module docstring), in pool order."""
    slack = v.pool_latest - v.t
    return slack < slack_k * v.pool_duration + wait_factor * v.boot_ticks


class DeadlineAwareDeferral(SignalAwareDeferral):
    """The signal-aware rule with an earliest-deadline-first release guard."""

    name = "deadline_aware"
    clairvoyant = False

    def __init__(self, config: DeadlineAwareConfig | None = None, **overrides) -> None:
        base = config or DeadlineAwareConfig()
        self.config = DeadlineAwareConfig(**{**base.__dict__, **overrides}) if overrides \
            else base

    def decide_view(self, v: PlanView) -> tuple[float, float]:
        release, _ = super().decide_view(v)
        cfg = self.config
        due = due_mask(v, cfg.slack_k, cfg.wait_factor)
        if due.any():
            running = float(v.running[:, 0].sum()) if v.running.shape[1] else 0.0
            committed = running + float(sum(v.queued))
            need = (committed + float(v.pool_cores[due].sum())) / v.fleet_cores
            release = max(release, need)
        return release_and_ready(v, release, cfg.ready_margin)
