"""The fluid plan of deferrable work: when to run it, given prices, carbon, solar and room.

Time is cut into periods of ``d`` ticks. Batch work (core-ticks) becomes available as it
arrives and is due by its jobs' deadlines; per period, the plan chooses how much of it
runs (``w_p``). Facility energy is linear in the busy cores (``watts_per_core`` at the
packing the executor reaches, times PUE); grid draw is energy minus solar, surplus is
exported at the export price (or curtailed when that is 0). The linear program::

    min  sum_p  c_p g_p - x_p e_p + M v_p
    s.t. g_p - e_p - k w_p          = base_p - s_p       (grid balance, kWh)
         e_p                        <= s_p               (export at most the solar)
         sum_{q<=p} w_q + v_p       >= due_p             (deadlines, cumulative)
         sum_{q<=p} w_q             <= avail_p           (no work before it arrives)
         0 <= w_p <= room_p,  g, e, v >= 0

with ``c_p`` the grid cost per kWh (price + carbon price x intensity), ``k`` the kWh
per core-tick and ``M`` the price of work left past its deadline. Solved with HiGHS
(``scipy.optimize.linprog``); the same program serves the forecast MPC (on forecasts,
re-planned every period) and the oracle (on the realised episode, solved once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import linprog


@dataclass(frozen=True)
class FluidProblem:
    """Per-period inputs (length P); energies in kWh, work in core-ticks."""

    grid_usd_per_kwh: np.ndarray  # c_p
    export_usd_per_kwh: float  # x (0: curtailed)
    base_kwh: np.ndarray  # energy of the load the plan does not control
    solar_kwh: np.ndarray  # s_p
    room: np.ndarray  # most batch work that fits in the period
    due: np.ndarray  # cumulative work due by each period's end
    avail: np.ndarray  # cumulative work available by each period's end
    kwh_per_core_tick: float  # k
    shortfall_usd_per_core_tick: float  # M


@dataclass(frozen=True)
class FluidPlan:
    work: np.ndarray  # w_p
    grid_kwh: np.ndarray
    shortfall: np.ndarray
    cost_usd: float
    solve_s: float


def solve(problem: FluidProblem) -> FluidPlan:
    """Solve the fluid program with HiGHS; raises RuntimeError if the solver fails."""
    p = problem
    n = len(p.grid_usd_per_kwh)
    # variable blocks: w (n), g (n), e (n), v (n)
    iw, ig, ie, iv = (np.arange(n) + k * n for k in range(4))
    cost = np.concatenate([np.zeros(n), p.grid_usd_per_kwh,
                           -np.full(n, p.export_usd_per_kwh), np.full(n, p.shortfall_usd_per_core_tick)])
    eye = sparse.identity(n, format="csr")
    lower = sparse.tril(np.ones((n, n)), format="csr")
    zero = sparse.csr_matrix((n, n))
    a_eq = sparse.hstack([-p.kwh_per_core_tick * eye, eye, -eye, zero], format="csr")
    b_eq = p.base_kwh - p.solar_kwh
    # -(cum w) - v <= -due ;  cum w <= avail
    a_ub = sparse.vstack([sparse.hstack([-lower, zero, zero, -eye]),
                          sparse.hstack([lower, zero, zero, zero])], format="csr")
    b_ub = np.concatenate([-p.due, p.avail])
    export_cap = p.solar_kwh if p.export_usd_per_kwh > 0 else p.solar_kwh
    bounds = ([(0.0, max(float(r), 0.0)) for r in p.room] + [(0.0, None)] * n
              + [(0.0, float(s)) for s in export_cap] + [(0.0, None)] * n)
    t0 = time.perf_counter()
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds,
                  method="highs")
    solve_s = time.perf_counter() - t0
    if res.status != 0:
        raise RuntimeError(f"fluid plan: HiGHS status {res.status}: {res.message}")
    x = res.x
    return FluidPlan(work=x[iw], grid_kwh=x[ig], shortfall=x[iv], cost_usd=float(res.fun),
                     solve_s=solve_s)


def per_period(values: np.ndarray, d: int, how: str = "sum") -> np.ndarray:
    """Aggregate a per-tick array into periods of ``d`` ticks (the last may be shorter)."""
    n = len(values)
    pad = (-n) % d
    if pad:
        fill = values[-1] if how == "mean" else 0.0
        values = np.concatenate([values, np.full(pad, fill)])
    blocks = values.reshape(-1, d)
    return blocks.mean(axis=1) if how == "mean" else blocks.sum(axis=1)


def grid_usd_per_kwh(price_usd_per_mwh: np.ndarray, carbon_g_per_kwh: np.ndarray,
                     carbon_usd_per_tonne: float) -> np.ndarray:
    """What one kWh from the grid costs: its price plus the carbon price of its emissions."""
    return price_usd_per_mwh / 1000.0 + carbon_g_per_kwh * carbon_usd_per_tonne / 1e6


def watts_per_busy_core(cores: np.ndarray, p_max: np.ndarray) -> float:
    """Facility-independent IT watts per busy core at full packing (core-weighted)."""
    return float(p_max.sum() / cores.sum())
