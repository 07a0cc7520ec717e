"""A provable per-episode lower bound on the cost of a scenario (:mod:`envs.scenario.sim`).

``episode_bound(cfg, seed)`` is a number of dollars that no policy's episode of ``seed``
goes below, whatever its controls, its schedule or the SLA violations it accepts: the
max of two bounds, each a relaxation of the simulator's own accounting. It knows the
whole episode (jobs and signals from ``ScenarioSim.reset(seed)``, no policy acts), so it
is clairvoyant, like the oracle, but it is not a schedule: the gap between it and a
controller is an upper limit on what any controller could still save.

Derivation (the accounting of ``ScenarioSim.tick``; ``T`` ticks of ``dt`` hours):

1. **Cost of a tick as a function of facility power.** In tick ``t`` the facility draws
   ``P_t = PUE * IT_t + E_t / dt`` (``E_t``: transition energy). With solar ``S_t``, price
   ``pi_t`` ($/MWh), carbon ``k_t`` (g/kWh), carbon price ``tau`` ($/t) and export price
   ``x`` ($/MWh, 0 when curtailed), the tick costs
   ``f_t(P) = a_t (P - S_t)`` for ``P >= S_t`` and ``e (P - S_t)`` for ``P < S_t``, with
   ``a_t = dt (pi_t / 1e6 + k_t tau / 1e9)`` and ``e = dt x / 1e6`` dollars per watt: grid
   draw is net of solar and a surplus earns the export price. ``a_t`` may be negative
   (negative prices) and ``e`` may exceed ``a_t``, so ``f_t`` need be neither monotone
   nor convex; both are handled below.
2. **Where ``P_t`` can lie.** Every server draws at least its *floor*
   ``phi_s = min(1, suspended_fraction, off_fraction) * P_idle,s`` (active >= ``P_idle``,
   resuming and booting ``P_idle``, suspended and off their fractions), so
   ``P_t >= P_min = PUE * sum_s phi_s``. At most ``P_max = PUE * sum_s P_max,s + sum_s
   (suspend_seconds + shutdown_seconds) P_idle,s / tick_seconds``: a server is at most at
   full load and makes at most one suspend and one shutdown per tick.
3. **Power of the busy cores.** An active server of ``C_s`` cores at utilisation ``u``
   draws ``P_idle + (P_max - P_idle) u^alpha``; above its floor that is at least
   ``w_s * u * C_s`` with ``w_s = min_{0 < u <= 1} (P_idle - phi_s + span u^alpha) / (u C_s)``
   (closed form: ``u* = ((P_idle - phi_s) / (span (alpha - 1)))^(1/alpha)`` when
   ``alpha > 1`` and ``u* < 1``, else ``u* = 1``). This charges each busy core its share
   of the idle power at the most efficient utilisation of its tier, so no separate idle
   floor is needed for the servers that must be on. With ``B_t`` busy cores, placed on
   the cheapest tiers first, ``P_t >= L(B_t) = P_min + PUE * sum_k w_k min((B_t - C_<k)^+,
   C_k)``, tiers ``k`` in increasing ``w_k`` (convex, non-decreasing, piecewise linear).
4. **A monotone convex lower curve.** Let ``env_t`` be the convex envelope of ``f_t`` on
   ``[P_min, P_max]`` (a piecewise-linear function through its values at ``P_min``,
   ``S_t`` and ``P_max``) and ``g_t(P) = min_{P' >= P} env_t(P')``: convex,
   non-decreasing and ``g_t(P) <= min_{P <= P' <= P_max} f_t(P')``. Hence the tick's real
   energy-plus-carbon cost is at least ``h_t(B_t) = g_t(L(B_t))``, a convex non-decreasing
   piecewise-linear function of the busy cores (transitions, negative prices and solar
   surplus are all allowed: they only move ``P_t`` inside ``[L(B_t), P_max]``).
5. **Jobs.** Job ``j`` (arrival ``a``, ``d`` ticks, ``c`` cores, deadline ``D``, penalty
   ``p``) is on time only if it starts at some ``s`` in ``[a, D - d]`` (a job started at
   ``s`` is busy in ticks ``s..s+d-1`` and finishes at ``s + d``), so it is then busy
   ``d`` ticks inside ``[a, D - 1]``, and certainly in its compulsory part
   ``[D - d, a + d - 1]``. Every other job pays ``p`` once (late or dropped). Since
   ``h_t`` is non-decreasing, counting only on-time jobs in ``B_t`` lowers the cost, so
   ``cost >= sum_t h_t(B_t^on) + sum_{j late} p_j``. No job is forced late on its own:
   every job fits the largest server, every deadline leaves at least one tick of slack,
   all servers start active and every deadline falls inside the episode.

Two relaxations of that minimum, both valid for every policy:

(a) **Per job** (capacity ignored). ``h_t`` is convex, so ``h_t(B) >= h_t(0) + h_t'(0+) B``;
    the sum splits by job: ``sum_t h_t(0) + sum_j min(p_j, c_j min_s sum_{t=s}^{s+d-1}
    h_t'(0+))``: each job at the best tier in the cheapest window of its slack, or dropped
    when its penalty is the smaller (``h_t'(0+)`` is 0 where solar covers the floor and
    nothing is exported).
(b) **Time-indexed LP** (HiGHS). A job whose window is short (latency-critical) has a
    variable per tick of its window, a long one (batch) one per period ``q`` of
    ``period_ticks``: ``y_js`` (ticks of job ``j`` run in slot ``s``, ``0 <= y_js <=
    n_js``, its window's ticks in the slot), ``v_j`` in [0, 1] (the share of job ``j`` paid
    as a violation, cost ``p_j``), ``z_ti`` (core-ticks on segment ``i`` of ``h_t``, cost
    the segment's slope, at most its length) and ``b_t >= 0`` (long jobs' core-ticks put in
    tick ``t``)::

        min  sum_t h_t(0) + sum_j p_j v_j + sum_ti slope_ti z_ti
        s.t. sum_s y_js + d_j v_j = d_j                  (each job runs or is paid for)
             y_js + m_js v_j >= m_js                     (its compulsory ticks in slot s)
             sum_i z_ti >= sum_{short j} c_j y_jt + b_t  (busy core-ticks of tick t)
             sum_{t in q} b_t >= sum_{long j} c_j y_jq   (long jobs' core-ticks of q)

    Each non-preemptive on-time schedule is a point of it (``v_j`` in {0, 1}, ``z`` filling
    each ``h_t``'s segments in order up to ``B_t``) with the cost ``sum_t h_t(B_t^on)``;
    the LP may only do better (preempt, split a period's long work over its ticks at will,
    take any segment first), so its minimum is a bound. Its value is taken from a *dual*
    solution by weak duality (``sum of row bounds x duals + min over the box of the
    reduced costs``), so it is a bound whatever the solver's tolerances, and still one if
    the solver stops early. Penalties make it always feasible: work that cannot fit is
    paid for (``lp_sla_usd``), as is work whose penalty is below its energy.

What the bound leaves out (and so what the gap to a controller is made of, beside what
the controller misses): the executor's spare cores and idle servers, transition energy,
boot and resume latency, placement losses (fragmentation, utilisation below the tier's
best), SLA violations the executor's dynamics cause, and the non-preemption of long
jobs inside a period. In ticks whose price plus carbon price is negative the bound lets
the facility draw ``P_max`` (every server at full load, a suspend and a shutdown each),
the most it could ever draw, since drawing more there lowers the cost: on seeds with long
negative-price episodes this makes it markedly looser (``floor_usd`` < 0 shows it).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
from scipy import sparse

from envs.scenario.config import ScenarioConfig
from envs.scenario.sim import ScenarioSim

__all__ = ["EpisodeBound", "TickCurves", "episode_bound", "lp_bound", "relaxation_bound",
           "tick_curves", "watts_per_busy_core"]


@dataclass(frozen=True)
class EpisodeBound:
    """The bound of one episode (dollars) and its parts."""

    seed: int
    bound_usd: float  # max(relaxation_usd, lp_usd)
    relaxation_usd: float  # (a)
    lp_usd: float  # (b), from the LP's dual
    floor_usd: float  # sum_t h_t(0): every server at its floor, nothing busy
    lp_sla_usd: float  # the penalties in the LP's plan (jobs it cannot fit or drops)
    lp_primal_usd: float  # the solver's primal objective (>= lp_usd up to tolerance)
    lp_status: str
    lp_columns: int
    lp_rows: int
    solve_s: float
    period_ticks: int

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TickCurves:
    """``h_t`` of every tick: its value at 0 busy cores and its segments (slope $/core-tick,
    length cores), slopes non-decreasing along axis 1."""

    h0: np.ndarray  # (T,)
    slope: np.ndarray  # (T, K)
    length: np.ndarray  # (T, K)


def watts_per_busy_core(sim: ScenarioSim) -> tuple[np.ndarray, np.ndarray]:
    """(``w_s``, ``phi_s``) per server: IT watts per busy core above the floor at the
    tier's most efficient utilisation, and the floor (step 2 and 3 of the derivation)."""
    pw = sim.cfg.power
    floor = min(1.0, pw.suspended_fraction, pw.off_fraction) * sim.p_idle
    a = sim.p_idle - floor
    b = sim.p_span
    alpha = sim.exponent
    u = np.ones_like(a)
    inner = alpha > 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        stat = np.where(inner & (b > 0),
                        (a / np.where(b > 0, b * (alpha - 1.0), 1.0)) ** (1.0 / alpha), 1.0)
    u = np.where(inner & (b > 0), np.minimum(stat, 1.0), u)
    u = np.maximum(u, 1e-12)
    w = (a + b * u ** alpha) / (u * sim.cores)
    return w, floor


