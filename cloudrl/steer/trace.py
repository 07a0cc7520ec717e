"""Per-tick traces of scenario episodes: a recorder around ``ScenarioSim.tick``.

A :class:`Trace` holds, per tick, what the tick cost and what the cluster did (the names
in :data:`TICK_FIELDS`), and the power-state toggles of every server per day
(``toggles``: days x servers). Hidden utilities (:mod:`.utilities`) and the learner's
features (:mod:`.reward`) are both computed from traces; a trace travels to an operator
inside the segment view (:func:`Trace.to_json`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.scenario.config import ScenarioConfig
from envs.scenario.sim import ACTIVE, BOOTING, RESUMING, ScenarioSim

TICK_FIELDS = ("hour", "price", "carbon", "grid_kwh", "energy_usd", "carbon_usd",
               "carbon_kg", "sla_usd", "viol_lc", "viol_batch", "queued_lc", "queued_batch",
               "pool_cores", "transitions", "release_util", "ready_cores", "active")
TICKS_PER_DAY_HOURS = 24.0


@dataclass
class Trace:
    """One episode, tick by tick: ``ticks[name]`` (T,), ``toggles`` (days, servers)."""

    ticks: dict[str, np.ndarray]
    toggles: np.ndarray
    tick_seconds: float
    fleet_cores: float

    @property
    def length(self) -> int:
        return len(self.ticks["hour"])

    def to_json(self) -> dict[str, Any]:
        return {"ticks": {k: [round(float(x), 6) for x in v] for k, v in self.ticks.items()},
                "toggles": self.toggles.astype(int).tolist(),
                "tick_seconds": self.tick_seconds, "fleet_cores": self.fleet_cores}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Trace:
        ticks = {k: np.asarray(doc["ticks"][k], float) for k in TICK_FIELDS}
        return cls(ticks, np.asarray(doc["toggles"], float), float(doc["tick_seconds"]),
                   float(doc["fleet_cores"]))

    def cost_usd(self) -> float:
        t = self.ticks
        return float((t["energy_usd"] + t["carbon_usd"] + t["sla_usd"]).sum())


def _toggled(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Servers whose power state was switched in a tick (a resume or boot finishing is not
    a switch)."""
    finished = np.isin(before, (RESUMING, BOOTING)) & (after == ACTIVE)
    return (before != after) & ~finished


def record(sim: ScenarioSim, controller: Any, seed: int) -> Trace:
    """Play ``controller`` on ``sim`` from ``seed`` to the end, recording every tick."""
    cfg: ScenarioConfig = sim.cfg
    sim.reset(int(seed))
    controller.reset(sim)
    n = sim.n_ticks
    hours = cfg.tick_seconds / 3600.0
    days = int(np.ceil(n * hours / TICKS_PER_DAY_HOURS))
    out = {k: np.zeros(n) for k in TICK_FIELDS}
    toggles = np.zeros((max(days, 1), sim.n))
    d = cfg.decision_ticks
    while not sim.done:
        t = sim.t
        if t % d == 0:
            sim.set_controls(*controller.decide(sim))
        before = sim.state.copy()
        pool = float(sim.pool_work()[0].sum())
        tc = sim.tick()
        switched = _toggled(before, sim.state)
        toggles[int(t * hours // TICKS_PER_DAY_HOURS)] += switched
        q = sim.queued_cores_by_class()
        row = {"hour": float(sim.hour_of_week[t] % 24.0),
               "price": float(sim.signals.price_usd_per_mwh[t]),
               "carbon": float(sim.signals.carbon_g_per_kwh[t]), "grid_kwh": tc.grid_kwh,
               "energy_usd": tc.energy_usd, "carbon_usd": tc.carbon_usd,
               "carbon_kg": tc.carbon_kg, "sla_usd": tc.sla_usd, "viol_lc": tc.violations[0],
               "viol_batch": tc.violations[1], "queued_lc": q[0], "queued_batch": q[1],
               "pool_cores": pool, "transitions": float(switched.sum()),
               "release_util": float(min(sim.release_util, 2.0)),
               "ready_cores": float(sim.ready_cores) / sim.fleet_cores,
               "active": float((sim.state == ACTIVE).sum()) / sim.n}
        for k, v in row.items():
            out[k][t] = v
    return Trace(out, toggles, float(cfg.tick_seconds), float(sim.fleet_cores))


def _worker_state(cfg: ScenarioConfig) -> dict[str, Any]:
    return {"sim": ScenarioSim(cfg), "ctrls": {}}


def _worker_trace(state: dict[str, Any], item: tuple[str, str, int]) -> Trace:
    from cloudrl.scenarios.runner import ControllerSpec

    kind, params_json, seed = item
    ctrl = state["ctrls"].get((kind, params_json))
    if ctrl is None:
        import json

        ctrl = state["ctrls"][(kind, params_json)] = ControllerSpec(
            kind, json.loads(params_json)).build()
    return record(state["sim"], ctrl, seed)


def record_many(cfg: ScenarioConfig, specs: list[Any], seeds: list[int],
                workers: int = 1) -> list[list[Trace]]:
    """``out[i][k]``: the trace of ``specs[i]`` (``ControllerSpec``) on ``seeds[k]``;
    ``workers`` Ray actors (1: in this process)."""
    import json

    items = [(s.kind, json.dumps(s.params, sort_keys=True), int(k)) for s in specs for k in seeds]
    if workers <= 1 or len(items) < 2:
        state = _worker_state(cfg)
        flat = [_worker_trace(state, it) for it in items]
    else:
        from cloudrl.parallel import ordered_map

        flat = ordered_map(_worker_trace, items, workers, init=_worker_state, init_args=(cfg,))
    n = len(seeds)
    return [flat[i * n:(i + 1) * n] for i in range(len(specs))]
