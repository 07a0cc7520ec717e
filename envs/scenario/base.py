"""The scenario as a gymnasium env: one step is one decision period of the two controls.

``ScenarioEnv(config)`` with ``config = {"scenario": NAME, "overrides": {...},
"reward_scale": 1.0}`` (or a :class:`ScenarioConfig` under ``"config"``). Each step sets
the release level and the ready level for the next ``decision_ticks`` ticks, then runs
them (the power-aware executor places jobs and moves power states every tick).

* Action: ``MultiDiscrete([len(RELEASE_LEVELS), len(READY_MARGINS)])`` (one branch per
  control, the space a branching Q-network factorizes); ``ScenarioFlatEnv`` is the same
  env with the product ``Discrete`` space. Release level ``i`` releases held batch work
  while committed cores stay within ``RELEASE_LEVELS[i]`` of the fleet (0: only work
  whose slack is running out); ready level ``j`` keeps ready the forecast latency-
  critical peak times ``1 + READY_MARGINS[j]``, plus committed batch work and the spare.
* Observation: a float32 vector (:data:`OBS_NAMES`): time of day and week, price, carbon
  and solar now and their forecasts (means over 1/4/12/24 h, relative to now, and where
  now ranks in the next 24 h), the forecast load, the fleet by power state, the held
  batch work and how much of it is due within 1/4/12 h.
* Reward: minus the period's cost in dollars (energy + carbon + SLA penalties), times
  ``reward_scale``; ``info`` holds every term. ``sla_weight`` (default 1) multiplies the
  SLA penalties in the reward only, a training-time shaping that makes violations dearer
  to the learner; ``info`` and the episode summary keep the scenario's own cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.scenario.catalog import load_scenario
from envs.scenario.config import ScenarioConfig
from envs.scenario.control import PlanView, plan_view, release_and_ready
from envs.scenario.sim import ACTIVE, BOOTING, OFF, RESUMING, SUSPENDED, ScenarioSim

RELEASE_LEVELS = (0.0, 0.3, 0.45, 0.6, 0.75, 0.9)
READY_MARGINS = (0.0, 0.25, 0.5, 1.0)
_WINDOWS_H = (1.0, 4.0, 12.0, 24.0)
OBS_NAMES = (
    ("sin_day", "cos_day", "sin_week", "cos_week", "price_now", "carbon_now", "solar_now")
    + tuple(f"price_fc_{int(h)}h" for h in _WINDOWS_H)
    + tuple(f"carbon_fc_{int(h)}h" for h in _WINDOWS_H)
    + ("price_rank_24h", "carbon_rank_24h", "solar_fc_1h", "solar_fc_4h",
       "lc_fc_peak_1h", "lc_fc_mean_4h", "batch_fc_mean_4h",
       "frac_active", "frac_suspended", "frac_off", "frac_waking", "committed",
       "lc_queued", "batch_queued", "pool_work", "pool_due_1h", "pool_due_4h", "pool_due_12h",
       "ticks_left")
)


def observe(sim: ScenarioSim, v: PlanView) -> np.ndarray:
    """The observation vector of :data:`OBS_NAMES` (scaled to order 1)."""
    sig = sim.signals
    tph = sim.cfg.ticks_per_hour
    p_ref = max(abs(v.price_now), 1.0)
    c_ref = max(v.carbon_now, 1.0)
    kw_ref = max(sim.fleet_cores * float((sim.p_idle + sim.p_span).sum() / sim.cores.sum())
                 / 1000.0, 1e-9)
    f = [*sig.time_features(sim.t).tolist(), v.price_now / 100.0, v.carbon_now / 500.0,
         v.solar_now_kw / kw_ref]
    for arr, ref in ((v.price_fc, p_ref), (v.carbon_fc, c_ref)):
        f += [float(arr[:max(1, int(h * tph))].mean()) / ref - 1.0 for h in _WINDOWS_H]
    day = max(1, int(24 * tph))
    f += [float((v.price_fc[:day] < v.price_now).mean()),
          float((v.carbon_fc[:day] < v.carbon_now).mean()),
          float(v.solar_fc_kw[:int(tph)].mean()) / kw_ref,
          float(v.solar_fc_kw[:int(4 * tph)].mean()) / kw_ref]
    fc = v.fleet_cores
    f += [float(v.load_fc[0, :int(tph)].max(initial=0.0)) / fc,
          float(v.load_fc[0, :int(4 * tph)].mean()) / fc,
          float(v.load_fc[1, :int(4 * tph)].mean()) / fc]
    s, cores = sim.state, sim.cores
    f += [float(cores[s == ACTIVE].sum()) / fc, float(cores[s == SUSPENDED].sum()) / fc,
          float(cores[s == OFF].sum()) / fc,
          float(cores[(s == RESUMING) | (s == BOOTING)].sum()) / fc,
          sim.committed_cores() / fc, v.queued[0] / fc, v.queued[1] / fc]
    work = v.pool_cores * v.pool_duration
    hour_work = fc * tph
    slack = v.pool_latest - v.t
    f += [float(work.sum()) / hour_work] + [
        float(work[slack <= h * tph].sum()) / hour_work for h in (1.0, 4.0, 12.0)]
    f.append(v.ticks_left / sim.n_ticks)
    return np.clip(np.asarray(f, dtype=np.float32), -10.0, 10.0)


class ScenarioEnv(gym.Env):
    """Branching (MultiDiscrete) interface; see the module docstring."""

    metadata = {"render_modes": []}

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        cfg = dict(config or {})
        scn = cfg.pop("config", None)
        if scn is None:
            scn = load_scenario(cfg.pop("scenario", "carbon_shift"), cfg.pop("overrides", None))
        elif not isinstance(scn, ScenarioConfig):
            scn = ScenarioConfig.model_validate(scn)
        self.reward_scale = float(cfg.pop("reward_scale", 1.0))
        self._seed_offset = int(cfg.pop("seed_offset", 0))
        self.sla_weight = float(cfg.pop("sla_weight", 1.0))
        if not 0.0 <= self.sla_weight <= 100.0:
            raise ValueError(f"ScenarioEnv: sla_weight {self.sla_weight} outside [0, 100]")
        if cfg:
            raise ValueError(f"ScenarioEnv: unknown config key(s) {sorted(cfg)}")
        self.scenario = scn
        self.sim = ScenarioSim(scn)
        self.observation_space = spaces.Box(-10.0, 10.0, (len(OBS_NAMES),), np.float32)
        self.action_space = spaces.MultiDiscrete([len(RELEASE_LEVELS), len(READY_MARGINS)])
        self._rng = np.random.default_rng()
        self._view: PlanView | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        episode_seed = int(seed) if seed is not None else int(self._rng.integers(0, 50))
        self.sim.reset(episode_seed + self._seed_offset)
        self._view = plan_view(self.sim)
        return observe(self.sim, self._view), {"seed": episode_seed}

    def decode(self, action) -> tuple[int, int]:
        a = np.asarray(action, dtype=np.int64).reshape(-1)
        if a.shape != (2,) or not (0 <= a[0] < len(RELEASE_LEVELS)) or \
                not (0 <= a[1] < len(READY_MARGINS)):
            raise ValueError(f"action {action!r} outside {self.action_space}")
        return int(a[0]), int(a[1])

    def controls(self, action) -> tuple[float, float]:
        """The simulator's two controls (release target, ready cores) for ``action``."""
        i, j = self.decode(action)
        return release_and_ready(self._view, RELEASE_LEVELS[i], READY_MARGINS[j])

    def step(self, action):
        assert self._view is not None, "reset() first"
        self.sim.set_controls(*self.controls(action))
        totals = dict.fromkeys(("cost_usd", "energy_usd", "carbon_usd", "sla_usd",
                                "energy_kwh", "grid_kwh", "carbon_kg"), 0.0)
        viol = [0, 0]
        for _ in range(self.scenario.decision_ticks):
            if self.sim.done:
                break
            tc = self.sim.tick()
            for k in totals:
                totals[k] += getattr(tc, k)
            viol[0] += tc.violations[0]
            viol[1] += tc.violations[1]
        done = self.sim.done
        if not done:
            self._view = plan_view(self.sim)
        obs = observe(self.sim, self._view)
        info = {**totals, "violations_lc": viol[0], "violations_batch": viol[1]}
        if done:
            info["episode"] = self.sim.stats.summary()
        shaped = totals["cost_usd"] + (self.sla_weight - 1.0) * totals["sla_usd"]
        return obs, -shaped * self.reward_scale, done, False, info


class ScenarioFlatEnv(ScenarioEnv):
    """:class:`ScenarioEnv` with one ``Discrete`` action: ``release * len(READY) + ready``."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.action_space = spaces.Discrete(len(RELEASE_LEVELS) * len(READY_MARGINS))

    def decode(self, action) -> tuple[int, int]:
        a = int(np.asarray(action).reshape(-1)[0])
        if not 0 <= a < self.action_space.n:
            raise ValueError(f"action {action!r} outside {self.action_space}")
        return divmod(a, len(READY_MARGINS))


# the keys of the cluster envs' Dict observation that the masked RLModules read
# (models.encoders.ClusterEncoder: macro, servers, jobs; the masked heads: action_mask)