def _cost_points(sim: ScenarioSim, p_min: float, p_max: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Vertices (x, g) of ``g_t`` on [P_min, P_max] per tick: (T, 3) each (step 4)."""
    cfg = sim.cfg
    T = sim.n_ticks
    sig = sim.signals
    hours = cfg.tick_seconds / 3600.0
    a = hours * (sig.price_usd_per_mwh[:T] / 1e6
                 + sig.carbon_g_per_kwh[:T] * cfg.cost.carbon_usd_per_tonne / 1e9)
    e = hours * float(cfg.signals.export_price_usd_per_mwh or 0.0) / 1e6
    solar = sig.solar_kw[:T] * 1000.0

    def f(p: np.ndarray) -> np.ndarray:
        return np.where(p >= solar, a * (p - solar), e * (p - solar))

    s = np.clip(solar, p_min, p_max)  # the kink, where it lies inside [P_min, P_max]
    x = np.stack([np.full(T, p_min), s, np.full(T, p_max)], axis=1)
    fx = np.stack([f(x[:, 0]), f(s), f(x[:, 2])], axis=1)
    # convex envelope: drop the middle vertex where it lies above the chord
    span = x[:, 2] - x[:, 0]
    lam = np.where(span > 0, (x[:, 1] - x[:, 0]) / np.where(span > 0, span, 1.0), 0.0)
    chord = fx[:, 0] + lam * (fx[:, 2] - fx[:, 0])
    fx[:, 1] = np.minimum(fx[:, 1], chord)
    # monotone: the minimum from the right
    fx[:, 1] = np.minimum(fx[:, 1], fx[:, 2])
    fx[:, 0] = np.minimum(fx[:, 0], fx[:, 1])
    return x, fx


def _interp_rows(xq: np.ndarray, x: np.ndarray, gx: np.ndarray) -> np.ndarray:
    """``g_t`` at ``xq`` (T, M): linear between its vertices ``x`` (T, 3, non-decreasing)."""
    q = np.clip(xq, x[:, :1], x[:, 2:])
    x0, x1, x2 = x[:, :1], x[:, 1:2], x[:, 2:]
    g0, g1, g2 = gx[:, :1], gx[:, 1:2], gx[:, 2:]
    left = np.where(x1 > x0, g0 + (q - x0) / np.where(x1 > x0, x1 - x0, 1.0) * (g1 - g0), g1)
    right = np.where(x2 > x1, g1 + (q - x1) / np.where(x2 > x1, x2 - x1, 1.0) * (g2 - g1), g1)
    return np.where(q <= x1, left, right)


def tick_curves(sim: ScenarioSim) -> TickCurves:
    """``h_t(B) = g_t(L(B))`` for every tick, as segments (steps 1-4)."""
    cfg = sim.cfg
    pue = cfg.cost.pue
    w, floor = watts_per_busy_core(sim)
    p_min = pue * float(floor.sum())
    pw = cfg.power
    p_max = pue * float((sim.p_idle + sim.p_span).sum()) + float(
        ((pw.suspend_seconds + pw.shutdown_seconds) * sim.p_idle).sum()) / cfg.tick_seconds
    # tiers: servers with the same w, cheapest first
    ws, inv = np.unique(w, return_inverse=True)
    caps = np.bincount(inv, weights=sim.cores, minlength=len(ws))
    b_knots = np.concatenate([[0.0], np.cumsum(caps)])
    l_knots = p_min + pue * np.concatenate([[0.0], np.cumsum(ws * caps)])
    x, gx = _cost_points(sim, p_min, p_max)
    T = sim.n_ticks
    # B where L(B) crosses the middle vertex of g_t (solar), per tick
    mid = x[:, 1]
    b_mid = _preimage(mid, l_knots, b_knots)
    pts = np.sort(np.concatenate([np.broadcast_to(b_knots, (T, len(b_knots))),
                                  b_mid[:, None]], axis=1), axis=1)
    lv = np.interp(pts.ravel(), b_knots, l_knots).reshape(pts.shape)
    hv = _interp_rows(lv, x, gx)
    length = np.diff(pts, axis=1)
    dh = np.diff(hv, axis=1)
    slope = np.where(length > 0, dh / np.where(length > 0, length, 1.0), 0.0)
    # convexity holds exactly; rounding may break it by ~1e-18: keep slopes sorted and >= 0
    slope = np.maximum.accumulate(np.maximum(slope, 0.0), axis=1)
    return TickCurves(h0=hv[:, 0], slope=slope, length=length)


def _preimage(p: np.ndarray, l_knots: np.ndarray, b_knots: np.ndarray) -> np.ndarray:
    """Smallest B with L(B) >= p when L has flat pieces (tiers with w = 0)."""
    idx = np.clip(np.searchsorted(l_knots, p, side="left"), 1, len(l_knots) - 1)
    lo, hi = l_knots[idx - 1], l_knots[idx]
    frac = np.where(hi > lo, (p - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
    return b_knots[idx - 1] + np.clip(frac, 0.0, 1.0) * (b_knots[idx] - b_knots[idx - 1])


def _jobs(sim: ScenarioSim) -> tuple[np.ndarray, ...]:
    j = sim.jobs
    pen = np.asarray(sim.cfg.cost.sla_usd, float)[j.cls.astype(np.int64)]
    if len(j) and int(j.deadline.max()) > sim.n_ticks:
        raise ValueError(f"a deadline ({int(j.deadline.max())}) falls after the episode's end "
                         f"({sim.n_ticks}); the bound's window model does not hold")
    return j.arrival, j.duration, j.cores, j.deadline, pen


def relaxation_bound(sim: ScenarioSim, curves: TickCurves) -> float:
    """Bound (a): each job at the best tier in the cheapest window of its slack, or its
    penalty if that is smaller, plus the floor; capacity ignored."""
    arrival, duration, cores, deadline, pen = _jobs(sim)
    first = (curves.length > 0).argmax(axis=1)  # h_t'(0+): the first segment of length > 0
    slope0 = curves.slope[np.arange(len(first)), first]
    cs = np.concatenate([[0.0], np.cumsum(slope0)])
    energy = np.empty(len(arrival))
    for d in np.unique(duration).tolist():
        pick = np.flatnonzero(duration == d)
        window = cs[d:] - cs[:-d]  # window[s]: ticks s..s+d-1
        for i in pick.tolist():
            energy[i] = window[arrival[i]:deadline[i] - d + 1].min()
    return float(curves.h0.sum() + np.minimum(pen, cores * energy).sum())


def _overlap(lo: np.ndarray, hi: np.ndarray, q: np.ndarray, p: int) -> np.ndarray:
    """Ticks of [lo, hi] inside period q (periods of p ticks)."""
    return np.maximum(np.minimum(hi, (q + 1) * p - 1) - np.maximum(lo, q * p) + 1, 0)


def _slots(arrival: np.ndarray, deadline: np.ndarray, duration: np.ndarray, jobs: np.ndarray,
           p: int) -> tuple[np.ndarray, ...]:
    """(job, slot, ticks, compulsory ticks) of every slot of ``p`` ticks that meets the
    window [a, D-1] of one of ``jobs``."""
    a, dl = arrival[jobs], deadline[jobs]
    q0, q1 = a // p, (dl - 1) // p
    count = q1 - q0 + 1
    first = np.repeat(np.cumsum(count) - count, count)
    yj = np.repeat(jobs, count)
    yq = np.repeat(q0, count) + np.arange(int(count.sum())) - first
    ticks = _overlap(arrival[yj], deadline[yj] - 1, yq, p)
    keep = ticks > 0
    yj, yq, ticks = yj[keep], yq[keep], ticks[keep]
    comp = _overlap(deadline[yj] - duration[yj], arrival[yj] + duration[yj] - 1, yq, p)
    return yj, yq, ticks, comp


def lp_bound(sim: ScenarioSim, curves: TickCurves, period_ticks: int = 5,
             fine_window_ticks: int = 48, time_limit_s: float = 300.0) -> dict:
    """Bound (b): the time-indexed LP, its value taken from the dual (see the docstring).

    Jobs whose window [a, D-1] spans at most ``fine_window_ticks`` ticks (latency-critical
    ones) get a variable per tick; longer ones one per period of ``period_ticks``, and a
    period's core-ticks of those are split over its ticks freely (``b_t``)."""
    arrival, duration, cores, deadline, pen = _jobs(sim)
    p = max(1, int(period_ticks))
    T = sim.n_ticks
    nq = -(-T // p)
    nj = len(arrival)
    fine = (deadline - arrival <= fine_window_ticks) | (p == 1)
    fj, ft, fticks, fcomp = _slots(arrival, deadline, duration, np.flatnonzero(fine), 1)
    cj, cq, cticks, ccomp = _slots(arrival, deadline, duration, np.flatnonzero(~fine), p)
    coarse = len(cj) > 0
    yj = np.concatenate([fj, cj])
    ny, nf = len(yj), len(fj)
    comp = np.concatenate([fcomp, ccomp])
    # z columns: every tick's segments
    nk = curves.slope.shape[1]
    zt = np.repeat(np.arange(T), nk)
    zlen, zslope = curves.length.ravel(), curves.slope.ravel()
    zkeep = zlen > 0
    zt, zlen, zslope = zt[zkeep], zlen[zkeep], zslope[zkeep]
    nz = len(zt)
    nb = T if coarse else 0
    iy, iv, iz, ib = 0, ny, ny + nj, ny + nj + nz
    ncol = ib + nb
    cap = np.bincount(zt, weights=zlen, minlength=T)
    cost = np.concatenate([np.zeros(ny), pen, zslope, np.zeros(nb)])
    lower = np.zeros(ncol)
    upper = np.concatenate([fticks, cticks, np.ones(nj), zlen, cap[:nb]]).astype(float)
    # rows: jobs (nj), ticks (T), periods (nq, when coarse jobs exist), compulsory (nc)
    ci = np.flatnonzero(comp > 0)
    nc = len(ci)
    npr = nq if coarse else 0
    r_tick, r_per = nj, nj + T
    r_comp = r_per + npr
    parts = [  # (rows, cols, values)
        (yj, iy + np.arange(ny), np.ones(ny)),  # y in its job row
        (r_tick + ft, iy + np.arange(nf), -cores[fj]),  # fine y in its tick row
        (r_per + cq, iy + nf + np.arange(len(cj)), -cores[cj]),  # coarse y in its period row
        (r_comp + np.arange(nc), iy + ci, np.ones(nc)),  # y in compulsory rows
        (np.arange(nj), iv + np.arange(nj), duration.astype(float)),  # v in its job row
        (r_comp + np.arange(nc), iv + yj[ci], comp[ci].astype(float)),  # v in compulsory
        (r_tick + zt, iz + np.arange(nz), np.ones(nz)),  # z in its tick row
        (r_tick + np.arange(nb), ib + np.arange(nb), -np.ones(nb)),  # b in its tick row
        (r_per + np.arange(nb) // p, ib + np.arange(nb), np.ones(nb)),  # b in its period row
    ]
    rows, cols, vals = (np.concatenate(x) for x in zip(*parts, strict=True))
    a = sparse.csc_matrix((vals, (rows, cols)), shape=(r_comp + nc, ncol))
    a.sum_duplicates()
    dur = duration.astype(float)
    row_lo = np.concatenate([dur, np.zeros(T + npr), comp[ci].astype(float)])
    row_hi = np.concatenate([dur, np.full(T + npr + nc, np.inf)])
    t0 = time.perf_counter()
    primal, x, duals, status = _solve(cost, lower, upper, a, row_lo, row_hi, time_limit_s)
    solve_s = time.perf_counter() - t0
    dual = _dual_value(cost, lower, upper, a, row_lo, row_hi, duals)
    h0 = float(curves.h0.sum())
    return {"lp_usd": h0 + dual, "lp_primal_usd": h0 + primal, "lp_status": status,
            "lp_columns": ncol, "lp_rows": a.shape[0], "solve_s": solve_s,
            "period_ticks": p, "floor_usd": h0,
            "lp_sla_usd": float(pen @ x[iv:iz]) if x is not None else float("nan")}


def _dual_value(cost: np.ndarray, lower: np.ndarray, upper: np.ndarray, a: sparse.csc_matrix,
                row_lo: np.ndarray, row_hi: np.ndarray, y: np.ndarray) -> float:
    """Weak duality: for any row multipliers ``y`` (signs made to fit the row's finite
    sides), ``sum_i y_i b_i + sum_j min_{l_j <= x_j <= u_j} (c - A^T y)_j x_j`` is at most
    every feasible point's cost."""
    y = np.where(np.isfinite(row_lo), y, np.minimum(y, 0.0))
    y = np.where(np.isfinite(row_hi), y, np.maximum(y, 0.0))
    side = np.where(y > 0, row_lo, np.where(y < 0, row_hi, 0.0))
    red = cost - a.T @ y
    box = np.minimum(red * lower, red * upper)
    return float(np.dot(y, np.where(y != 0, side, 0.0)) + box.sum())


def _highs():
    """A fresh HiGHS instance (:func:`cloudrl.mpc.fluid.quiet_highs`): one per solve, since
    HiGHS measures ``time_limit`` on an instance's clock, which runs on across solves."""
    from cloudrl.mpc.fluid import quiet_highs

    return quiet_highs()


def _solve(cost: np.ndarray, lower: np.ndarray, upper: np.ndarray, a: sparse.csc_matrix,
           row_lo: np.ndarray, row_hi: np.ndarray, time_limit_s: float
           ) -> tuple[float, np.ndarray | None, np.ndarray, str]:
    import highspy

    h = _highs()
    h.setOptionValue("time_limit", float(time_limit_s))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(cost), a.shape[0]
    lp.col_cost_ = cost
    lp.col_lower_ = lower
    lp.col_upper_ = upper
    lp.row_lower_ = np.where(np.isfinite(row_lo), row_lo, -highspy.kHighsInf)
    lp.row_upper_ = np.where(np.isfinite(row_hi), row_hi, highspy.kHighsInf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = a.indptr
    lp.a_matrix_.index_ = a.indices
    lp.a_matrix_.value_ = a.data
    h.passModel(lp)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    sol = h.getSolution()
    duals = np.asarray(sol.row_dual, float) if sol.dual_valid else np.zeros(a.shape[0])
    if not sol.value_valid:
        return float("nan"), None, duals, status
    return float(h.getInfo().objective_function_value), np.asarray(sol.col_value), duals, status


def default_period_ticks(cfg: ScenarioConfig) -> int:
    """The controllers' decision period (15 minutes on the catalog's scenarios)."""
    return cfg.decision_ticks


def episode_bound(cfg: ScenarioConfig, seed: int, period_ticks: int | None = None,
                  sim: ScenarioSim | None = None, time_limit_s: float = 300.0) -> EpisodeBound:
    """The bound of the episode of ``seed`` (``sim`` is reset to it when given)."""
    sim = sim or ScenarioSim(cfg)
    sim.reset(seed)
    curves = tick_curves(sim)
    relax = relaxation_bound(sim, curves)
    lp = lp_bound(sim, curves, period_ticks=period_ticks or default_period_ticks(cfg),
                  time_limit_s=time_limit_s)
    return EpisodeBound(seed=int(seed), bound_usd=max(relax, lp["lp_usd"]), relaxation_usd=relax,
                        lp_usd=lp["lp_usd"], floor_usd=lp["floor_usd"], lp_sla_usd=lp["lp_sla_usd"],
                        lp_primal_usd=lp["lp_primal_usd"], lp_status=lp["lp_status"],
                        lp_columns=lp["lp_columns"], lp_rows=lp["lp_rows"],
                        solve_s=lp["solve_s"], period_ticks=lp["period_ticks"])
