"""Natively batched cluster envs: B simulators in stacked arrays, one numba call per step.

``ClusterSchedulingVectorEnv(num_envs, config)`` and ``ClusterBranchingVectorEnv``
are ``gymnasium.vector.VectorEnv`` s of the flat and the branching interface
(``envs.cluster_env``). A step advances every sub-env in one call of
``envs.vector_kernels.step_batch`` (action decoding, placement, power, finishes,
wake-ups, drops, arrivals, reward terms, observation rows and masks).

Resets stay in Python: each sub-env has a single env that draws its episode seed
(the same rule as ``ClusterSchedulingEnv.reset``), generates the episode's jobs
and builds the first observation; its simulator state is then copied into the
stacked arrays. Resets happen once per episode, so their cost is amortized.

Semantics are ``SyncVectorEnv`` of the single env, bit for bit: ``reset(seed=s)``
seeds sub-env i with ``s + i`` (or the i-th of a list), the autoreset mode is
gymnasium's default ``NEXT_STEP`` (the step after an episode ends resets that
sub-env, ignores its action and returns reward 0 and the reset info), and infos
are gymnasium's dict of arrays with ``_key`` masks. ``options={"reset_mask": m}``
resets only the sub-envs in ``m``.

With signals (``EnvConfig.signals``) each sub-env's episode tables (per-tick price,
carbon and solar energy; the macro signal columns of every tick) are built at its reset
by its single env and copied into stacked ``(B, ticks, ...)`` arrays; the kernel indexes
them by tick (no per-step Python work per sub-env).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from envs import vector_kernels as vk
from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv, _ClusterEnvBase
from envs.env_config import EnvConfig

# info keys in the single env's order, with the Python type of their values
_STEP_INFO_KEYS = ("energy_kwh", "energy_norm", "violations", "late", "dropped", "finished",
                   "toggles", "invalid_action", "r_energy", "r_sla", "r_toggle", "r_invalid")
_SIGNAL_INFO_KEYS = ("energy_usd", "carbon_kg", "r_signal")
_F_COL = {k: i for i, k in enumerate(vk.INFO_F)}
_I_COL = {k: i for i, k in enumerate(vk.INFO_I)}


class _ClusterVectorEnv(gym.vector.VectorEnv):
    """B cluster envs of one interface over stacked simulator state."""

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}
    single_env_class: type[_ClusterEnvBase]

    def __init__(self, num_envs: int = 1, config: EnvConfig | Mapping[str, Any] | None = None,
                 **kwargs: Any) -> None:
        if kwargs.pop("max_episode_steps", None) is not None:
            raise ValueError("max_episode_steps: the cluster envs end at sim.episode_length")
        if kwargs:
            raise ValueError(f"unknown argument(s) {sorted(kwargs)}; expected num_envs, config")
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.config = EnvConfig.coerce(config)
        self.num_envs = int(num_envs)
        self._singles = [self.single_env_class(self.config) for _ in range(self.num_envs)]
        first = self._singles[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._branching = isinstance(first, ClusterBranchingEnv)
        self._n_signal = first.n_signal
        self._info_keys = _STEP_INFO_KEYS + (_SIGNAL_INFO_KEYS if self._n_signal else ()) \
            + (("placement_conflicts",) if self._branching else ())
        self._static_arrays(first)
        self._obs_shapes = [(key, (self.num_envs, *space.shape))
                            for key, space in self.single_observation_space.items()]
        self._alloc(job_capacity=1)
        self._autoreset = np.zeros(self.num_envs, dtype=bool)
        self._obs: dict[str, np.ndarray] | None = None

    # ------------------------------------------------------------------ setup
    def _static_arrays(self, env: _ClusterEnvBase) -> None:
        sim, ob, cfg = env.sim, env.obs_builder, env.config.sim
        fleet = sim.fleet
        self.n_servers, self.n_tiers = fleet.n_servers, fleet.n_tiers
        self.queue_window = cfg.queue_window
        self._mask_size = int(env.observation_space["action_mask"].shape[0])
        self._cpu_cap = np.ascontiguousarray(fleet.cpu_cap, dtype=np.float64)
        self._mem_cap = np.ascontiguousarray(fleet.mem_cap, dtype=np.float64)
        self._p_idle = np.ascontiguousarray(fleet.p_idle, dtype=np.float64)
        self._p_span = np.ascontiguousarray(fleet.p_max - fleet.p_idle, dtype=np.float64)
        self._expo = np.ascontiguousarray(fleet.exponent, dtype=np.float64)
        self._standby = np.ascontiguousarray(sim._standby_w, dtype=np.float64)
        self._tier = np.ascontiguousarray(fleet.tier, dtype=np.int64)
        self._static = np.ascontiguousarray(ob._static)
        self._flag_scale = np.ascontiguousarray(ob._flag_scale, dtype=np.float64)
        self._tier_norm = np.ascontiguousarray(ob._tier_norm, dtype=np.float64)
        # the single env's observation builder holds the same tables and kernel parameters
        self._sin, self._cos = ob._sin, ob._cos
        self._fpar, self._ipar = ob.fpar.copy(), ob.ipar.copy()
        if self._branching:
            self._sizes = np.asarray(env.branch_sizes, dtype=np.int64)
        self._spar = env.signal_params.copy() if env.n_signal else np.zeros(vk.N_SPAR)

    def _alloc(self, job_capacity: int) -> None:
        b, n, cap = self.num_envs, self.n_servers, self.config.sim.queue_capacity
        self._dyn = np.zeros((b, n, 9))
        self._pstate = np.zeros((b, n), dtype=np.int8)
        self._ist = np.zeros((b, vk.N_ISTATE), dtype=np.int64)
        self._fema = np.zeros((b, 2))
        self._queue = np.zeros((b, cap), dtype=np.int64)
        self._mask = np.zeros((b, self._mask_size), dtype=bool)
        # per-tick signal tables of each sub-env's episode (empty without signals)
        ticks = self.config.sim.episode_length if self._n_signal else 0
        self._sig_cost = np.zeros((b, ticks, 3))
        self._sig_feat = np.zeros((b, ticks + 1 if ticks else 0, self._n_signal),
                                  dtype=np.float32)
        self._job_capacity = 0
        self._grow_jobs(job_capacity)

    def _grow_jobs(self, capacity: int) -> None:
        """Job and running-job columns with room for ``capacity`` jobs per env."""
        old = self._job_capacity
        b = self.num_envs
        names_f = ("_job_cpu", "_job_mem")
        names_i = ("_job_arrival", "_job_deadline", "_job_dur", "_job_latest", "_run_job",
                   "_run_end", "_run_srv")
        for name in names_f + names_i:
            new = np.zeros((b, capacity), dtype=np.float64 if name in names_f else np.int64)
            if old:
                new[:, :old] = getattr(self, name)
            setattr(self, name, new)
        self._job_capacity = capacity

    def _load(self, i: int) -> None:
        """Copy sub-env ``i``'s freshly reset simulator into row ``i`` of the stacked state."""
        env = self._singles[i]
        sim = env.sim
        n_jobs = len(sim.job_arrival)
        if n_jobs > self._job_capacity:
            self._grow_jobs(max(n_jobs, int(self._job_capacity * 1.25) + 1))
        self._dyn[i] = sim.dyn
        self._pstate[i] = sim.power_state
        self._job_cpu[i, :n_jobs] = sim.job_cpu
        self._job_mem[i, :n_jobs] = sim.job_mem
        self._job_arrival[i, :n_jobs] = sim.job_arrival
        self._job_deadline[i, :n_jobs] = sim.job_deadline
        self._job_dur[i, :n_jobs] = sim.job_duration
        self._job_latest[i, :n_jobs] = sim.job_latest_start
        r = 0
        for end in sorted(sim._finish_at):
            for j in sim._finish_at[end]:
                self._run_job[i, r] = j
                self._run_end[i, r] = end
                self._run_srv[i, r] = sim._server[j]
                r += 1
        queue = sim.queue
        self._queue[i, :len(queue)] = queue
        st = self._ist[i]
        st[vk.I_T] = sim.t
        st[vk.I_N_WAKING] = sim._n_waking
        st[vk.I_PRIORITY] = sim.priority_level
        st[vk.I_QLEN] = len(queue)
        st[vk.I_NEXT_ARRIVAL] = sim._next_arrival
        st[vk.I_N_JOBS] = n_jobs
        st[vk.I_N_WARM] = sim.n_warm
        st[vk.I_RLEN] = r
        st[vk.I_CLOCK_OFFSET] = sim.clock_offset
        self._fema[i] = (sim.arrival_ema, sim.violation_ema)
        self._mask[i] = env.action_mask
        if self._n_signal:
            sig = env.signals
            cost = self._sig_cost[i]
            cost[:, vk.C_PRICE] = sig.price
            cost[:, vk.C_CARBON] = sig.carbon
            cost[:, vk.C_SOLAR_J] = sig.solar_j
            self._sig_feat[i] = sig.features

    def _new_obs(self) -> dict[str, np.ndarray]:
        return {key: np.empty(shape, dtype=np.float32) for key, shape in self._obs_shapes}

    # ------------------------------------------------------------------ API
    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None):
        """Reset the sub-envs (all, or those in ``options["reset_mask"]``)."""
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"seed: {len(seeds)} seeds for num_envs={self.num_envs}")
        options = dict(options) if options else None
        reset_mask = options.pop("reset_mask", None) if options else None
        if reset_mask is None:
            which = np.ones(self.num_envs, dtype=bool)
            self._obs = self._new_obs()
        else:
            which = np.asarray(reset_mask)
            if which.shape != (self.num_envs,) or which.dtype != np.bool_ or not which.any():
                raise ValueError(f"options['reset_mask'] must be a bool array of shape "
                                 f"({self.num_envs},) with a True, got {reset_mask!r}")
            if self._obs is None:
                raise ValueError("options['reset_mask']: reset all sub-envs first")
            self._obs = {k: v.copy() for k, v in self._obs.items()}
        self._autoreset[which] = False
        infos: dict[str, Any] = {}
        for i in np.flatnonzero(which).tolist():
            obs, info = self._singles[i].reset(seed=seeds[i], options=options)
            self._load(i)
            for key, value in obs.items():
                self._obs[key][i] = value
            infos = self._add_info(infos, info, i)
        return {k: v.copy() for k, v in self._obs.items()}, infos

    def step(self, actions):
        """Step every sub-env (autoresetting those whose episode ended on the last step)."""
        if self._obs is None:
            raise ValueError("step() before reset(): call reset() first")
        acts = self._check_actions(actions)
        active = ~self._autoreset
        obs = self._new_obs()
        b = self.num_envs
        rewards = np.zeros(b)
        done = np.zeros(b, dtype=bool)
        info_f = np.zeros((b, len(vk.INFO_F)))
        info_i = np.zeros((b, len(vk.INFO_I)), dtype=np.int64)
        vk.step_batch(active, acts, self._dyn, self._pstate, self._ist, self._fema, self._queue,
                      self._job_cpu, self._job_mem, self._job_arrival, self._job_deadline,
                      self._job_dur, self._job_latest, self._run_job, self._run_end,
                      self._run_srv, self._cpu_cap, self._mem_cap, self._p_idle, self._p_span,
                      self._expo, self._standby, self._tier, self._static, self._flag_scale,
                      self._tier_norm, self._sin, self._cos, self._fpar, self._ipar, self._mask,
                      obs["macro"], obs["servers"], obs["jobs"], obs["action_mask"], rewards,
                      done, info_f, info_i, self._n_signal > 0, self._sig_cost, self._sig_feat,
                      self._spar)
        infos = self._step_infos(active, info_f, info_i)
        for i in np.flatnonzero(self._autoreset).tolist() if not active.all() else ():
            reset_obs, info = self._singles[i].reset()
            self._load(i)
            for key, value in reset_obs.items():
                obs[key][i] = value
            infos = self._add_info(infos, info, i)
        self._autoreset = done
        self._obs = obs
        return obs, rewards, np.zeros(b, dtype=bool), done.copy(), infos

    # ------------------------------------------------------------------ helpers
    def _check_actions(self, actions) -> np.ndarray:
        arr = np.asarray(actions)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"actions must be integers, got dtype {arr.dtype}")
        if self._branching:
            sizes = self._sizes
            if arr.shape != (self.num_envs, len(sizes)):
                raise ValueError(f"actions must have shape ({self.num_envs}, {len(sizes)}) "
                                 f"(MultiDiscrete per env), got {arr.shape}")
            bad = (arr < 0) | (arr >= sizes[None, :])
            if bad.any():
                env, branch = (int(x) for x in np.argwhere(bad)[0])
                raise ValueError(f"action of env {env}: branch {branch} = {int(arr[env, branch])}"
                                 f" outside [0, {int(sizes[branch])})")
            return np.ascontiguousarray(arr, dtype=np.int64)
        if arr.shape != (self.num_envs,):
            raise ValueError(f"actions must have shape ({self.num_envs},) (Discrete per env), "
                             f"got {arr.shape}")
        bad = (arr < 0) | (arr >= self._mask_size)
        if bad.any():
            env = int(np.flatnonzero(bad)[0])
            raise ValueError(f"action of env {env}: {int(arr[env])} outside "
                             f"Discrete({self._mask_size})")
        return np.ascontiguousarray(arr, dtype=np.int64).reshape(self.num_envs, 1)

    def _step_infos(self, active: np.ndarray, info_f: np.ndarray,
                    info_i: np.ndarray) -> dict[str, Any]:
        """gymnasium's dict of arrays (``_add_info`` of each stepped sub-env's info).

        Rows of sub-envs that were reset are zero (the kernel leaves them); every
        ``_key`` mask is the same array of stepped sub-envs."""
        if not active.any():
            return {}
        infos: dict[str, Any] = {}
        mask = active.copy()
        for key in self._info_keys:
            if key in _F_COL:
                infos[key] = info_f[:, _F_COL[key]]
            elif key == "invalid_action":
                infos[key] = info_i[:, _I_COL[key]] != 0
            else:
                infos[key] = info_i[:, _I_COL[key]]
            infos[f"_{key}"] = mask
        return infos

    def action_masks(self) -> np.ndarray:
        """(B, A) bool: the masks of the latest observations."""
        return self._mask.copy()

    def close_extras(self, **kwargs: Any) -> None:
        for env in getattr(self, "_singles", ()):
            env.close()


