"""Observation features: one code path from simulator state to the Dict observation.

``macro`` holds platform aggregates (per-tier load and power-state fractions,
queue pressure, arrival and violation estimates, power draw, time features),
``servers`` one row per server, ``jobs`` one row per visible queue slot. The
column layout is named here (``SERVER_COLS``, ``JOB_COLS``) so heuristics and
the decision service read features by name, never by magic index.
Demands and capacities are in largest-machine units, times in ``TIME_SCALE`` ticks.

With signals (``EnvConfig.signals``), ``macro`` ends with :func:`signal_cols` (the base
columns keep their indices); their values for every tick of an episode are computed once
at reset (:func:`episode_signals`) and a step only copies its tick's row:

* ``price_now``: the tick's electricity price / ``PRICE_SCALE`` (100 $/MWh);
* ``carbon_now``: the tick's grid carbon intensity / ``CARBON_SCALE`` (500 gCO2/kWh);
* ``price_fc_mean``, ``price_fc_min``: mean and minimum of the price forecast over the
  next ``horizon_hours`` (``SignalConfig``), minus the price now, / ``PRICE_SCALE``
  (negative: cheaper ahead);
* ``carbon_fc_mean``, ``carbon_fc_min``: the same for carbon, / ``CARBON_SCALE``;
* only when the signals can carry solar (``solar_kwp > 0`` or a ``csv`` source):
  ``solar_now`` and ``solar_fc_mean`` (on-site solar kW / the fleet's peak kW).

Forecasts are those of :mod:`envs.signals.forecast` (noise growing with lead time, seeded
by the episode seed), re-issued every ``FORECAST_EVERY_SECONDS`` (one hour, or every tick
when ticks are longer, and at least once per horizon): the summary at tick ``t`` reads the
forecast issued at the last issue tick ``t0 <= t`` for ticks ``t+1 .. t+H``. That keeps a
whole episode's summaries O(episode ticks x horizon hours) at reset instead of
O(episode ticks x horizon ticks).
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from gymnasium import spaces

from envs import kernels
from envs import vector_kernels as vk
from envs.sim import ClusterSim

if TYPE_CHECKING:
    from envs.signals import SignalConfig, SignalSeries

TIME_SCALE = 100.0  # ticks; times in features are divided by this
RUNNING_SCALE = 10.0

SERVER_COLS = (
    "cpu_cap", "mem_cap", "cpu_free", "mem_free", "cpu_util", "is_active", "is_asleep",
    "is_waking", "wake_left", "n_running", "watts_per_cpu", "p_idle",
)
JOB_COLS = ("present", "cpu", "mem", "duration", "age", "slack", "fits_somewhere")
S = {name: i for i, name in enumerate(SERVER_COLS)}
J = {name: i for i, name in enumerate(JOB_COLS)}
MACRO_TAIL = (
    "queue_fill", "queue_mean_age", "queue_max_age", "queue_cpu_demand", "arrival_rate",
    "power_frac", "asleep_frac", "violation_rate", "time_sin", "time_cos", "progress",
)


SIGNAL_COLS = ("price_now", "carbon_now", "price_fc_mean", "price_fc_min", "carbon_fc_mean",
               "carbon_fc_min")
SOLAR_COLS = ("solar_now", "solar_fc_mean")
PRICE_SCALE = 100.0  # $/MWh
CARBON_SCALE = 500.0  # gCO2/kWh
FORECAST_EVERY_SECONDS = 3600.0
USD_PER_KWH_REF = 0.1  # the reward's dollar term is in ticks at fleet peak power at $100/MWh


def macro_size(n_tiers: int, n_signal: int = 0) -> int:
    """Length of the macro row: the base columns, then ``n_signal`` signal columns."""
    return 4 * n_tiers + len(MACRO_TAIL) + n_signal


def signal_has_solar(signals: SignalConfig) -> bool:
    """Whether the signals can carry on-site solar (configured PV, or a file's column)."""
    return signals.solar_kwp > 0 or signals.source == "csv"


def signal_cols(signals: SignalConfig | None) -> tuple[str, ...]:
    """The signal columns appended to ``macro`` (none without signals)."""
    if signals is None:
        return ()
    return SIGNAL_COLS + (SOLAR_COLS if signal_has_solar(signals) else ())


def server_features(n_tiers: int) -> int:
    return len(SERVER_COLS) + n_tiers


def observation_space(sim: ClusterSim, mask_size: int, n_signal: int = 0) -> spaces.Dict:
    """The Dict space of both envs; only the mask length differs between interfaces (and
    the macro length, by the ``n_signal`` signal columns)."""
    n, t, k = sim.fleet.n_servers, sim.fleet.n_tiers, sim.cfg.queue_window
    f32 = np.float32
    return spaces.Dict({
        "macro": spaces.Box(-np.inf, np.inf, (macro_size(t, n_signal),), f32),
        "servers": spaces.Box(-np.inf, np.inf, (n, server_features(t)), f32),
        "jobs": spaces.Box(-np.inf, np.inf, (k, len(JOB_COLS)), f32),
        "action_mask": spaces.Box(0.0, 1.0, (mask_size,), f32),
    })


class ObservationBuilder:
    """Builds observations for one simulator; static columns are computed once.

    The server rows, job rows, macro row and the interface's action mask come
    from one compiled call (``envs.kernels.observe_env``, the batched env's rules)
    over the simulator's ``dyn`` matrix and job arrays.
    """

    def __init__(self, sim: ClusterSim, branching: bool = False) -> None:
        fleet = sim.fleet
        cfg = sim.cfg
        self.sim = sim
        n, t = fleet.n_servers, fleet.n_tiers
        self._static = np.zeros((n, server_features(t)), dtype=np.float32)
        self._static[:, S["cpu_cap"]] = fleet.cpu_cap
        self._static[:, S["mem_cap"]] = fleet.mem_cap
        watts_per_cpu = fleet.p_max / fleet.cpu_cap
        self._static[:, S["watts_per_cpu"]] = watts_per_cpu / watts_per_cpu.max()
        self._static[:, S["p_idle"]] = fleet.p_idle / fleet.p_max.max()
        self._static[:, len(SERVER_COLS):] = fleet.tier_onehot
        self._cpu_cap = np.ascontiguousarray(fleet.cpu_cap, dtype=np.float64)
        self._mem_cap = np.ascontiguousarray(fleet.mem_cap, dtype=np.float64)
        self._tier = np.ascontiguousarray(fleet.tier, dtype=np.int64)
        # dyn[:, is_active..n_running] scaled into the server columns of the same order
        self._flag_scale = np.array([1.0, 1.0, 1.0, 1.0 / max(1, cfg.wake_delay),
                                     1.0 / RUNNING_SCALE])
        tier_count = fleet.tier_onehot.sum(axis=0)
        den = np.stack([fleet.tier_onehot.T @ fleet.cpu_cap, tier_count, tier_count, tier_count])
        # a tier with no server (tiny fleets) reports zeros, not NaN
        self._tier_norm = np.divide(1.0, den, out=np.zeros_like(den), where=den > 0)
        self._inv_peak_w = 1.0 / float(fleet.p_max.sum())
        self._two_pi_over_day = 2.0 * np.pi / cfg.diurnal_period
        period = cfg.diurnal_period
        step = self._two_pi_over_day
        # sin/cos of each tick of the day: the phase is an integer tick, so a table is exact
        self._sin = np.array([math.sin(k * step) for k in range(period)])
        self._cos = np.array([math.cos(k * step) for k in range(period)])
        fpar = np.zeros(9)
        fpar[vk.P_TICK_SECONDS] = cfg.tick_seconds
        fpar[vk.P_PEAK_W] = sim.fleet_peak_w
        fpar[vk.P_INV_PEAK_W] = self._inv_peak_w
        fpar[vk.P_TOTAL_CPU] = sim.capacity.total_cpu
        fpar[vk.P_ALPHA] = cfg.alpha
        fpar[vk.P_BETA] = cfg.beta
        fpar[vk.P_TOGGLE] = cfg.toggle_penalty
        fpar[vk.P_INVALID] = cfg.invalid_action_penalty
        fpar[vk.P_TIME_SCALE] = TIME_SCALE
        ipar = np.zeros(8, dtype=np.int64)
        ipar[vk.Q_WINDOW] = cfg.queue_window
        ipar[vk.Q_CAPACITY] = cfg.queue_capacity
        ipar[vk.Q_WAKE_DELAY] = cfg.wake_delay
        ipar[vk.Q_EPISODE_LENGTH] = cfg.episode_length
        ipar[vk.Q_LEVELS] = cfg.priority_levels
        ipar[vk.Q_PERIOD] = period
        ipar[vk.Q_BRANCHING] = int(branching)
        ipar[vk.Q_TIERS] = t
        self.fpar, self.ipar = fpar, ipar

    def observe(self, signal_features: np.ndarray | None = None
                ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """(the Dict observation of the current tick, its bool action mask); fresh arrays.

        ``signal_features``: the episode's (ticks + 1, n_signal) table of signal columns
        (:class:`EpisodeSignals`); the current tick's row is appended to ``macro``."""
        sim = self.sim
        if signal_features is not None:
            macro, servers, jobs, mask, mask_f = vk.observe_env_signals(
                sim.dyn, np.array(sim.queue, dtype=np.int64), sim.job_cpu, sim.job_mem,
                sim.job_arrival, sim.job_duration, sim.job_latest_start, sim.t,
                sim.clock_offset, sim.arrival_ema, sim.violation_ema, self._cpu_cap,
                self._mem_cap, self._tier, self._static, self._flag_scale, self._tier_norm,
                self._sin, self._cos, self.fpar, self.ipar, signal_features[sim.t])
            return {"macro": macro, "servers": servers, "jobs": jobs,
                    "action_mask": mask_f}, mask
        macro, servers, jobs, mask, mask_f = kernels.observe_env(
            sim.dyn, np.array(sim.queue, dtype=np.int64), sim.job_cpu, sim.job_mem,
            sim.job_arrival, sim.job_duration, sim.job_latest_start, sim.t, sim.clock_offset,
            sim.arrival_ema, sim.violation_ema, self._cpu_cap, self._mem_cap, self._tier,
            self._static, self._flag_scale, self._tier_norm, self._sin, self._cos, self.fpar,
            self.ipar)
        return {"macro": macro, "servers": servers, "jobs": jobs, "action_mask": mask_f}, mask


# ---------------------------------------------------------------------- signals
@dataclass(frozen=True, eq=False)
class EpisodeSignals:
    """One episode's signals, precomputed at reset and indexed by tick.

    ``price``, ``carbon``, ``solar_j`` (float64, one value per stepped tick 0..L-1): $/MWh,
    gCO2/kWh and on-site solar energy of the tick in joules; ``features`` (float32,
    (L + 1, n_signal)): the macro signal columns of the observation at ticks 0..L;
    ``series``: the whole :class:`envs.signals.SignalSeries` (L + horizon + 1 ticks)."""

    series: SignalSeries
    price: np.ndarray
    carbon: np.ndarray
    solar_j: np.ndarray
    features: np.ndarray
    forecast_every: int
    horizon_ticks: int


def forecast_summary(series: SignalSeries, seed: int, error: float, horizon: int,
                     every: int, n_obs: int, rows: tuple[int, ...] = (0, 1, 2)
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, min) of the forecast over ticks ``t+1 .. t+horizon`` for ``t < n_obs``, each
    (len(rows), n_obs), where the forecast seen at ``t`` is the one issued at
    ``t0 = t - t % every`` (``envs.signals.forecast`` with ``seed``; ``1 <= every <=
    horizon``). Rows are price, carbon, solar (``rows`` picks them).

    The forecast values are those of ``forecast(series, t0, horizon + every - 1, error,
    seed)`` bit for bit, so the window minimum is exact and the mean equal up to rounding;
    one compiled pass (``envs.vector_kernels.forecast_window_stats``)."""
    from envs.signals.forecast import error_paths

    if not 1 <= every <= horizon:
        raise ValueError(f"every: must be in 1..horizon ({horizon}), got {every}")
    sel = list(rows)
    arrays = (series.price_usd_per_mwh, series.carbon_g_per_kwh, series.solar_kw)
    truth = np.stack([arrays[i] for i in sel])
    if error != 0:
        # only the paths of the rows asked for, up to the last (the rows are drawn in order)
        paths = error_paths(seed, series.n_ticks, series.tick_seconds, max(sel) + 1)
        paths = paths if sel == list(range(len(paths))) else np.ascontiguousarray(paths[sel])
    else:
        paths = np.zeros_like(truth)
    out_mean = np.empty((len(sel), n_obs))
    out_min = np.empty((len(sel), n_obs))
    vk.forecast_window_stats(truth, paths, float(error), int(horizon), int(every), out_mean,
                             out_min)
    return out_mean, out_min


EPISODE_CACHE_BYTES = 64 << 20
EPISODE_PROBATION = 16  # episodes built once, kept until this many newer ones are
EPISODE_GHOSTS = 4096  # keys remembered after they leave probation unasked
_episode_cache: OrderedDict = OrderedDict()  # asked again: key -> (signals, bytes), LRU
_episode_new: OrderedDict = OrderedDict()  # probation: built once, not asked since
_episode_ghosts: OrderedDict = OrderedDict()  # keys that left probation unasked
_episode_cache_bytes = 0  # both tiers
_episode_cache_lock = threading.Lock()


def episode_signals(signals: SignalConfig, episode_length: int, tick_seconds: float,
                    seed: int, peak_w: float) -> EpisodeSignals:
    """The :class:`EpisodeSignals` of the episode of ``seed`` (see the module docstring).

    Deterministic in its arguments, so episodes are kept for reuse, per process and shared
    by every env, up to ``EPISODE_CACHE_BYTES`` (least recently used first out): resets on
    a seed pool build each episode's signals once, or twice when its seed comes back only
    after ``EPISODE_PROBATION`` other episodes were built. Two tiers (2Q): a new episode
    is kept on probation among the last ``EPISODE_PROBATION`` built; asked for again, it
    moves to the main tier; leaving probation unasked, only its key is remembered (the
    last ``EPISODE_GHOSTS``), and a remembered key goes to the main tier when it is built
    again. So episodes on new seeds, never asked twice, do not fill the cache: their
    memory is reused instead of growing the process by ~0.1 MB per episode (page faults
    that cost more than building the signals). Their arrays are read-only."""
    global _episode_cache_bytes
    stamp = None
    if signals.source == "csv":  # a changed file is a new key
        st = os.stat(signals.csv_path) if os.path.isfile(signals.csv_path) else None
        stamp = (st.st_mtime_ns, st.st_size) if st else None
    key = (signals, int(episode_length), float(tick_seconds), int(seed), float(peak_w), stamp)
    with _episode_cache_lock:
        hit = _episode_cache.get(key)
        if hit is not None:
            _episode_cache.move_to_end(key)
            return hit[0]
        hit = _episode_new.pop(key, None)
        if hit is not None:  # asked again: to the main tier
            _episode_cache[key] = hit
            return hit[0]
        again = _episode_ghosts.pop(key, 0) is None
    sig = _build_episode_signals(signals, int(episode_length), float(tick_seconds), int(seed),
                                 float(peak_w))
    size = sum(a.nbytes for a in (sig.price, sig.carbon, sig.solar_j, sig.features,
                                  sig.series.price_usd_per_mwh, sig.series.carbon_g_per_kwh,
                                  sig.series.solar_kw))
    if size <= EPISODE_CACHE_BYTES:
        with _episode_cache_lock:
            if key not in _episode_cache and key not in _episode_new:
                (_episode_cache if again else _episode_new)[key] = (sig, size)
                _episode_cache_bytes += size
            while len(_episode_new) > EPISODE_PROBATION:
                old, (_, old_size) = _episode_new.popitem(last=False)
                _episode_cache_bytes -= old_size
                _episode_ghosts[old] = None
            while len(_episode_ghosts) > EPISODE_GHOSTS:
                _episode_ghosts.popitem(last=False)
            while _episode_cache_bytes > EPISODE_CACHE_BYTES:
                tier = _episode_cache if _episode_cache else _episode_new
                _episode_cache_bytes -= tier.popitem(last=False)[1][1]
    return sig


def _build_episode_signals(signals: SignalConfig, episode_length: int, tick_seconds: float,
                           seed: int, peak_w: float) -> EpisodeSignals:
    from envs.signals import make_signals

    horizon = signals.horizon_ticks(tick_seconds)
    every = min(horizon, max(1, int(FORECAST_EVERY_SECONDS // tick_seconds)))
    series = make_signals(signals, episode_length + horizon + 1, tick_seconds, seed)
    solar = signal_has_solar(signals)
    rows = (0, 1, 2) if solar else (0, 1)
    fc_mean, fc_min = forecast_summary(series, seed, signals.forecast_error, horizon, every,
                                       episode_length + 1, rows)
    n_obs = episode_length + 1
    price = series.price_usd_per_mwh[:n_obs]
    carbon = series.carbon_g_per_kwh[:n_obs]
    features = np.empty((n_obs, 8 if solar else 6), dtype=np.float32)
    vk.signal_features(price, carbon, series.solar_kw[:n_obs], fc_mean, fc_min, PRICE_SCALE,
                       CARBON_SCALE, peak_w / 1000.0, features)
    solar_j = series.solar_kw[:episode_length] * 1000.0 * tick_seconds
    for arr in (features, solar_j):
        arr.setflags(write=False)
    return EpisodeSignals(
        series=series, price=np.ascontiguousarray(price[:episode_length]),
        carbon=np.ascontiguousarray(carbon[:episode_length]), solar_j=solar_j,
        features=features, forecast_every=every, horizon_ticks=horizon)


def signal_cost_params(signals: SignalConfig, carbon_usd_per_tonne: float, weight: float,
                       peak_w: float, tick_seconds: float) -> np.ndarray:
    """The float parameters of the step's dollar cost (``vector_kernels.S_*``)."""
    spar = np.zeros(vk.N_SPAR)
    spar[vk.S_EXPORT_USD_PER_MWH] = float(signals.export_price_usd_per_mwh or 0.0)
    spar[vk.S_CARBON_USD_PER_KG] = carbon_usd_per_tonne / 1000.0
    spar[vk.S_REWARD_PER_USD] = weight / (peak_w * tick_seconds / 3.6e6 * USD_PER_KWH_REF)
    return spar
