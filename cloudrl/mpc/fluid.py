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
per core-tick and ``M`` the price of work left past its deadline. With a demand charge
(``peak_usd_per_kw`` > 0) a peak variable ``z >= peak_floor_kw`` joins it, above every
period's mean grid kW (``g_p <= H_p z``, ``H_p`` the period's hours), at
``peak_usd_per_kw x (z - peak_floor_kw)``: only raising the peak already paid for costs.
Solved with HiGHS (``scipy.optimize.linprog``); the same program serves the forecast MPC
(on forecasts, re-planned every period) and the oracle (on the realised episode, solved
once).
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
    peak_usd_per_kw: float = 0.0  # demand charge per kW of peak (0: no peak variable)
    peak_floor_kw: float = 0.0  # the peak already paid for
    period_hours: np.ndarray | None = None  # H_p (needed with a demand charge)


@dataclass(frozen=True)
class FluidPlan:
    work: np.ndarray  # w_p
    grid_kwh: np.ndarray
    shortfall: np.ndarray
    cost_usd: float
    solve_s: float


def solve(problem: FluidProblem) -> FluidPlan:
    """Solve the fluid program with HiGHS; raises RuntimeError if the solver fails.

    The cumulative work is a variable of its own (``C_p = C_{p-1} + w_p``), so the
    deadline and arrival constraints are bounds and the matrix stays O(P) sparse."""
    p = problem
    n = len(p.grid_usd_per_kwh)
    # variable blocks: w, g, e, v, C (n each)
    iw, ig, ie, iv = (np.arange(n) + k * n for k in range(4))
    cost = np.concatenate([np.zeros(n), p.grid_usd_per_kwh, -np.full(n, p.export_usd_per_kwh),
                           np.full(n, p.shortfall_usd_per_core_tick), np.zeros(n)])
    eye = sparse.identity(n, format="csr")
    zero = sparse.csr_matrix((n, n))
    diff = sparse.identity(n, format="csr") - sparse.eye(n, k=-1, format="csr")
    a_eq = sparse.vstack([
        sparse.hstack([-p.kwh_per_core_tick * eye, eye, -eye, zero, zero]),  # grid balance
        sparse.hstack([-eye, zero, zero, zero, diff]),  # C_p - C_{p-1} - w_p = 0
    ], format="csr")
    b_eq = np.concatenate([p.base_kwh - p.solar_kwh, np.zeros(n)])
    a_ub = sparse.hstack([zero, zero, zero, -eye, -eye], format="csr")  # -C - v <= -due
    b_ub = -p.due
    bounds = np.zeros((5 * n, 2))
    bounds[:, 1] = np.inf
    bounds[iw, 1] = np.maximum(p.room, 0.0)
    bounds[ie, 1] = p.solar_kwh
    bounds[4 * n:, 1] = p.avail  # C_p <= available work
    if p.peak_usd_per_kw > 0:  # one more column z: g_p - H_p z <= 0
        if p.period_hours is None:
            raise ValueError("FluidProblem: a demand charge needs period_hours")
        hrs = sparse.csr_matrix(-np.asarray(p.period_hours, float).reshape(-1, 1))
        a_eq = sparse.hstack([a_eq, sparse.csr_matrix((a_eq.shape[0], 1))], format="csr")
        a_ub = sparse.vstack([
            sparse.hstack([a_ub, sparse.csr_matrix((a_ub.shape[0], 1))]),
            sparse.hstack([zero, eye, zero, zero, zero, hrs])], format="csr")
        b_ub = np.concatenate([b_ub, np.zeros(n)])
        cost = np.append(cost, p.peak_usd_per_kw)
        bounds = np.vstack([bounds, [p.peak_floor_kw, np.inf]])
    a = sparse.vstack([a_eq, a_ub], format="csc")
    row_lo = np.concatenate([b_eq, np.full(len(b_ub), -np.inf)])
    row_hi = np.concatenate([b_eq, b_ub])
    t0 = time.perf_counter()
    x, objective = _highs(cost, bounds, a, row_lo, row_hi)
    solve_s = time.perf_counter() - t0
    if p.peak_usd_per_kw > 0:  # the floor already paid for is not the plan's cost
        objective -= p.peak_usd_per_kw * p.peak_floor_kw
    return FluidPlan(work=x[iw], grid_kwh=x[ig], shortfall=x[iv], cost_usd=objective,
                     solve_s=solve_s)


_SOLVER: list = []


def quiet_highs():
    """A new HiGHS instance, built with stdout muted (its constructor prints a banner from
    C, which no option turns off) and its own output off."""
    import os
    import sys

    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    h.setOptionValue("output_flag", False)
    return h


def _solver(highspy):
    """One HiGHS instance per process (:func:`quiet_highs`), then reused: a model is
    replaced per solve."""
    if not _SOLVER:
        _SOLVER.append(quiet_highs())
    return _SOLVER[0]


def _highs(cost: np.ndarray, bounds: np.ndarray, a: sparse.csc_matrix, row_lo: np.ndarray,
           row_hi: np.ndarray) -> tuple[np.ndarray, float]:
    """Solve ``min cost·x, row_lo <= A x <= row_hi, bounds`` with HiGHS (highspy when it is
    installed, which skips scipy's per-call overhead; else ``scipy.optimize.linprog``)."""
    try:
        import highspy
    except ImportError:  # pragma: no cover - scipy ships the same solver
        eq = row_lo == row_hi
        res = linprog(cost, A_ub=sparse.vstack([a[~eq], -a[~eq]]).tocsr()[
            np.concatenate([np.isfinite(row_hi[~eq]), np.isfinite(row_lo[~eq])])],
            b_ub=np.concatenate([row_hi[~eq][np.isfinite(row_hi[~eq])],
                                 -row_lo[~eq][np.isfinite(row_lo[~eq])]]),
            A_eq=a[eq], b_eq=row_lo[eq], bounds=bounds, method="highs")
        if res.status != 0:
            raise RuntimeError(f"fluid plan: HiGHS status {res.status}: {res.message}") from None
        return res.x, float(res.fun)
    h = _solver(highspy)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(cost), a.shape[0]
    lp.col_cost_ = cost
    lp.col_lower_ = bounds[:, 0]
    lp.col_upper_ = np.where(np.isfinite(bounds[:, 1]), bounds[:, 1], highspy.kHighsInf)
    lp.row_lower_ = np.where(np.isfinite(row_lo), row_lo, -highspy.kHighsInf)
    lp.row_upper_ = np.where(np.isfinite(row_hi), row_hi, highspy.kHighsInf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = a.indptr
    lp.a_matrix_.index_ = a.indices
    lp.a_matrix_.value_ = a.data
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"fluid plan: HiGHS {h.modelStatusToString(status)}")
    return np.asarray(h.getSolution().col_value), float(h.getInfo().objective_function_value)


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
