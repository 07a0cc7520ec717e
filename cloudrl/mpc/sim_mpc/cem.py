"""The cross-entropy method over piecewise-constant plans inside the menu's box.

Each iteration draws plans around a mean (per block and control, Gaussian with its own
standard deviation), clips them to the menu's ranges and snaps them to its points, scores
them, and refits the mean and deviation to the ``elites`` cheapest. Warm starts join the
first iteration's population as they are. The cheapest plan ever scored is returned (all
plans are scored on the same futures, so scores of different iterations compare).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cloudrl.mpc.sim_mpc.rollout import MARGIN_RANGE, RELEASE_RANGE, snap

_LO = np.array([RELEASE_RANGE[0], MARGIN_RANGE[0]])
_HI = np.array([RELEASE_RANGE[1], MARGIN_RANGE[1]])
_MIN_STD = np.array([0.025, 0.05])  # half a menu step: below it every draw snaps alike


@dataclass
class SearchResult:
    plan: np.ndarray  # (B, 2) the cheapest plan scored
    cost: float
    scored: int  # plans scored


def cem(score: Callable[[np.ndarray], np.ndarray], warm: list[np.ndarray], blocks: int,
        iterations: int, population: int, elites: int, init_std: tuple[float, float],
        rng: np.random.Generator) -> SearchResult:
    """Minimise ``score`` ((P, B, 2) plans -> (P,) costs) over ``blocks`` blocks."""
    warm = [snap(np.clip(w, _LO, _HI)) for w in warm]
    mean = warm[0].astype(float) if warm else (_LO + _HI) / 2.0 * np.ones((blocks, 2))
    std = np.broadcast_to(np.asarray(init_std, dtype=float), (blocks, 2)).copy()
    best_plan, best_cost, scored = None, np.inf, 0
    for it in range(iterations):
        n_draw = max(population - (len(warm) if it == 0 else 0), 0)
        draws = mean + std * rng.standard_normal((n_draw, blocks, 2))
        plans = snap(np.clip(draws, _LO, _HI))
        if it == 0 and warm:
            plans = np.concatenate([np.stack(warm), plans])
        costs = score(plans)
        scored += len(plans)
        i = int(np.argmin(costs))  # first of equals: deterministic
        if costs[i] < best_cost:
            best_plan, best_cost = plans[i].copy(), float(costs[i])
        top = plans[np.argsort(costs, kind="stable")[:max(1, min(elites, len(plans)))]]
        mean = top.mean(axis=0)
        std = np.maximum(top.std(axis=0), _MIN_STD)
    assert best_plan is not None
    return SearchResult(best_plan, best_cost, scored)
