"""Clairvoyant lower bound on an episode's energy, and the share of a gap a policy closes.

``episode_bound(env_cfg, seed)`` is a number of kWh that no policy reaches on the
episode of ``seed`` without an SLA violation the env counts. It knows the whole job
table in advance (clairvoyant), packs load fractionally onto the servers' power
curves, never pays a wake delay, and may shift work in time within the jobs'
windows. Pure numpy: the jobs and the fleet come from ``ClusterSim.reset(seed)``
(no policy acts), so the bound sees exactly the episode every policy sees.

Derivation (the env's accounting, ``envs/sim.py``):

1. **Power per server.** In every tick a server draws ``g(u) = P_idle + (P_max -
   P_idle) u^a`` when active at CPU utilisation ``u`` (``u = 0`` when idle),
   ``P_idle`` while waking, and ``sb = standby_fraction * P_idle`` asleep. Waking and
   asleep servers host nothing, so every server draws at least ``G(u)``: ``sb`` at
   ``u = 0``, ``g(u)`` for ``u > 0``. Let ``h`` be the convex envelope of ``G`` on
   [0, 1]: the chord from ``(0, sb)`` to the tangent point ``u*`` of ``g``, then ``g``.
   ``u* = min(1, ((P_idle - sb) / ((P_max - P_idle)(a - 1)))^(1/a))`` for ``a > 1``, else 1.
2. **Power per tick.** With ``x_s = cap_s u_s`` (CPU in largest-server units) and
   load ``L = sum_s x_s``, the fleet draws at least
   ``F(L) = min { sum_s h_s(x_s / cap_s) : sum_s x_s = L, 0 <= x_s <= cap_s }``:
   fractional packing, memory ignored. ``F`` is convex and non-decreasing (an
   infimal convolution of convex non-decreasing functions). It is evaluated by its
   Lagrange dual, ``F(L) = max_l [l L + sum_s min_x (h_s(x) - l x)]``, whose inner
   minimum has a closed form; any ``l`` gives a value <= F(L) (weak duality), so a
   numerically inexact ``l`` still gives a valid bound, and bisection makes it tight.
3. **Work that must be done.** Let ``L_t`` be the CPU in use in tick ``t``. Jobs
   pre-loaded by the warm start are running at tick 0 and cannot be stopped: their
   load up to their end is forced. An episode job (arrival ``a``, duration ``d``,
   absolute deadline ``D``, latest on-time start ``ls = D - d``) costs no counted
   violation only if (i) ``D > T`` (it may stay queued: drops happen at ``t >= D``,
   the episode ends at ``T``), or (ii) it starts at some ``s <= ls``, or (iii) it
   starts at ``s <= D - 1`` and would finish after the episode ends (``s + d > T``:
   its lateness is never counted). The least in-episode CPU-time over those options
   is ``w_j = cpu * min(min(d, T - ls), T - D + 1 if (iii) is possible)`` (0 under (i)),
   and whichever start is chosen the job runs through ``[s_max, min(a + d, T))``,
   its compulsory part. So every violation-free schedule has ``L_t >= f_t`` (forced
   load: warm jobs plus compulsory parts) and ``sum_t L_t >= W = sum_j w_j + warm work``.
4. **Shifting work in time.** Because ``F`` is convex and non-decreasing,
   ``min { sum_t F(L_t) : L_t >= f_t, sum_t L_t >= W }`` is attained at the water level
   ``L_t = max(f_t, c)`` with ``sum_t max(f_t, c) = W`` (a subgradient argument; with
   ``f = 0`` this is Jensen's ``T F(W / T)``). The bound is
   ``tick_seconds * sum_t F(max(f_t, c))`` joules.

A level above the fleet's capacity means no violation-free schedule exists; the
load is then capped at capacity and ``feasible`` is False. Policies that violate
SLAs (drops save work) can go below the bound; compare them at equal violations.
``floor_kwh`` is the same construction with the warm-start jobs alone (they run
whatever a policy does): a bound for every policy, violations allowed, and a weak one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from envs.env_config import EnvConfig
from envs.fleet import Fleet

J_PER_KWH = 3.6e6
_BISECT_STEPS = 100


@dataclass(frozen=True)
class Envelope:
    """Per-server convex envelope of the power draw, with CPU in largest-server units."""

    cap: np.ndarray  # (N,) CPU capacity
    standby: np.ndarray  # (N,) W asleep: h(0)
    p_idle: np.ndarray
    span: np.ndarray  # P_max - P_idle
    exponent: np.ndarray
    u_star: np.ndarray  # (N,) end of the chord (tangent point, or 1)
    slope: np.ndarray  # (N,) W per CPU unit on the chord

    @classmethod
    def of(cls, fleet: Fleet, standby_fraction: float) -> Envelope:
        sb = standby_fraction * fleet.p_idle
        span = fleet.p_max - fleet.p_idle
        a = fleet.exponent
        with np.errstate(divide="ignore", invalid="ignore"):
            tangent = np.power((fleet.p_idle - sb) / (span * (a - 1.0)), 1.0 / a)
        u_star = np.where((a > 1.0) & (span > 0), np.minimum(1.0, tangent), 1.0)
        g_star = fleet.p_idle + span * np.power(u_star, a)
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = np.where(u_star > 0, (g_star - sb) / (u_star * fleet.cpu_cap), 0.0)
        return cls(fleet.cpu_cap, sb, fleet.p_idle, span, a, u_star, slope)

    def power(self, u: np.ndarray) -> np.ndarray:
        """h_s(u) for utilisations ``u`` of shape (..., N)."""
        chord = self.standby + self.slope * self.cap * u
        curve = self.p_idle + self.span * np.power(u, self.exponent)
        return np.where(u <= self.u_star, chord, curve)

    def best_utilisation(self, lam: np.ndarray) -> np.ndarray:
        """argmin_u h_s(u) - lam * cap_s * u for prices ``lam`` (..., 1): shape (..., N)."""
        a = self.exponent
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            inner = np.power(lam * self.cap / (self.span * a), 1.0 / (a - 1.0))
        inner = np.where((a > 1.0) & (self.span > 0), np.nan_to_num(inner, posinf=1.0), 1.0)
        on_curve = np.clip(inner, self.u_star, 1.0)
        return np.where(lam > self.slope, on_curve, 0.0)

    def dual(self, lam: np.ndarray, load: np.ndarray) -> np.ndarray:
        """Lagrange dual lam * L + sum_s min_u (h_s(u) - lam cap_s u): <= F(L) for any lam."""
        u = self.best_utilisation(lam[..., None])
        inner = self.power(u) - lam[..., None] * self.cap * u
        return lam * load + inner.sum(axis=-1)


def min_power(env: Envelope, load: np.ndarray | float) -> np.ndarray:
    """F(L): least fleet power (W) that hosts CPU load ``L`` (largest-server units).

    ``load`` is clipped to [0, fleet capacity]. Bisection on the dual's slope
    ``L - sum_s cap_s u_s(lam)``; the larger of the dual at both ends is returned.
    """
    load = np.clip(np.asarray(load, dtype=np.float64), 0.0, float(env.cap.sum()))
    steepest = env.span * np.maximum(env.exponent, 1.0) / env.cap
    lo = np.zeros_like(load)
    hi = np.full_like(load, float(np.max(np.maximum(env.slope, steepest))) * 2.0 + 1.0)
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        hosted = (env.best_utilisation(mid[..., None]) * env.cap).sum(axis=-1)
        below = hosted < load
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return np.maximum(env.dual(lo, load), env.dual(hi, load))


@dataclass(frozen=True)
class RequiredWork:
    """What every violation-free schedule of an episode runs (CPU units x ticks)."""

    forced: np.ndarray  # (T,) CPU load that must run in each tick
    total: float  # CPU-ticks that must run in the episode (>= forced.sum())
    warm: np.ndarray  # (T,) load of the warm-start jobs alone (runs whatever the policy does)


def required_work(sim) -> RequiredWork:
    """Forced per-tick load and total work of the episode ``sim`` was just reset to."""
    T = sim.cfg.episode_length
    forced = np.zeros(T + 1)
    total = 0.0
    nw = sim.n_warm
    arrival, duration = sim.job_arrival, sim.job_duration
    deadline, cpu = sim.job_deadline, sim.job_cpu
    # warm jobs: placed at reset (or never run), running on [0, min(arrival + d, T))
    placed = np.flatnonzero(sim.job_server[:nw] >= 0)
    ends = np.clip(arrival[placed] + duration[placed], 0, T)
    np.add.at(forced, 0, cpu[placed].sum())
    np.add.at(forced, ends, -cpu[placed])
    total += float((cpu[placed] * ends).sum())
    warm = np.cumsum(forced)[:T]
    # episode jobs arriving inside the episode
    ep = np.arange(nw, len(arrival))
    ep = ep[arrival[ep] < T]
    a, d, D, c = arrival[ep], duration[ep], deadline[ep], cpu[ep]
    ls = np.maximum(a, D - d)
    must = D <= T  # else it may stay queued to the end without a counted violation
    on_time = np.minimum(d, np.maximum(T - ls, 0))
    cheat = must & (ls < D - 1) & (D - 1 + d > T)  # started late, ends after T: uncounted
    ticks = np.where(cheat, np.minimum(on_time, T - D + 1), on_time)
    total += float((c * np.where(must, ticks, 0)).sum())
    start = np.where(cheat, D - 1, ls)
    stop = np.minimum(a + d, T)
    comp = must & (start < stop)
    np.add.at(forced, start[comp], c[comp])
    np.add.at(forced, stop[comp], -c[comp])
    return RequiredWork(np.cumsum(forced)[:T], total, warm)


def water_level(forced: np.ndarray, total: float) -> np.ndarray:
    """Per-tick load max(forced_t, c) with sum == max(total, forced.sum())."""
    if total <= forced.sum():
        return forced.copy()
    lo, hi = float(forced.min()), float(forced.max()) + total / len(forced)
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.maximum(forced, mid).sum() < total else (lo, mid)
    return np.maximum(forced, hi)


def offered_load(sim) -> np.ndarray:
    """Per-tick CPU load if every job ran from its arrival to its end, clipped to the
    horizon (warm-start jobs from tick 0, the unplaced ones not at all).

    ``F`` of it (:func:`min_power`) summed over the ticks is the *offered-work reference*:
    the least energy of serving every arrival at once, fractional packing, no wake cost.
    It is not a lower bound -- a policy may leave jobs whose deadline lies past the
    horizon in the queue, or push their tails past it, and the clairvoyant bound counts
    only the work that must run -- but it is the fair target for a policy that serves the
    work it is offered. While the offered load fits the fleet it is never below the bound:
    per tick it is at least the forced load, in total at least the required work, and the
    bound's water level minimises the convex, non-decreasing ``F`` under exactly those
    constraints."""
    T = sim.cfg.episode_length
    prof = np.zeros(T + 1)
    nw = sim.n_warm
    n_jobs = len(sim.job_arrival)
    start = np.where(np.arange(n_jobs) < nw, 0, sim.job_arrival)
    keep = np.ones(n_jobs, dtype=bool)
    keep[:nw] = sim.job_server[:nw] >= 0
    keep &= sim.job_arrival < T
    end = np.minimum(sim.job_arrival + sim.job_duration, T)
    keep &= start < end
    np.add.at(prof, np.clip(start[keep], 0, T), sim.job_cpu[keep])
    np.add.at(prof, end[keep], -sim.job_cpu[keep])
    return np.cumsum(prof)[:T]


@dataclass(frozen=True)
class EpisodeBound:
    """The bound of one episode and the quantities it rests on."""

    seed: int
    energy_kwh: float
    required_cpu_ticks: float
    forced_cpu_ticks: float
    feasible: bool  # False: the required work exceeds the fleet's capacity
    floor_kwh: float  # a bound for every policy, violations allowed: the warm jobs only
    offered_kwh: float = float("nan")  # offered-work reference (not a bound): offered_load

    def as_dict(self) -> dict:
        return asdict(self)


def make_sim(env_cfg: EnvConfig | dict):
    """The simulator of ``env_cfg`` (no gymnasium env, no observation)."""
    from envs.sim import ClusterSim
    from envs.workloads import make_workload

    cfg = EnvConfig.coerce(env_cfg)
    return ClusterSim(cfg.sim, make_workload(cfg.workload, cfg.sim.tick_seconds))


def episode_bound(env_cfg: EnvConfig | dict, seed: int, sim=None) -> EpisodeBound:
    """The clairvoyant energy lower bound (kWh) of episode ``seed`` on ``env_cfg``."""
    sim = sim if sim is not None else make_sim(env_cfg)
    sim.reset(seed)
    env = Envelope.of(sim.fleet, sim.cfg.standby_fraction)
    work = required_work(sim)
    level = water_level(work.forced, work.total)
    capacity = float(env.cap.sum())
    feasible = bool(level.max() <= capacity + 1e-9)
    joules = float(min_power(env, level).sum()) * sim.cfg.tick_seconds
    floor = float(min_power(env, work.warm).sum()) * sim.cfg.tick_seconds
    offered = float(min_power(env, offered_load(sim)).sum()) * sim.cfg.tick_seconds
    return EpisodeBound(int(seed), joules / J_PER_KWH, work.total, float(work.forced.sum()),
                        feasible, floor / J_PER_KWH, offered / J_PER_KWH)


def episode_bounds(env_cfg: EnvConfig | dict, seeds: Iterable[int]) -> list[EpisodeBound]:
    """:func:`episode_bound` for each seed (one simulator reused)."""
    sim = make_sim(env_cfg)
    return [episode_bound(env_cfg, s, sim) for s in seeds]


def gap_closed(policy_kwh: float, heuristic_kwh: float, bound_kwh: float) -> float:
    """Share of the heuristic-to-bound energy gap the policy closes.

    1.0: the policy reaches the bound; 0.0: no better than the heuristic; negative:
    worse. NaN when the heuristic already sits at the bound (no gap to close).
    """
    gap = heuristic_kwh - bound_kwh
    if not math.isfinite(gap) or gap <= 0:
        return float("nan")
    return (heuristic_kwh - policy_kwh) / gap
