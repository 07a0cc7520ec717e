"""The three power-oblivious baselines: Round-Robin, Shortest-Job-First, First-Fit-Decreasing.

None of them toggles power (tier decisions always hold). In the branching
interface each fills every slot with its rule in one tick, and the queue
priority level is 0 (FIFO) for Round-Robin and FFD. SJF picks among the
visible jobs only, so it asks for least-slack-first (level L-1) to keep the
jobs nearest their deadline in the window: on train seeds 0..9 that is no
different at N=50 (the queue never backs up) and slightly fewer violations at
N=15 (poisson: 0.3 vs 0.5 per 1000-tick episode).
"""

from __future__ import annotations

import numpy as np

from cloudrl.heuristics.base import HeuristicPolicy, JointPlan, ObsView
from envs.observation import J

_CPU, _MEM, _DUR = J["cpu"], J["mem"], J["duration"]


class RoundRobin(HeuristicPolicy):
    """Head-of-queue job onto the next feasible server after a rotating pointer.

    Flat: only slot 0 is considered (head-of-line blocking, as classic RR).
    Branching: slots 0..K-1 in queue order, each onto the next feasible server
    after the pointer, which advances with every placement.
    """

    name = "round_robin"

    def reset(self) -> None:
        self._pointer = -1

    def _job_order(self, view: ObsView, flat: bool) -> np.ndarray:
        if flat:
            return np.flatnonzero(view.present[:1])
        return np.flatnonzero(view.present)

    def _choose_server(self, view: ObsView, slot: int, feasible: np.ndarray,
                       plan: JointPlan) -> int:
        candidates = np.flatnonzero(feasible)
        after = candidates[candidates > self._pointer]
        server = int(after[0] if len(after) else candidates[0])
        self._pointer = server
        return server


class ShortestJobFirst(HeuristicPolicy):
    """The shortest visible job that fits somewhere, first fit (lowest-index feasible server)."""

    name = "sjf"

    def _job_order(self, view: ObsView, flat: bool) -> np.ndarray:
        slots = np.flatnonzero(view.present)
        return slots[np.argsort(view.jobs[slots, _DUR], kind="stable")]

    def _priority(self, view: ObsView) -> int:
        return view.levels - 1


class FirstFitDecreasing(HeuristicPolicy):
    """The largest visible job (CPU + memory demand) that fits somewhere, first fit."""

    name = "ffd"

    def _job_order(self, view: ObsView, flat: bool) -> np.ndarray:
        slots = np.flatnonzero(view.present)
        demand = view.jobs[slots, _CPU] + view.jobs[slots, _MEM]
        return slots[np.argsort(-demand, kind="stable")]
