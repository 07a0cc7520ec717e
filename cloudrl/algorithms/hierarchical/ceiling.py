"""A clairvoyant supervisor: how much can switching among given sub-agents gain at all?

The hierarchical goal asks a learned supervisor to beat each of its own sub-agents. Before
training one, this measures what *any* supervisor over a set of sub-agents could reach:
Bertsekas' rollout with the true future. At each supervisor decision (every ``k``
ticks) every sub-agent ``i`` is played on an independent copy of the env and of all the
policies (their internal state included): ``i`` for the block, then the ``base``
sub-agent for ``horizon`` more ticks; the real env takes the ``i`` with the best summed
reward, ties to ``base``. The simulator pre-generates the episode's arrivals at reset,
so a copy plays the real future: this is a ceiling, not a policy. With the horizon to
the episode end it is an exact one-step policy improvement over ``base`` and never
worse than it in reward (tested); a learned supervisor sees only the macro state.

:func:`clone_cluster` copies a flat or branching cluster env (simulator, observation
builder) sharing what no step mutates, as ``cloudrl.algorithms.rollout`` does for the
gated env.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cloudrl.algorithms.rollout import MUTABLE_SIM


def clone_cluster(env: Any, policies: Sequence[Any]) -> tuple[Any, list[Any]]:
    """Independent copies of a cluster env mid-episode and of ``policies`` (their state)."""
    sim = env.sim
    shared = [v for k, v in vars(sim).items() if k not in MUTABLE_SIM]
    shared += [v for k, v in vars(env.obs_builder).items() if k != "sim"]
    shared += [env.config, env.action_space, env.observation_space]
    memo: dict[int, object] = {id(v): v for v in shared}
    twin_env, twin_policies = copy.deepcopy((env, list(policies)), memo)
    return twin_env, twin_policies


def _play(env: Any, policies: list[Any], obs: dict, first: int, block: int, base: int,
          tail: int) -> float:
    """Summed reward of ``first`` for ``block`` ticks, then ``base`` for ``tail`` ticks."""
    total = 0.0
    for step in range(block + tail):
        policy = policies[first if step < block else base]
        obs, reward, term, trunc, _ = env.step(policy.act(obs))
        total += reward
        if term or trunc:
            break
    return total


@dataclass
class CeilingEpisode:
    """One episode of the clairvoyant supervisor: reward and the decisions it took."""

    reward: float
    energy_kwh: float
    violations: int
    toggles: int
    choices: list[int] = field(default_factory=list)
    macros: list[np.ndarray] = field(default_factory=list)  # what a supervisor saw, per decision
    scores: list[list[float]] = field(default_factory=list)  # each sub-agent's rollout reward
    observations: list[np.ndarray] = field(default_factory=list)  # full obs, flattened

    def share(self, n_sub_agents: int) -> list[float]:
        """Fraction of decisions that picked each sub-agent."""
        counts = np.bincount(self.choices, minlength=n_sub_agents)
        return (counts / max(1, len(self.choices))).tolist()


def run_ceiling_episode(env: Any, sub_agents: Sequence[Any], seed: int, k: int,
                        base: int = 0, horizon: int | None = None, futures: str = "true",
                        n_futures: int = 1, rule: str = "mean",
                        keep_observations: bool = False) -> CeilingEpisode:
    """One episode of ``env`` (seed ``seed``) under the rollout supervisor over
    ``sub_agents``: every ``k`` ticks the sub-agent whose rollout (it for ``k`` ticks, then
    ``base`` for ``horizon`` ticks, ``None`` = to the episode end) sums the most reward.

    ``futures="true"`` plays the episode's real future (the ceiling). ``"resampled"``
    redraws the jobs that have not arrived yet in each of ``n_futures`` futures (the same
    draw for every sub-agent; ``cloudrl.algorithms.rollout.resample_future``) and keeps what
    the state already holds (queue, running jobs and their finish ticks): the gain that
    survives it comes from the present state, not from knowing the arrivals.
    ``keep_observations`` also keeps each decision's whole observation (macro, servers, jobs
    flattened), what a per-tick policy such as the offline constrained agent sees."""
    from cloudrl.algorithms.rollout import FUTURES, RULES, choose, resample_future

    if futures not in FUTURES:
        raise ValueError(f"futures must be one of {', '.join(FUTURES)}, got {futures!r}")
    if n_futures < 1:
        raise ValueError(f"n_futures must be >= 1, got {n_futures}")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0 <= base < len(sub_agents):
        raise ValueError(f"base {base} is not a sub-agent index (0..{len(sub_agents) - 1})")
    if horizon is not None and horizon < 0:
        raise ValueError(f"horizon must be >= 0 or None, got {horizon}")
    policies = list(sub_agents)
    obs, _ = env.reset(seed=seed)
    for policy in policies:
        policy.reset()
    tail = 10 ** 9 if horizon is None else horizon
    rng = np.random.default_rng([seed, 15])
    n_runs = 1 if futures == "true" else n_futures
    total, done = 0.0, False
    choices: list[int] = []
    macros: list[np.ndarray] = []
    all_scores: list[list[float]] = []
    observations: list[np.ndarray] = []
    while not done:
        scores = np.zeros((n_runs, len(policies)))
        for m in range(n_runs):
            start_env, start_policies = clone_cluster(env, policies)
            if futures == "resampled":
                resample_future(start_env.sim, rng)
            for i in range(len(policies)):
                twin_env, twin_policies = clone_cluster(start_env, start_policies)
                scores[m, i] = _play(twin_env, twin_policies, obs, i, k, base, tail)
        choice = choose(scores, rule, base)
        choices.append(choice)
        macros.append(np.array(obs["macro"], dtype=np.float32))
        all_scores.append(scores.mean(axis=0).tolist())
        if keep_observations:
            observations.append(np.concatenate([np.ravel(obs[key]).astype(np.float32)
                                                for key in ("macro", "servers", "jobs")]))
        for _ in range(k):
            obs, reward, term, trunc, _ = env.step(policies[choice].act(obs))
            total += reward
            done = term or trunc
            if done:
                break
    st = env.sim.stats
    return CeilingEpisode(total, st.energy_j / 3.6e6, st.violations, st.toggles, choices,
                          macros, all_scores, observations)
