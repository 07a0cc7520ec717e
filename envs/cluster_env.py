"""Gymnasium envs over one ClusterSim: the flat and the branching action interface.

Both share the simulator, the observation builder and the reward; they differ
only in how an action is decoded and which mask comes with the observation.

* Flat (``ClusterSchedulingEnv``): ``Discrete(K*N + N + 1)``; action
  ``k*N + n`` places queue slot k on server n, ``K*N + n`` toggles server n's
  power state, ``K*N + N`` waits.
* Branching (``ClusterBranchingEnv``): ``MultiDiscrete([N+1]*K + [3]*T + [L])``;
  per queue slot a server or N = defer, per tier 0 = sleep one idle server,
  1 = hold, 2 = wake one asleep server, and a queue priority level
  (0 = FIFO ... L-1 = least slack first). The mask is the concatenation of
  the per-branch masks. Placements are applied in slot order; one that no
  longer fits because an earlier slot took the room is deferred and counted
  in ``info["placement_conflicts"]``.

An in-space action the mask forbids changes nothing in the cluster (the tick
still passes), costs ``invalid_action_penalty`` and sets
``info["invalid_action"]``. An action outside the space raises ValueError.
Reward = -(alpha * normalized energy + beta * SLA violations + toggle_penalty
* toggles) - invalid penalty; each term is also in ``info``.

With signals (``EnvConfig.signals``, a ``SignalConfig``), each reset builds the episode's
price, carbon and solar series and forecasts (``make_signals`` with the episode seed,
``episode_length + horizon + 1`` ticks of ``sim.tick_seconds``), the observation's
``macro`` row ends with the signal columns of ``envs.observation.signal_cols``, and a step
at tick ``t`` drawing ``E`` joules costs, net of the tick's solar energy ``S``:
``grid = max(E - S, 0)`` kWh at ``price[t]`` ($/MWh) and ``carbon[t]`` (gCO2/kWh), less
surplus solar ``max(S - E, 0)`` sold at ``export_price_usd_per_mwh`` (when set)::

    energy_usd = grid_kwh * price / 1000 - export_kwh * export_price / 1000
    carbon_kg  = grid_kwh * carbon / 1000
    r_signal   = signal_cost_weight * (energy_usd + carbon_kg * carbon_usd_per_tonne / 1000)
                 / (fleet peak kWh of one tick * $0.1/kWh)

``info`` gains ``energy_usd``, ``carbon_kg`` and ``r_signal`` (negated, like the other
terms) and the reward is ``-(... + r_signal)``. Without signals (None) nothing changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs import kernels
from envs.env_config import EnvConfig
from envs.observation import (
    EpisodeSignals,
    ObservationBuilder,
    episode_signals,
    observation_space,
    signal_cols,
    signal_cost_params,
)
from envs.sim import ACTIVE, ASLEEP, ClusterSim, TickOutcome
from envs.snapshot import ClusterSnapshot
from envs.workloads import make_workload

SLEEP_ONE, HOLD, WAKE_ONE = 0, 1, 2


class _ClusterEnvBase(gym.Env):
    metadata = {"render_modes": []}
    _branching = False  # which action mask the observation carries

    def __init__(self, config: EnvConfig | Mapping[str, Any] | None = None) -> None:
        self.config = EnvConfig.coerce(config)
        sim_cfg = self.config.sim
        self.sim = ClusterSim(sim_cfg, make_workload(self.config.workload, sim_cfg.tick_seconds))
        self.n_servers = self.sim.fleet.n_servers
        self.queue_window = sim_cfg.queue_window
        self.obs_builder = ObservationBuilder(self.sim, branching=self._branching)
        self._mask = np.zeros(0, dtype=bool)
        self.episode_seed: int | None = None
        signals = self.config.signals
        self.signal_cols = signal_cols(signals)
        self.n_signal = len(self.signal_cols)
        self.signals: EpisodeSignals | None = None  # the current episode's, from reset()
        self._sig_rows: tuple[list[float], list[float], list[float]] | None = None
        if signals is not None:
            self.signal_params = signal_cost_params(
                signals, self.config.carbon_usd_per_tonne, self.config.signal_cost_weight,
                self.sim.fleet_peak_w, sim_cfg.tick_seconds)
            self._spar = self.signal_params.tolist()

    # subclasses define: action_space, _apply(action) -> (invalid, extra_info)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is None:
            pool = self.config.seed_pool
            if pool:
                seed = int(pool[int(self.np_random.integers(len(pool)))])
            else:
                seed = int(self.np_random.integers(2**31 - 1))
        self.episode_seed = int(seed)
        self.sim.reset(self.episode_seed)
        if self.n_signal:
            cfg = self.config.sim
            sig = episode_signals(self.config.signals, cfg.episode_length, cfg.tick_seconds,
                                  self.episode_seed, self.sim.fleet_peak_w)
            self.signals = sig
            self._sig_rows = None  # built at the first step (a batched env never steps here)
        return self._observe(), {"episode_seed": self.episode_seed}

    def step(self, action):
        invalid, extra = self._apply(action)
        t = self.sim.t
        outcome = self.sim.advance()
        obs = self._observe()
        reward, info = self._reward(outcome, invalid, t)
        info.update(extra)
        return obs, reward, False, self.sim.done, info

    def _observe(self) -> dict[str, np.ndarray]:
        if self.n_signal:
            if self.signals is None:
                raise RuntimeError("the env has signals: call reset() before observing")
            obs, self._mask = self.obs_builder.observe(self.signals.features)
        else:
            obs, self._mask = self.obs_builder.observe()
        return obs

    def observe_snapshot(self, snapshot: ClusterSnapshot) -> dict[str, np.ndarray]:
        """Load an observed cluster state and return its observation (mask included).

        The decision service's path: the same observation builder and mask code as
        :meth:`step`. The env is then in that state until the next :meth:`reset`.
        Snapshots carry no signals: an env with signals refuses them.
        """
        if self.n_signal:
            raise ValueError("observe_snapshot: a snapshot carries no price, carbon or solar "
                             "signals; use an env config without signals")
        self.sim.load_snapshot(snapshot)
        return self._observe()

    def mask(self) -> np.ndarray:
        """The action mask of the current state (the same one the observation carries)."""
        return self.obs_builder.observe()[1]

    def _reward(self, out: TickOutcome, invalid: bool,
                t: int = 0) -> tuple[float, dict[str, Any]]:
        """The reward of a step from tick ``t`` and its ``info`` terms."""
        cfg = self.config.sim
        violations = out.late + out.dropped
        r_energy = cfg.alpha * out.energy_norm
        r_sla = cfg.beta * violations
        r_toggle = cfg.toggle_penalty * out.toggles
        r_invalid = cfg.invalid_action_penalty if invalid else 0.0
        info = {
            "energy_kwh": out.energy_j / 3.6e6, "energy_norm": out.energy_norm,
            "violations": violations, "late": out.late, "dropped": out.dropped,
            "finished": out.finished, "toggles": out.toggles, "invalid_action": invalid,
            "r_energy": -r_energy, "r_sla": -r_sla, "r_toggle": -r_toggle,
            "r_invalid": -r_invalid,
        }
        if not self.n_signal:
            return -(r_energy + r_sla + r_toggle + r_invalid), info
        # the step's dollar cost at tick t's signals (envs.vector_kernels.step_batch does
        # the same operations)
        rows = self._sig_rows
        if rows is None:  # Python floats: cheaper per step than numpy scalars
            sig = self.signals
            rows = self._sig_rows = (sig.price.tolist(), sig.carbon.tolist(),
                                     sig.solar_j.tolist())
        export_price, carbon_usd_per_kg, reward_per_usd = self._spar
        energy, solar_j = out.energy_j, rows[2][t]
        grid_j = energy - solar_j if energy > solar_j else 0.0
        export_j = solar_j - energy if solar_j > energy else 0.0
        grid_kwh = grid_j / 3.6e6
        energy_usd = grid_kwh * rows[0][t] / 1000.0 - export_j / 3.6e6 * export_price / 1000.0
        carbon_kg = grid_kwh * rows[1][t] / 1000.0
        r_signal = reward_per_usd * (energy_usd + carbon_kg * carbon_usd_per_kg)
        info["energy_usd"] = energy_usd
        info["carbon_kg"] = carbon_kg
        info["r_signal"] = -r_signal
        return -(r_energy + r_sla + r_toggle + r_invalid + r_signal), info

    @property
    def action_mask(self) -> np.ndarray:
        """The mask that came with the latest observation."""
        return self._mask


class ClusterSchedulingEnv(_ClusterEnvBase):
    """Flat interface: ``Discrete(K*N + N + 1)`` with an ``action_mask``."""

    def __init__(self, config: EnvConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        k, n = self.queue_window, self.n_servers
        self.n_actions = k * n + n + 1
        self.wait_action = k * n + n
        self.action_space = spaces.Discrete(self.n_actions)
        self.observation_space = observation_space(self.sim, self.n_actions, self.n_signal)

    def _apply(self, action) -> tuple[bool, dict[str, Any]]:
        a = action if type(action) is int and 0 <= action < self.n_actions \
            else _as_int(action, self.n_actions)
        if not self._mask[a]:
            return True, {}
        kn = self.queue_window * self.n_servers
        if a < kn:
            self.sim.place(a // self.n_servers, a % self.n_servers)
        elif a < kn + self.n_servers:
            self.sim.toggle(a - kn)
        return False, {}


class ClusterBranchingEnv(_ClusterEnvBase):
    """Branching interface: ``MultiDiscrete`` with concatenated per-branch masks."""

    _branching = True

    def __init__(self, config: EnvConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        k, n = self.queue_window, self.n_servers
        self.n_tiers = self.sim.fleet.n_tiers
        self.levels = self.config.sim.priority_levels
        self.branch_sizes = [n + 1] * k + [3] * self.n_tiers + [self.levels]
        self.action_space = spaces.MultiDiscrete(self.branch_sizes)
        self.observation_space = observation_space(self.sim, int(sum(self.branch_sizes)),
                                                 self.n_signal)
        self._offsets = np.concatenate([[0], np.cumsum(self.branch_sizes)[:-1]]).astype(np.int64)
        self._mask_size = int(sum(self.branch_sizes))
        self._sizes_arr = np.asarray(self.branch_sizes, dtype=np.int64)

    def branch_masks(self) -> list[np.ndarray]:
        """The mask of each branch, in branch order (views into :meth:`action_mask`)."""
        return [self._mask[o:o + s] for o, s in zip(self._offsets, self.branch_sizes, strict=True)]

    def _apply(self, action) -> tuple[bool, dict[str, Any]]:
        a = _as_int_vector(action, self._sizes_arr)
        status = kernels.check_branching(a, self._sizes_arr, self._offsets, self._mask)
        if status >= 0:
            raise ValueError(f"action branch {status} = {int(a[status])} outside "
                             f"[0, {self.branch_sizes[status]})")
        if status == -2:
            return True, {"placement_conflicts": 0}
        sim, k, n = self.sim, self.queue_window, self.n_servers
        jobs = sim.window()
        acts = a.tolist()
        conflicts = 0
        for slot in range(len(jobs)):
            server = acts[slot]
            if server < n and not sim.place(sim.queue.index(jobs[slot]), server):
                conflicts += 1
        for tier in range(self.n_tiers):
            conflicts += not self._power(tier, acts[k + tier])
        sim.set_priority(acts[-1])
        return False, {"placement_conflicts": conflicts}

    def _power(self, tier: int, decision: int) -> bool:
        if decision == HOLD:
            return True
        sim = self.sim
        in_tier = sim.fleet.tier == tier
        if decision == SLEEP_ONE:
            idle = np.flatnonzero(in_tier & (sim.power_state == ACTIVE) & (sim.n_running == 0))
            return bool(len(idle)) and sim.toggle(int(idle[-1]))
        asleep = np.flatnonzero(in_tier & (sim.power_state == ASLEEP))
        return bool(len(asleep)) and sim.toggle(int(asleep[0]))


def _as_int(action, n: int) -> int:
    try:
        arr = np.asarray(action)
        if arr.size != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError
        a = int(arr.reshape(()))
    except (TypeError, ValueError):
        raise ValueError(f"action {action!r} is not an integer in Discrete({n})") from None
    if not 0 <= a < n:
        raise ValueError(f"action {a} outside Discrete({n})")
    return a


def _as_int_vector(action, sizes: np.ndarray) -> np.ndarray:
    """The action as an int64 vector of the right length (range is checked by the caller)."""
    arr = np.asarray(action)
    if arr.shape != (len(sizes),) or arr.dtype.kind not in "iu":
        raise ValueError(
            f"action must be {len(sizes)} integers (MultiDiscrete), got shape {arr.shape} "
            f"dtype {arr.dtype}"
        )
    return arr if arr.dtype == np.int64 else arr.astype(np.int64)
