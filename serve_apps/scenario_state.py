"""A scenario state (request body) <-> the online controller's :class:`PlanView`.

:func:`view_of` checks a validated :class:`ScenarioState` against the deployed scenario
(one length for every forecast array, within its horizon and at least one decision
period; one length for the pool's arrays; fleet cores by
state summing to the scenario's fleet, per-class cores within the fleet) and builds the
``PlanView`` the controllers read; a state that does not fit is a
:class:`cloudrl.serving.state.StateError` naming the field (the service answers 422).
:func:`observed_view_of` adds what the learned policy's observation reads beyond the view
(the hour of the week, the fleet by power state): an
:class:`cloudrl.algorithms.distill.policy.ObservedView`.
:func:`state_of` is the inverse for a running :class:`ScenarioSim` (what a client, a test
or the benchmark sends for the simulator's present).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cloudrl.serving.state import StateError
from envs.scenario.control import PlanView, plan_view
from envs.scenario.sim import ACTIVE, BOOTING, OFF, RESUMING, SUSPENDED, ScenarioSim
from serve_apps.scenario_schemas import ScenarioState


def view_of(state: ScenarioState, sim: ScenarioSim) -> PlanView:
    """The ``PlanView`` of ``state`` on the scenario of ``sim`` (its static parts only)."""
    cfg = sim.cfg
    n = len(state.price_fc)
    for name, arr in (("carbon_fc", state.carbon_fc), ("solar_fc_kw", state.solar_fc_kw),
                      ("load_fc.latency_critical", state.load_fc.latency_critical),
                      ("load_fc.batch", state.load_fc.batch),
                      ("running.latency_critical", state.running.latency_critical),
                      ("running.batch", state.running.batch)):
        if len(arr) != n:
            raise StateError(name, f"{len(arr)} entries, price_fc has {n} (every forecast "
                                   f"array has one length)")
    pool = state.pool
    for name in ("duration_ticks", "latest_start_tick"):
        if len(getattr(pool, name)) != len(pool.cores):
            raise StateError(f"pool.{name}", f"{len(getattr(pool, name))} entries, "
                                             f"pool.cores has {len(pool.cores)} (one per job)")
    decision = state.decision_ticks or cfg.decision_ticks
    if n > sim.horizon_ticks:
        raise StateError("price_fc", f"{n} forecast ticks, the scenario's horizon is "
                                     f"{sim.horizon_ticks}")
    if n < decision:
        raise StateError("price_fc", f"{n} forecast ticks, at least one decision period "
                                     f"({decision} ticks) is needed")
    fleet = sim.fleet_cores
    tol = 1e-6 * max(fleet, 1.0)
    if abs(state.fleet.total - fleet) > tol:
        raise StateError("fleet", f"cores by state sum to {state.fleet.total:g}, the "
                                  f"scenario's fleet has {fleet:g}")
    for name, arr in (("running.latency_critical", state.running.latency_critical),
                      ("running.batch", state.running.batch)):
        if max(arr) > fleet + tol:
            raise StateError(name, f"{max(arr):g} cores > the fleet's {fleet:g}")
    if state.pool.cores and max(state.pool.cores) > sim.max_job_cores:
        i = int(np.argmax(state.pool.cores))
        raise StateError(f"pool.cores[{i}]", f"{state.pool.cores[i]:g} cores > the largest "
                                             f"server's {sim.max_job_cores:g}")
    f = state.fleet
    ticks_left = state.ticks_left if state.ticks_left is not None else cfg.episode_ticks
    return PlanView(
        t=state.tick, ticks_left=ticks_left, tick_seconds=cfg.tick_seconds,
        decision_ticks=decision, price_now=state.price_now, carbon_now=state.carbon_now,
        solar_now_kw=state.solar_now_kw, price_fc=np.asarray(state.price_fc, dtype=float),
        carbon_fc=np.asarray(state.carbon_fc, dtype=float),
        solar_fc_kw=np.asarray(state.solar_fc_kw, dtype=float),
        load_fc=np.array([state.load_fc.latency_critical, state.load_fc.batch], dtype=float),
        running=np.array([state.running.latency_critical, state.running.batch], dtype=float),
        queued=(state.queued.latency_critical, state.queued.batch),
        pool_cores=np.asarray(state.pool.cores, dtype=float),
        pool_duration=np.asarray(state.pool.duration_ticks, dtype=np.int64),
        pool_latest=np.asarray(state.pool.latest_start_tick, dtype=np.int64),
        fleet_cores=fleet, ready_cores=f.active + f.suspended + f.resuming,
        active_cores=f.active, coming_cores=f.resuming + f.booting,
        spare_cores=cfg.executor.spare_cores_frac * fleet,
        boot_ticks=cfg.boot_ticks, resume_ticks=cfg.resume_ticks)


def observed_view_of(view: PlanView, state: ScenarioState) -> PlanView:
    """``view`` with the state's ``hour_of_week`` and fleet by power state (an
    ``ObservedView``, what the learned policy observes); StateError when the state has no
    ``hour_of_week``."""
    from cloudrl.algorithms.distill.policy import FLEET_STATES, ObservedView

    if state.hour_of_week is None:
        raise StateError("hour_of_week", "required by the served learned policy (its "
                                         "observation reads the time of week): hours since "
                                         "Monday 00:00 at this tick, in [0, 168)")
    base = {name: getattr(view, name) for name in PlanView.__dataclass_fields__}
    return ObservedView(**base, hour_of_week=state.hour_of_week,
                        fleet_by_state=tuple(float(getattr(state.fleet, k))
                                             for k in FLEET_STATES))


def state_of(sim: ScenarioSim) -> dict[str, Any]:
    """The request body for ``sim``'s present (JSON-ready). Core counts the simulator
    carries as running sums can dip a rounding error below 0 (``-1e-13``); they are sent
    as 0, since the service accepts no negative cores."""
    v = plan_view(sim)
    by_state = {name: float(sim.cores[sim.state == code].sum()) for name, code in (
        ("active", ACTIVE), ("suspended", SUSPENDED), ("off", OFF), ("resuming", RESUMING),
        ("booting", BOOTING))}
    return {
        "tick": int(v.t), "ticks_left": int(v.ticks_left),
        "hour_of_week": float(sim.hour_of_week[sim.t]) % 168.0,
        "decision_ticks": int(v.decision_ticks),
        "price_now": v.price_now, "carbon_now": v.carbon_now, "solar_now_kw": v.solar_now_kw,
        "price_fc": v.price_fc.tolist(), "carbon_fc": v.carbon_fc.tolist(),
        "solar_fc_kw": v.solar_fc_kw.tolist(),
        "load_fc": {"latency_critical": v.load_fc[0].tolist(), "batch": v.load_fc[1].tolist()},
        "running": {"latency_critical": np.maximum(v.running[0], 0.0).tolist(),
                    "batch": np.maximum(v.running[1], 0.0).tolist()},
        "queued": {"latency_critical": max(float(v.queued[0]), 0.0),
                   "batch": max(float(v.queued[1]), 0.0)},
        "pool": {"cores": v.pool_cores.tolist(),
                 "duration_ticks": [int(x) for x in v.pool_duration],
                 "latest_start_tick": [int(x) for x in v.pool_latest]},
        "fleet": by_state,
    }