class ClusterSchedulingVectorEnv(_ClusterVectorEnv):
    """Flat interface (``Discrete(K*N + N + 1)`` per sub-env), batched."""

    single_env_class = ClusterSchedulingEnv


class ClusterBranchingVectorEnv(_ClusterVectorEnv):
    """Branching interface (``MultiDiscrete`` per sub-env), batched."""

    single_env_class = ClusterBranchingEnv


VECTOR_OF: dict[type, type[_ClusterVectorEnv]] = {
    ClusterSchedulingEnv: ClusterSchedulingVectorEnv,
    ClusterBranchingEnv: ClusterBranchingVectorEnv,
}


def warm_up() -> None:
    """Compile (or load from numba's on-disk cache) the batched kernel and the signal
    forecast summary and feature columns (``envs.observation.episode_signals``)."""
    vk.forecast_window_stats(np.ones((1, 3)), np.zeros((1, 3)), 0.1, 2, 1, np.empty((1, 2)),
                             np.empty((1, 2)))
    series_row = np.zeros(2)  # a series' arrays are read-only
    series_row.setflags(write=False)
    vk.signal_features(series_row, series_row, series_row, np.zeros((2, 2)), np.zeros((2, 2)),
                       1.0, 1.0, 1.0, np.empty((2, 6), dtype=np.float32))
    # the single env's observation with signals (its feature rows are read-only)
    dyn = np.zeros((1, 9))
    dyn[0, 2] = 1.0
    ones, ids = np.ones(1), np.zeros(1, dtype=np.int64)
    fpar, ipar = np.ones(9), np.ones(8, dtype=np.int64)
    row = np.zeros(6, dtype=np.float32)
    row.setflags(write=False)
    for branching in (0, 1):
        ipar[vk.Q_BRANCHING] = branching
        vk.observe_env_signals(dyn, ids, ones, ones, ids, ids, ids, 0, 0, 0.0, 0.0, ones, ones,
                               ids, np.zeros((1, 13), dtype=np.float32), np.ones(5),
                               np.ones((4, 1)), ones, ones, fpar, ipar, row)
    for cls in (ClusterSchedulingVectorEnv, ClusterBranchingVectorEnv):
        env = cls(1, {"n_servers": 2, "sim": {"episode_length": 2}})
        env.reset(seed=0)
        env.step(np.zeros(env.action_space.shape, dtype=np.int64))
