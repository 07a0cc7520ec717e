"""The clairvoyant oracle: the fluid plan of the realised episode, rounded and replayed.

It knows every arrival and every signal value in advance. It solves
:mod:`cloudrl.mpc.fluid` once over the whole episode on the truth (the latency-critical
load as it will be, each batch job available at its arrival and due at its deadline),
then *replays* the plan through the simulator with the same executor as every other
controller: each period it releases batch work up to the plan's busy cores and keeps
ready what the realised latency-critical load will need before a boot could finish. A
few variants of the plan (its capacity cap and ready margin) are replayed on copies of
the episode and, with hindsight, the cheapest is the schedule the oracle runs.
Its cost is therefore the cost of a schedule the simulator actually ran, an achievable
reference, not a bound; the plan's own objective is kept beside it (``lp_cost_usd``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cloudrl.mpc.fluid import (
    FluidPlan,
    FluidProblem,
    grid_usd_per_kwh,
    per_period,
    solve,
    watts_per_busy_core,
)
from envs.scenario.config import BATCH, LATENCY_CRITICAL
from envs.scenario.control import plan_view
from envs.scenario.sim import ScenarioSim


@dataclass(frozen=True)
class OracleConfig:
    max_util: float = 0.9
    ready_hedge: float = 0.05  # the future load is known: a small margin for packing losses
    shortfall_factor: float = 3.0
    # other (max_util, ready_hedge) plans to try; with hindsight the cheapest replay is kept
    alternatives: tuple[tuple[float, float], ...] = ((0.9, 0.3), (0.75, 0.15))


def realised_load(sim: ScenarioSim, cls: int) -> np.ndarray:
    """Busy cores per tick of class ``cls`` if every job ran from its arrival."""
    n = sim.n_ticks
    jobs = sim.jobs
    pick = jobs.cls == cls
    delta = np.zeros(n + 1)
    np.add.at(delta, jobs.arrival[pick], jobs.cores[pick])
    np.add.at(delta, np.minimum(jobs.arrival[pick] + jobs.duration[pick], n), -jobs.cores[pick])
    return np.cumsum(delta)[:n]


class ClairvoyantOracle:
    """Plans the realised episode, replays each candidate plan on a copy of the episode and
    keeps the cheapest (see the module docstring); then replays that one for real."""

    name = "oracle"
    clairvoyant = True

    def __init__(self, config: OracleConfig | None = None) -> None:
        self.config = config or OracleConfig()
        self.plan: FluidPlan | None = None
        self.candidates: list[tuple[tuple[float, float], float]] = []

    def reset(self, sim: ScenarioSim) -> None:
        import copy

        cfg = self.config
        options = [(cfg.max_util, cfg.ready_hedge), *cfg.alternatives]
        self.candidates = []
        best: tuple[float, list[tuple[float, float]], FluidPlan] | None = None
        for max_util, hedge in options:
            twin = copy.deepcopy(sim)
            self._prepare(twin, max_util, hedge)
            controls: list[tuple[float, float]] = []
            d = twin.cfg.decision_ticks
            while not twin.done:
                if twin.t % d == 0:
                    controls.append(self._decide(twin))
                    twin.set_controls(*controls[-1])
                twin.tick()
            cost = twin.stats.cost_usd
            self.candidates.append(((max_util, hedge), cost))
            if best is None or cost < best[0]:
                assert self.plan is not None
                best = (cost, controls, self.plan)
        assert best is not None
        self._schedule, self.plan = best[1], best[2]
        self._step = 0

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        self._step += 1
        return self._schedule[self._step - 1]

    def _prepare(self, sim: ScenarioSim, max_util: float, hedge: float) -> None:
        cfg, n, d = sim.cfg, sim.n_ticks, sim.cfg.decision_ticks
        sig = sim.signals
        wpc = watts_per_busy_core(sim.cores, sim.p_idle + sim.p_span)
        tick_h = cfg.tick_seconds / 3600.0
        self._lc = realised_load(sim, LATENCY_CRITICAL)
        jobs = sim.jobs
        b = jobs.cls == BATCH
        work = jobs.cores[b] * jobs.duration[b]
        avail = np.zeros(n)
        np.add.at(avail, jobs.arrival[b], work)
        due = np.zeros(n)
        np.add.at(due, np.clip(jobs.deadline[b] - 1, 0, n - 1), work)
        bcfg = cfg.classes[BATCH]
        dur = max(1.0, bcfg.duration_min_mean * 60.0 / cfg.tick_seconds)
        problem = FluidProblem(
            grid_usd_per_kwh=per_period(grid_usd_per_kwh(
                sig.price_usd_per_mwh[:n], sig.carbon_g_per_kwh[:n],
                cfg.cost.carbon_usd_per_tonne), d, "mean"),
            export_usd_per_kwh=(cfg.signals.export_price_usd_per_mwh or 0.0) / 1000.0,
            base_kwh=per_period(cfg.cost.pue * wpc * self._lc * tick_h / 1000.0, d),
            solar_kwh=per_period(sig.solar_kw[:n] * tick_h, d),
            room=per_period(np.maximum(max_util * sim.fleet_cores - self._lc, 0.0), d),
            due=np.cumsum(per_period(due, d)), avail=np.cumsum(per_period(avail, d)),
            kwh_per_core_tick=cfg.cost.pue * wpc * tick_h / 1000.0,
            shortfall_usd_per_core_tick=self.config.shortfall_factor * cfg.cost.sla_usd[BATCH]
            / max(bcfg.cores_mean * dur, 1e-9),
            peak_usd_per_kw=cfg.demand_usd_per_kw,  # a demand charge, when the tariff has one
            period_hours=per_period(np.full(n, tick_h), d))
        self.plan = solve(problem)
        self._busy = self.plan.work / np.diff(np.append(np.arange(0, n, d), n))
        self._hedge = hedge

    def _decide(self, sim: ScenarioSim) -> tuple[float, float]:
        v = plan_view(sim)
        p = min(sim.t // sim.cfg.decision_ticks, len(self._busy) - 1)
        lc_committed = float(v.running[0, 0] + v.queued[0]) if v.running.shape[1] else 0.0
        release_util = (lc_committed + float(self._busy[p])) / v.fleet_cores
        window = max(1, v.boot_ticks + v.decision_ticks)
        lc_peak = max(float(self._lc[sim.t:sim.t + window].max(initial=0.0)), lc_committed)
        batch_now = float(v.running[1, 0] + v.queued[1]) if v.running.shape[1] else 0.0
        ready = lc_peak * (1.0 + self._hedge) + max(float(self._busy[p]), batch_now) \
            + v.spare_cores
        return release_util, min(ready, v.fleet_cores)
