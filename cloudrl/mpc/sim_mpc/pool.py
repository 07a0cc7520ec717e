"""Scoring candidate plans on sampled futures, in this process or on Ray actors.

An :class:`Evaluator` holds one re-plan's futures (simulator copies at tick ``t``) and
scores a batch of plans: the mean over the futures of :func:`rollout_cost` (the same
futures for every plan: common random numbers, so plans are compared on equal luck).
:class:`RolloutPool` spreads the plans of a batch over ``workers`` Ray actors, each
holding its own copy of the futures (sent once per re-plan through the object store);
``workers=1`` scores in this process. Both paths compute the same floats in the same
order, so they give the same decisions.
"""

from __future__ import annotations

import numpy as np

from cloudrl.mpc.sim_mpc.rollout import Scoring, rollout_cost
from envs.scenario.sim import ScenarioSim


class Evaluator:
    """The futures of one re-plan and the plans' scores on them."""

    def __init__(self) -> None:
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


class RolloutPool:
    """``workers`` evaluators: Ray actors for ``workers > 1``, this process for 1."""

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self._local = Evaluator() if workers == 1 else None
        self._actors: list = []
        if workers > 1:
            import ray

            if not ray.is_initialized():
                ray.init(num_cpus=max(2, workers), include_dashboard=False,
                         log_to_driver=False)
            actor = ray.remote(num_cpus=1)(Evaluator)
            self._actors = [actor.remote() for _ in range(workers)]

    def load(self, futures: list[ScenarioSim], block_periods: int, scoring: Scoring) -> None:
        if self._local is not None:
            self._local.load(futures, block_periods, scoring)
            return
        import ray

        ref = ray.put(futures)
        ray.get([a.load.remote(ref, block_periods, scoring) for a in self._actors])

    def score(self, plans: np.ndarray) -> np.ndarray:
        if self._local is not None:
            return self._local.score(plans)
        import ray

        chunks = np.array_split(np.arange(len(plans)), len(self._actors))
        refs = [a.score.remote(plans[idx]) for a, idx in zip(self._actors, chunks, strict=True)
                if len(idx)]
        return np.concatenate(ray.get(refs))

    def close(self) -> None:
        if self._actors:
            import ray

            for a in self._actors:
                ray.kill(a)
            self._actors = []
