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

    Dynamic columns, the fit matrix and per-tier sums come from one compiled
    kernel call (envs.kernels.observe) over the simulator's ``dyn`` matrix.
    """

    def __init__(self, sim: ClusterSim) -> None:
        fleet = sim.fleet
        self.sim = sim
        n, t = fleet.n_servers, fleet.n_tiers
        self._static = np.zeros((n, server_features(t)), dtype=np.float32)
        self._static[:, S["cpu_cap"]] = fleet.cpu_cap
        self._static[:, S["mem_cap"]] = fleet.mem_cap
        watts_per_cpu = fleet.p_max / fleet.cpu_cap
        self._static[:, S["watts_per_cpu"]] = watts_per_cpu / watts_per_cpu.max()
        self._static[:, S["p_idle"]] = fleet.p_idle / fleet.p_max.max()
        self._static[:, len(SERVER_COLS):] = fleet.tier_onehot
        self._caps = np.stack([fleet.cpu_cap, fleet.mem_cap], axis=1)
        self._tier = fleet.tier.astype(np.int64)
        self._n_tiers = t
        self._n_servers = n
        # dyn[:, is_active..n_running] scaled into the server columns of the same order
        self._flag_scale = np.array([1.0, 1.0, 1.0, 1.0 / max(1, sim.cfg.wake_delay),
                                     1.0 / RUNNING_SCALE])
        tier_count = fleet.tier_onehot.sum(axis=0)
        den = np.stack([fleet.tier_onehot.T @ fleet.cpu_cap, tier_count, tier_count, tier_count])
        # a tier with no server (tiny fleets) reports zeros, not NaN
        self._tier_norm = np.divide(1.0, den, out=np.zeros_like(den), where=den > 0)
        self._inv_peak_w = 1.0 / float(fleet.p_max.sum())
        self._two_pi_over_day = 2.0 * np.pi / sim.cfg.diurnal_period

    def compute(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(fits (m, N), servers rows, job rows, tier sums (5, T)) of the current tick."""
        sim = self.sim
        queue = np.array(sim.queue, dtype=np.int64)
        fits, servers, jobs, tier_sums, queue_stats = kernels.observe(
            sim.dyn, self._caps, self._static, sim.cfg.queue_window, self._flag_scale,
            self._tier, self._n_tiers, queue, sim.job_feats, float(sim.t), TIME_SCALE)
        self._queue_stats = queue_stats
        return fits, servers, jobs, tier_sums

    def assemble(self, servers: np.ndarray, jobs: np.ndarray, tier_sums: np.ndarray,
                 mask: np.ndarray) -> dict[str, np.ndarray]:
        """The Dict observation from :meth:`compute`'s parts and the interface's mask."""
        return {
            "macro": self._macro(tier_sums),
            "servers": servers,
            "jobs": jobs,
            "action_mask": mask.astype(np.float32),
        }

    def _macro(self, tier_sums: np.ndarray) -> np.ndarray:
        """Platform aggregates; uses the queue statistics of the latest :meth:`compute`."""
        sim = self.sim
        per_tier = tier_sums[:4] * self._tier_norm
        queue = sim.queue
        t = sim.t
        if queue:
            arrival_sum, arrival_min, cpu_sum, _ = self._queue_stats.tolist()
            q_mean = (t - arrival_sum / len(queue)) / TIME_SCALE
            q_max = (t - arrival_min) / TIME_SCALE
            q_cpu = cpu_sum / sim.capacity.total_cpu
        else:
            q_mean = q_max = q_cpu = 0.0
        phase = ((t + sim.clock_offset) % sim.cfg.diurnal_period) * self._two_pi_over_day
        tail = [
            len(queue) / sim.cfg.queue_capacity, q_mean, q_max, q_cpu, sim.arrival_ema,
            float(self._queue_stats[3]) * self._inv_peak_w,
            float(tier_sums[2].sum()) / self._n_servers,
            sim.violation_ema, math.sin(phase), math.cos(phase), t / sim.cfg.episode_length,
        ]
        out = np.empty(per_tier.size + len(tail), dtype=np.float32)
        out[:per_tier.size] = per_tier.ravel()
        out[per_tier.size:] = tail
        return out
