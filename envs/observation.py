"""Observation features: one code path from simulator state to the Dict observation.

``macro`` holds platform aggregates (per-tier load and power-state fractions,
queue pressure, arrival and violation estimates, power draw, time features),
``servers`` one row per server, ``jobs`` one row per visible queue slot. The
column layout is named here (``SERVER_COLS``, ``JOB_COLS``) so heuristics and
the decision service read features by name, never by magic index.
Demands and capacities are in largest-machine units, times in ``TIME_SCALE`` ticks.
"""

from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces

from envs import kernels
from envs import vector_kernels as vk
from envs.sim import ClusterSim

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


def macro_size(n_tiers: int) -> int:
    return 4 * n_tiers + len(MACRO_TAIL)


def server_features(n_tiers: int) -> int:
    return len(SERVER_COLS) + n_tiers


def observation_space(sim: ClusterSim, mask_size: int) -> spaces.Dict:
    """The Dict space of both envs; only the mask length differs between interfaces."""
    n, t, k = sim.fleet.n_servers, sim.fleet.n_tiers, sim.cfg.queue_window
    f32 = np.float32
    return spaces.Dict({
        "macro": spaces.Box(-np.inf, np.inf, (macro_size(t),), f32),
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

    def observe(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """(the Dict observation of the current tick, its bool action mask); fresh arrays."""
        sim = self.sim
        macro, servers, jobs, mask, mask_f = kernels.observe_env(
            sim.dyn, np.array(sim.queue, dtype=np.int64), sim.job_cpu, sim.job_mem,
            sim.job_arrival, sim.job_duration, sim.job_latest_start, sim.t, sim.clock_offset,
            sim.arrival_ema, sim.violation_ema, self._cpu_cap, self._mem_cap, self._tier,
            self._static, self._flag_scale, self._tier_norm, self._sin, self._cos, self.fpar,
            self.ipar)
        return {"macro": macro, "servers": servers, "jobs": jobs, "action_mask": mask_f}, mask
