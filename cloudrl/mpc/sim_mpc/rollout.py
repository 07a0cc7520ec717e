"""Rolling a control sequence through a copy of the real simulator and scoring its cost.

A candidate plan is ``B`` piecewise-constant blocks of ``(release_util, ready_margin)``,
each held for ``block_periods`` decision periods - the learned policy's own control space:
``release_util`` on :data:`FINE_RELEASE_LEVELS` and the ready margin on
:data:`FINE_READY_MARGINS` (ready cores = the forecast latency-critical peak before a
boot could finish times ``1 + margin``, plus committed batch work and the spare, as
:func:`envs.scenario.control.release_and_ready`; inside a rollout the peak comes from the
workload model's expected load, the noise-free load forecast).

The score of a plan on one future is what the simulator charges over the rollout
(``ScenarioStats.cost_usd`` at its end minus at its start: energy, carbon and SLA
penalties, every executor effect included) plus a **terminal value** for the work the
rollout leaves behind, so that the horizon's end does not reward deferring everything:

* each batch job still held (pool) or waiting in the run queue is charged its energy
  (cores x duration x the fleet's marginal kWh per busy core-tick, PUE included) at the
  ``terminal_quantile`` of the future's grid $/kWh (price + carbon price) over the window
  it still has (from the rollout's end to its deadline): what running it later at a
  typical price of its remaining window would cost;
* each running job is charged the energy of its remaining ticks at the mean grid $/kWh of
  those ticks (it runs on whatever the plan);
* idle and standby draw after the horizon and solar are not valued (the same for every
  plan to first order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cloudrl.mpc.fluid import grid_usd_per_kwh, watts_per_busy_core
from envs.scenario.config import BATCH, LATENCY_CRITICAL
from envs.scenario.sim import ScenarioSim

# the learned policy's menu (cloudrl.algorithms.distill.actions' FINE_RELEASE_LEVELS and
# FINE_READY_MARGINS, which a policy layer may not import; a test keeps them equal)
FINE_RELEASE_LEVELS = tuple(round(0.05 * i, 2) for i in range(21))  # 0, 0.05, ..., 1
FINE_READY_MARGINS = (-0.5, -0.25, 0.0, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
RELEASE_RANGE = (FINE_RELEASE_LEVELS[0], FINE_RELEASE_LEVELS[-1])
MARGIN_RANGE = (FINE_READY_MARGINS[0], FINE_READY_MARGINS[-1])
_RELEASE = np.asarray(FINE_RELEASE_LEVELS, dtype=float)
_MARGINS = np.asarray(FINE_READY_MARGINS, dtype=float)


def snap(plan: np.ndarray) -> np.ndarray:
    """``plan`` (..., 2) of (release, margin) moved to the nearest menu points."""
    plan = np.asarray(plan, dtype=float)
    out = np.empty_like(plan)
    out[..., 0] = _RELEASE[np.abs(plan[..., :1] - _RELEASE).argmin(axis=-1)]
    out[..., 1] = _MARGINS[np.abs(plan[..., 1:] - _MARGINS).argmin(axis=-1)]
    return out


def ready_for_margin(sim: ScenarioSim, margin: float) -> float:
    """Ready cores for ``margin`` in ``sim``'s state (the env's formula on the expected
    latency-critical load)."""
    cfg, t = sim.cfg, sim.t
    window = max(1, cfg.boot_ticks + cfg.decision_ticks)
    running = sim.running_profile(1)[:, 0]
    lc_q, batch_q = sim.queued_cores_by_class()
    lc_now = float(running[LATENCY_CRITICAL] + lc_q)
    lc_fc = sim.expected_load[LATENCY_CRITICAL, t + 1:t + 1 + window]
    lc_peak = max(float(lc_fc.max(initial=0.0)), lc_now)
    spare = cfg.executor.spare_cores_frac * sim.fleet_cores
    ready = lc_peak * (1.0 + margin) + float(running[BATCH] + batch_q) + spare
    return min(ready, sim.fleet_cores)


@dataclass(frozen=True)
class Scoring:
    """Constants of the terminal value for one scenario."""

    kwh_per_core_tick: float
    carbon_usd_per_tonne: float
    quantile: float

    @classmethod
    def for_sim(cls, sim: ScenarioSim, quantile: float) -> Scoring:
        cfg = sim.cfg
        wpc = watts_per_busy_core(sim.cores, sim.p_idle + sim.p_span)
        return cls(cfg.cost.pue * wpc * cfg.tick_seconds / 3600.0 / 1000.0,
                   cfg.cost.carbon_usd_per_tonne, quantile)


def terminal_value(sim: ScenarioSim, scoring: Scoring) -> float:
    """Dollars the work left in ``sim`` will still cost (see the module docstring)."""
    t = sim.t
    sig = sim.signals
    usd = grid_usd_per_kwh(np.asarray(sig.price_usd_per_mwh[t:], dtype=float),
                           np.asarray(sig.carbon_g_per_kwh[t:], dtype=float),
                           scoring.carbon_usd_per_tonne)
    finite = np.isfinite(usd)
    n = int(finite.argmin()) if not finite.all() else len(usd)  # a sample ends with its forecast
    if n == 0:
        return 0.0
    usd = usd[:n]
    k = scoring.kwh_per_core_tick
    value = k * float(sim.running_profile(n).sum(axis=0) @ usd)  # running jobs run on
    cores, duration, latest = sim.pool_work()
    _, queued_batch = sim.queued_cores_by_class()
    if queued_batch > 0:  # released, waiting for a server: they run about now
        mean_dur = max(1, int(round(sim.cfg.classes[BATCH].duration_min_mean * 60.0
                                    / sim.cfg.tick_seconds)))
        value += queued_batch * mean_dur * k * float(usd[:mean_dur].mean())
    if len(cores):
        d = sim.cfg.decision_ticks  # windows to whole decision periods: fewer quantiles
        window = np.clip(-(-(latest + duration - t) // d) * d, 1, n)
        for m in np.unique(window).tolist():
            pick = window == m
            price = float(np.quantile(usd[:m], scoring.quantile))
            value += float((cores[pick] * duration[pick]).sum()) * k * price
    return value


def rollout_cost(start: ScenarioSim, plan: np.ndarray, block_periods: int, scoring: Scoring
                 ) -> float:
    """Cost of playing ``plan`` ((B, 2) menu points) from ``start`` (left untouched)."""
    sim = start.clone()
    d = sim.cfg.decision_ticks
    c0 = sim.stats.cost_usd
    for release, margin in np.repeat(plan, block_periods, axis=0).tolist():
        if sim.done:
            break
        sim.set_controls(release, ready_for_margin(sim, margin))
        for _ in range(d):
            sim.tick()
            if sim.done:
                break
    return sim.stats.cost_usd - c0 + terminal_value(sim, scoring)
