"""Request cluster state -> ClusterSnapshot, checked against the policy's fleet and env.

The service answers 422 with :class:`StateError`'s field when a request does not fit
the policy: a different server count, a tier that is not the fleet's tier at that
index, usage above a server's capacity, more pending jobs than the queue the policy was
trained with, a priority level outside the interface's range.
``state_of(sim)`` is the inverse (a simulator state as a request body), for tests,
benchmarks and clients that drive the service from the simulator.

Signals: a policy whose env has ``EnvConfig.signals`` observes the price, carbon (and
solar) columns of ``envs.observation.signal_cols``. :func:`signal_row` computes that row
from the request's ``signals`` exactly as the env does (``episode_signals``: the same
scales, the forecast window's mean and minimum, the mean summed in the env's order), so
the observation equals the env's bit for bit; it raises StateError naming the field when
``signals`` is missing (the policy has signals), given to a policy without signals, has
a forecast whose length is not the policy's horizon in ticks, or gives solar the policy
does not observe (or lacks solar it does). :func:`env_state_of` is ``state_of`` of a live
env, signals included (the forecast the env's observation read at this tick).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cloudrl.serving.schemas import ClusterState, Signals
from envs.fleet import Fleet
from envs.observation import (
    CARBON_SCALE,
    FORECAST_EVERY_SECONDS,
    PRICE_SCALE,
    signal_cols,
    signal_has_solar,
)
from envs.sim import ClusterSim
from envs.sim_config import SimConfig
from envs.snapshot import POWER_STATES, ClusterSnapshot

if TYPE_CHECKING:
    from envs.cluster_env import _ClusterEnvBase

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


# ---------------------------------------------------------------------- signals
@dataclass(frozen=True)
class SignalLayout:
    """What a policy's env needs of a request's ``signals``: the columns it observes, the
    forecast length in ticks, whether solar is observed, and the constants of the row."""

    columns: tuple[str, ...]
    horizon_ticks: int
    horizon_hours: float
    tick_seconds: float
    forecast_every: int  # ticks between forecast issues in the env (the mean's sum order)
    solar: bool
    peak_kw: float  # the fleet's peak power (solar columns are kW / this)

    def describe(self) -> dict[str, Any]:
        """The layout for clients (``GET /v1/fleet``)."""
        fields = ["price_now", "carbon_now", "price_fc", "carbon_fc"]
        if self.solar:
            fields += ["solar_now_kw", "solar_fc_kw"]
        return {"required": fields, "horizon_ticks": self.horizon_ticks,
                "horizon_hours": self.horizon_hours, "tick_seconds": self.tick_seconds,
                "solar": self.solar, "columns": list(self.columns),
                "units": {"price": "$/MWh", "carbon": "gCO2/kWh", "solar": "kW"}}


def signal_layout(env: _ClusterEnvBase) -> SignalLayout | None:
    """The signal layout of ``env`` (None: the env has no signals)."""
    cfg = env.config.signals
    if cfg is None:
        return None
    tick_seconds = float(env.config.sim.tick_seconds)
    horizon = cfg.horizon_ticks(tick_seconds)
    every = min(horizon, max(1, int(FORECAST_EVERY_SECONDS // tick_seconds)))  # as the env
    return SignalLayout(columns=signal_cols(cfg), horizon_ticks=horizon,
                        horizon_hours=float(cfg.horizon_hours), tick_seconds=tick_seconds,
                        forecast_every=every, solar=signal_has_solar(cfg),
                        peak_kw=env.sim.fleet_peak_w / 1000.0)


def _window_mean(values: np.ndarray, i: int) -> float:
    """The mean of ``values`` summed as ``envs.vector_kernels.forecast_window_stats`` sums
    the window of the ``i``-th tick after a forecast issue: its first ``H - i`` values from
    the last one down, then the remaining ``i`` in order (bit-for-bit the env's mean)."""
    h = len(values)
    total = float(np.cumsum(values[h - 1 - i::-1])[-1])
    if i:
        total += float(np.cumsum(values[h - i:])[-1])
    return total / h


def _check_signals(signals: Signals | None, layout: SignalLayout | None) -> None:
    if layout is None:
        if signals is not None:
            raise StateError("signals", "the policy observes no signals (its env config has "
                             "no signals): leave signals out")
        return
    h = layout.horizon_ticks
    if signals is None:
        raise StateError("signals", f"the policy observes signals: give signals with "
                         f"{', '.join(layout.describe()['required'])} (forecasts: {h} values, "
                         f"one per {layout.tick_seconds:g} s tick t+1..t+{h})")
    for name in ("solar_now_kw", "solar_fc_kw"):
        given = getattr(signals, name) is not None
        if given and not layout.solar:
            raise StateError(f"signals.{name}", "the policy's signals carry no solar "
                             "(solar_kwp 0, not a csv source): leave it out")
        if layout.solar and not given:
            raise StateError(f"signals.{name}", "missing: the policy observes on-site solar")
    for name in ("price_fc", "carbon_fc", "solar_fc_kw"):
        values = getattr(signals, name)
        if values is not None and len(values) != h:
            raise StateError(f"signals.{name}", f"{len(values)} values given, the policy's "
                             f"forecast horizon is {h} ticks ({layout.horizon_hours:g} h of "
                             f"{layout.tick_seconds:g} s ticks): one value per tick "
                             f"t+1..t+{h}")


def signal_row(signals: Signals | None, layout: SignalLayout | None,
               tick: int) -> np.ndarray | None:
    """The observation's signal columns for ``signals`` at ``tick`` (float32, read-only,
    the env's values bit for bit), or None for a policy without signals. Raises
    StateError naming the field (see the module docstring)."""
    _check_signals(signals, layout)
    if layout is None or signals is None:
        return None
    i = int(tick) % layout.forecast_every
    price, carbon = float(signals.price_now), float(signals.carbon_now)
    cols = [price / PRICE_SCALE, carbon / CARBON_SCALE]
    for now, fc, scale in ((price, signals.price_fc, PRICE_SCALE),
                           (carbon, signals.carbon_fc, CARBON_SCALE)):
        values = np.asarray(fc, dtype=np.float64)
        cols += [(_window_mean(values, i) - now) / scale, (float(values.min()) - now) / scale]
    if layout.solar:
        solar = np.asarray(signals.solar_fc_kw, dtype=np.float64)
        cols += [float(signals.solar_now_kw) / layout.peak_kw,
                 _window_mean(solar, i) / layout.peak_kw]
    row = np.asarray(cols, dtype=np.float64).astype(np.float32)
    row.setflags(write=False)  # the env's feature table is read-only too (one compiled path)
    return row


class _EveryTick:
    """A signal feature table that holds one row at every tick (the request's)."""

    def __init__(self, row: np.ndarray) -> None:
        self.row = row

    def __getitem__(self, tick: int) -> np.ndarray:
        return self.row


def observe_with_signals(env: _ClusterEnvBase, snapshot: ClusterSnapshot,
                         row: np.ndarray) -> dict[str, np.ndarray]:
    """``env.observe_snapshot(snapshot)`` for an env with signals: the snapshot is loaded
    and observed by the env's own builder with ``row`` as the tick's signal columns (the
    env's ``observe_snapshot`` refuses snapshots when the env has signals, since a
    snapshot carries none)."""
    if len(row) != env.n_signal:
        raise ValueError(f"{len(row)} signal columns, the env observes {env.n_signal}")
    env.sim.load_snapshot(snapshot)
    obs, _ = env.obs_builder.observe(_EveryTick(row))  # type: ignore[arg-type]
    return obs


def signals_of(env: _ClusterEnvBase) -> dict[str, Any]:
    """The ``signals`` of a request for a live env with signals at its current tick: the
    price, carbon (and solar) now and the forecast its observation read (issued at the
    env's last forecast issue, for ticks t+1..t+H)."""
    from envs.signals import forecast

    sig = env.signals
    if sig is None:
        raise ValueError("signals_of: the env has no signals (or was not reset)")
    t, h, every = int(env.sim.t), sig.horizon_ticks, sig.forecast_every
    t0 = t - t % every
    series = sig.series
    price, carbon, solar = forecast(series, t0, h + every - 1, env.config.signals.forecast_error,
                                    int(env.episode_seed))
    window = slice(t - t0, t - t0 + h)
    out: dict[str, Any] = {"price_now": float(series.price_usd_per_mwh[t]),
                           "carbon_now": float(series.carbon_g_per_kwh[t]),
                           "price_fc": price[window].tolist(),
                           "carbon_fc": carbon[window].tolist()}
    if signal_has_solar(env.config.signals):
        out["solar_now_kw"] = float(series.solar_kw[t])
        out["solar_fc_kw"] = solar[window].tolist()
    return out


def env_state_of(env: _ClusterEnvBase) -> dict[str, Any]:
    """``state_of(env.sim)`` plus, for an env with signals, its ``signals`` (JSON-ready)."""
    state = state_of(env.sim)
    if env.n_signal:
        state["signals"] = signals_of(env)
    return state
