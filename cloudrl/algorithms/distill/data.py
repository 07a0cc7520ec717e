"""(observation, expert action) pairs from scenario episodes on TRAIN seeds.

:func:`collect` plays one episode per seed and, at every decision, records the env
observation (:func:`envs.scenario.env.observe`) and the expert's decision rounded to the
nearest env action (:func:`.actions.nearest_action`). Who acts is ``actor``: ``None``
plays the rounded expert itself (behaviour-cloning data), a learned controller plays its
own actions while the expert only labels the states it visits (DAgger). The expert is
stateless between decisions (the MPC re-plans from the present each time), so asking it
about a state it did not reach is sound. :class:`Demos` is the data set, saved as ``.npz``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cloudrl.algorithms.distill.actions import action_controls, nearest_action
from envs.scenario.control import Controller, plan_view
from envs.scenario.env import READY_MARGINS, RELEASE_LEVELS, observe
from envs.scenario.sim import ScenarioSim


@dataclass
class Demos:
    obs: np.ndarray  # (N, obs_dim) float32
    actions: np.ndarray  # (N, 2) int64
    seeds: np.ndarray  # (N,) the episode seed of each row
    episode_costs: dict[int, float]  # cost of each played episode (of the actor)

    def __len__(self) -> int:
        return len(self.actions)

    def __add__(self, other: Demos) -> Demos:
        return Demos(np.concatenate([self.obs, other.obs]),
                     np.concatenate([self.actions, other.actions]),
                     np.concatenate([self.seeds, other.seeds]),
                     {**self.episode_costs, **other.episode_costs})

    def save(self, path: str | Path, meta: str) -> None:
        seeds = np.array(sorted(self.episode_costs), dtype=np.int64)
        np.savez_compressed(path, obs=self.obs, actions=self.actions, seeds=self.seeds,
                            cost_seeds=seeds,
                            costs=np.array([self.episode_costs[s] for s in seeds]),
                            meta=np.array(meta))

    @classmethod
    def load(cls, path: str | Path, meta: str) -> Demos | None:
        """The demos at ``path`` if they were recorded with the same ``meta``, else None."""
        p = Path(path)
        if not p.is_file():
            return None
        z = np.load(p)
        if str(z["meta"]) != meta:
            return None
        return cls(z["obs"], z["actions"], z["seeds"],
                   {int(s): float(c) for s, c in zip(z["cost_seeds"], z["costs"], strict=True)})


def collect(sim: ScenarioSim, expert: Controller, seeds: list[int],
            actor: Controller | None = None,
            release_levels: tuple[float, ...] = RELEASE_LEVELS,
            ready_margins: tuple[float, ...] = READY_MARGINS) -> Demos:
    """Observations and expert actions (rounded to ``release_levels`` x ``ready_margins``)
    along ``actor``'s (default: the rounded expert's) episodes on ``seeds``."""
    obs, acts, rows, costs = [], [], [], {}
    d = sim.cfg.decision_ticks
    for seed in seeds:
        sim.reset(seed)
        expert.reset(sim)
        if actor is not None:
            actor.reset(sim)
        while not sim.done:
            if sim.t % d == 0:
                v = plan_view(sim)
                obs.append(observe(sim, v))
                a = nearest_action(v, *expert.decide(sim), release_levels, ready_margins)
                acts.append(a)
                rows.append(seed)
                sim.set_controls(*(action_controls(v, a, release_levels, ready_margins)
                                   if actor is None
                                   else actor.decide(sim)))
            sim.tick()
        costs[int(seed)] = float(sim.stats.summary()["cost_usd"])
    return Demos(np.asarray(obs, np.float32).reshape(len(obs), -1),
                 np.asarray(acts, np.int64).reshape(len(acts), 2),
                 np.asarray(rows, np.int64), costs)
