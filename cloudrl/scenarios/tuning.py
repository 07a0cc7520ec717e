"""Tune the non-learned controllers of a scenario on validation seeds (never test seeds).

Random search (seeded, with the defaults as the first point) over the signal-aware rule's
knobs and, separately, the MPC's; every candidate is played on the same validation seeds
and the one with the lowest mean cost wins. Both families get the same treatment, so the
headroom between them is not an artefact of tuning one and not the other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cloudrl.heuristics.signal_aware import SignalAwareConfig
from cloudrl.mpc.forecast_mpc import MPCConfig
from cloudrl.protocol import validation_seeds
from cloudrl.scenarios.runner import ControllerSpec, run_controllers
from envs.scenario.config import ScenarioConfig

# the signal-aware rule's point closest to running everything at once (always "cheap")
RUN_AT_ONCE_LIKE = {"quantile": 1.0, "window_hours": 24.0, "release_util": 1.0,
                    "ready_margin": 0.6, "guard_hours": 0.0}


def heuristic_space(rng: np.random.Generator) -> dict[str, Any]:
    return {"quantile": float(rng.uniform(0.05, 0.7)),
            "window_hours": float(rng.choice([3.0, 6.0, 12.0, 18.0, 24.0])),
            "release_util": float(rng.uniform(0.5, 1.0)),
            "ready_margin": float(rng.uniform(0.0, 0.6)),
            "guard_hours": float(rng.choice([0.0, 1.0, 2.0, 4.0]))}


def mpc_space(rng: np.random.Generator) -> dict[str, Any]:
    return {"max_util": float(rng.uniform(0.6, 0.95)),
            "ready_hedge": float(rng.uniform(0.0, 0.6))}


@dataclass
class TuneResult:
    kind: str
    params: dict[str, Any]
    mean_cost: float
    default_cost: float
    n_seeds: int
    n_samples: int
    trials: list[tuple[dict[str, Any], float]]


def tune(cfg: ScenarioConfig, kind: str, n_samples: int = 16, n_seeds: int = 10,
         seed: int = 0, workers: int | None = None) -> TuneResult:
    """Best parameters of ``kind`` ("signal_aware" or "mpc") on ``n_seeds`` validation seeds."""
    if kind == "signal_aware":
        default, space = asdict(SignalAwareConfig()), heuristic_space
    elif kind == "mpc":
        default, space = {k: v for k, v in asdict(MPCConfig()).items()
                          if k != "horizon_hours"}, mpc_space
    else:
        raise ValueError(f"tune: kind must be 'signal_aware' or 'mpc', got {kind!r}")
    rng = np.random.default_rng(seed)
    points = [default] + [space(rng) for _ in range(max(n_samples - 1, 0))]
    if kind == "signal_aware" and n_samples > 1:
        points.append(dict(RUN_AT_ONCE_LIKE))  # the rule may also choose not to defer
    specs = [ControllerSpec(kind, p) for p in points]
    results = run_controllers(cfg, specs, list(validation_seeds(n_seeds)), workers)
    costs = [float(np.mean([m["cost_usd"] for m in r])) for r in results]
    best = int(np.argmin(costs))
    return TuneResult(kind, points[best], costs[best], costs[0], n_seeds, len(points),
                      list(zip(points, costs, strict=True)))
