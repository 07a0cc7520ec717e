"""Scoring candidate plans on sampled futures, in this process or on Ray actors.

An :class:`Evaluator` holds one re-plan's futures (simulator copies at tick ``t``) and
scores a batch of plans: the mean over the futures of :func:`rollout_cost` (the same
futures for every plan: common random numbers, so plans are compared on equal luck).
:class:`RolloutPool` spreads the plans of a batch over ``workers`` Ray actors
(:class:`cloudrl.parallel.WorkerPool`), each loading the re-plan's futures from the object
store the first time it scores for that re-plan; ``workers=1`` scores in this process.
Both paths compute the same floats in the same order, so they give the same decisions.
"""

from __future__ import annotations

import numpy as np

from cloudrl.mpc.sim_mpc.rollout import Scoring, rollout_cost
from envs.scenario.sim import ScenarioSim


class Evaluator:
    """The futures of one re-plan and the plans' scores on them."""

    def __init__(self) -> None:
        self.key = 0  # which re-plan's futures are loaded (workers of a pool)
        self.futures: list[ScenarioSim] = []
        self.block_periods = 1
        self.scoring: Scoring | None = None

    def load(self, futures: list[ScenarioSim], block_periods: int, scoring: Scoring) -> bool:
        self.futures, self.block_periods, self.scoring = futures, block_periods, scoring
        return True

    def score(self, plans: np.ndarray) -> np.ndarray:
        """(P,) mean cost of each plan ((P, B, 2)) over the futures."""
        assert self.scoring is not None
        out = np.empty(len(plans))
        for i, plan in enumerate(plans):
            out[i] = np.mean([rollout_cost(f, plan, self.block_periods, self.scoring)
                              for f in self.futures])
        return out


def _score_chunk(evaluator: Evaluator, item: tuple) -> np.ndarray:
    """On a worker: load the re-plan's futures the first time they are seen, then score."""
    key, futures_ref, block_periods, scoring, plans = item
    if evaluator.key != key:
        import ray

        evaluator.load(ray.get(futures_ref), block_periods, scoring)
        evaluator.key = key
    return evaluator.score(plans)


class RolloutPool:
    """``workers`` evaluators: actors of a :class:`cloudrl.parallel.WorkerPool` for
    ``workers > 1`` (Ray joined or started as that module does), this process for 1."""

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self._local = Evaluator() if workers == 1 else None
        self._pool = None
        self._key = 0
        if workers > 1:
            from cloudrl.parallel import WorkerPool

            self._pool = WorkerPool(workers, Evaluator)

    def load(self, futures: list[ScenarioSim], block_periods: int, scoring: Scoring) -> None:
        if self._local is not None:
            self._local.load(futures, block_periods, scoring)
            return
        import ray

        self._key += 1
        self._loaded = (self._key, ray.put(futures), block_periods, scoring)

    def score(self, plans: np.ndarray) -> np.ndarray:
        if self._local is not None:
            return self._local.score(plans)
        assert self._pool is not None
        chunks = [c for c in np.array_split(np.arange(len(plans)), self.workers) if len(c)]
        parts = self._pool.map(_score_chunk, [(*self._loaded, plans[c]) for c in chunks])
        return np.concatenate(parts)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
