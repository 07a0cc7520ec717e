"""Request cluster state -> ClusterSnapshot, checked against the policy's fleet and env.

The service answers 422 with :class:`StateError`'s field when a request does not fit
the policy: a different server count, a tier that is not the fleet's tier at that
index, usage above a server's capacity, more pending jobs than the queue the policy was
trained with, a priority level outside the interface's range.
``state_of(sim)`` is the inverse (a simulator state as a request body), for tests,
benchmarks and clients that drive the service from the simulator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envs.fleet import Fleet
from envs.sim import ClusterSim
from envs.sim_config import SimConfig
from envs.snapshot import POWER_STATES, ClusterSnapshot
from serve_apps.schemas import ClusterState

_EPS = 1e-9
_STATE_CODE = {name: code for code, name in enumerate(POWER_STATES)}


class StateError(ValueError):
    """A request state that does not fit the policy; ``field`` is its location."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def to_snapshot(state: ClusterState, fleet: Fleet, sim_cfg: SimConfig) -> ClusterSnapshot:
    """The request's state in simulator units; raises StateError naming the field."""
    n = fleet.n_servers
    if len(state.servers) != n:
        raise StateError("servers", f"{len(state.servers)} servers given, the policy's "
                         f"fleet has {n}")
    if len(state.jobs) > sim_cfg.queue_capacity:
        raise StateError("jobs", f"{len(state.jobs)} pending jobs, the policy's queue holds "
                         f"at most {sim_cfg.queue_capacity}")
    if state.priority_level >= sim_cfg.priority_levels:
        raise StateError("priority_level", f"{state.priority_level} outside "
                         f"[0, {sim_cfg.priority_levels})")
    cpu_unit, mem_unit = fleet.largest_cpu_cores, fleet.largest_mem_gib
    servers = state.servers
    tiers = [s.tier for s in servers]
    expected = [fleet.tier_names[t] for t in fleet.tier.tolist()]
    if tiers != expected:
        i = next(i for i, (a, b) in enumerate(zip(tiers, expected, strict=True)) if a != b)
        raise StateError(f"servers[{i}].tier", f"{tiers[i]!r}, but server {i} of the "
                         f"policy's fleet is {expected[i]!r}")
    used_cpu = np.array([s.used_cpu_cores for s in servers]) / cpu_unit
    used_mem = np.array([s.used_mem_gib for s in servers]) / mem_unit
    for used, cap, field, unit, what in ((used_cpu, fleet.cpu_cap, "used_cpu_cores", cpu_unit,
                                          "cores"),
                                         (used_mem, fleet.mem_cap, "used_mem_gib", mem_unit,
                                          "GiB")):
        over = np.flatnonzero(used > cap + _EPS)
        if len(over):
            i = int(over[0])
            raise StateError(f"servers[{i}].{field}", f"{used[i] * unit:g} exceeds the "
                             f"tier's {cap[i] * unit:g} {what}")
    job_cpu = np.array([j.cpu_cores for j in state.jobs], dtype=np.float64)
    job_mem = np.array([j.mem_gib for j in state.jobs], dtype=np.float64)
    too_big = np.flatnonzero((job_cpu > cpu_unit) | (job_mem > mem_unit))
    if len(too_big):
        k = int(too_big[0])
        raise StateError(f"jobs[{k}]", f"demand {job_cpu[k]:g} cores / {job_mem[k]:g} GiB "
                         f"exceeds the largest server ({cpu_unit:g} / {mem_unit:g})")
    jobs = state.jobs
    day_tick = state.tick if state.time_of_day_tick is None else state.time_of_day_tick
    return ClusterSnapshot(
        tick=state.tick,
        power_state=np.array([_STATE_CODE[s.power_state] for s in servers], dtype=np.int8),
        wake_left=np.array([s.wake_left for s in servers], dtype=np.int64),
        used_cpu=used_cpu, used_mem=used_mem,
        n_running=np.array([s.n_running for s in servers], dtype=np.int64),
        job_cpu=job_cpu / cpu_unit, job_mem=job_mem / mem_unit,
        job_duration=np.array([j.duration for j in jobs], dtype=np.int64),
        job_deadline=np.array([j.deadline for j in jobs], dtype=np.int64),
        job_age=np.array([j.age for j in jobs], dtype=np.int64),
        arrival_rate=state.arrival_rate, violation_rate=state.violation_rate,
        priority_level=state.priority_level, clock_offset=day_tick - state.tick)


def state_of(sim: ClusterSim) -> dict[str, Any]:
    """A simulator's current state as a ``ClusterState`` request body (JSON-ready)."""
    snap, fleet = sim.snapshot(), sim.fleet
    cpu_unit, mem_unit = fleet.largest_cpu_cores, fleet.largest_mem_gib
    servers = [{"tier": fleet.tier_names[fleet.tier[i]],
                "power_state": POWER_STATES[int(snap.power_state[i])],
                "wake_left": int(snap.wake_left[i]),
                "used_cpu_cores": float(snap.used_cpu[i] * cpu_unit),
                "used_mem_gib": float(snap.used_mem[i] * mem_unit),
                "n_running": int(snap.n_running[i])} for i in range(fleet.n_servers)]
    jobs = [{"cpu_cores": float(snap.job_cpu[k] * cpu_unit),
             "mem_gib": float(snap.job_mem[k] * mem_unit),
             "duration": int(snap.job_duration[k]), "deadline": int(snap.job_deadline[k]),
             "age": int(snap.job_age[k])} for k in range(len(snap.job_age))]
    return {"tick": snap.tick, "time_of_day_tick": snap.tick + snap.clock_offset,
            "servers": servers, "jobs": jobs, "arrival_rate": snap.arrival_rate,
            "violation_rate": snap.violation_rate, "priority_level": snap.priority_level}
