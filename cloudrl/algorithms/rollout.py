"""Rollout over the gated env's presets: independent env copies, resampled futures, scores.

Bertsekas' rollout (one step of policy iteration) with a base policy: at a decision,
try every preset ``p`` on a copy of the env (``p`` for this block, then the base preset 0
for ``horizon`` more ticks), score each by the summed env reward, act with the best.
What a state-dependent preset choice could gain over the heuristic, measured with it, is on
the docs' retired-probes page (docs/results/retired-probes.md); the clairvoyant supervisor
(``cloudrl.algorithms.hierarchical.ceiling``) reuses its choice rule.

* :func:`clone_env` copies a :class:`envs.gated_env.GatedControllerEnv` (simulator,
  branching env, observation builder, controller state). It shares (does not copy) what
  no step mutates: config, fleet, workload, the episode's job columns, the observation
  builder's tables. (``ClusterSim.__deepcopy__`` re-binds the simulator's column views
  into its ``dyn`` matrix; numpy alone would deep-copy them as separate arrays.)
* :func:`resample_future` replaces a copy's not-yet-arrived jobs (ids from
  ``sim._next_arrival`` on: every arrival ``<= sim.t`` has been enqueued) by a fresh draw
  of the workload with another generator, keeping the past, the queue and the running
  jobs. The true future is pre-generated at reset (``ClusterSim.reset`` ->
  ``workload.generate``), so a copy without this knows it (clairvoyant). google_v2_like
  keeps the episode's day phase (``clock_offset``, visible in the observation's time
  features) and redraws its burst chain; trace replay is not supported.
* :func:`rollout_scores` scores every preset over common futures (the same resampled
  draw for every preset: common random numbers); :func:`choose` picks from the scores.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from envs.gated_env import GatedControllerEnv
from envs.sim import ClusterSim
from envs.workloads.base import JobTable
from envs.workloads.synthetic import GoogleV2LikeWorkload, PoissonWorkload, _arrival_ticks

FUTURES = ("true", "resampled")
# ClusterSim attributes a step changes (the rest is fixed between resets, so copies share it)
MUTABLE_SIM = ("t", "dyn", "used_cpu", "used_mem", "wake_left", "n_running", "watts",
               "power_state", "_n_waking", "_tick_toggles", "priority_level", "arrival_ema",
               "violation_ema", "stats", "_finish_at", "job_server", "_server", "_queue",
               "_next_arrival")


def _shared(env: GatedControllerEnv) -> list[object]:
    sim, inner = env.sim, env.env
    out = [v for k, v in vars(sim).items() if k not in MUTABLE_SIM]
    out += [v for k, v in vars(inner.obs_builder).items() if k != "sim"]
    out += [inner.config, inner.action_space, inner.observation_space, env.action_space,
            env.observation_space, env.controller.configs, env.controller.base]
    return out


def clone_env(env: GatedControllerEnv) -> GatedControllerEnv:
    """An independent copy of ``env`` mid-episode: stepping it leaves ``env`` unchanged."""
    memo: dict[int, object] = {id(v): v for v in _shared(env)}
    return copy.deepcopy(env, memo)


def future_jobs(sim: ClusterSim, rng: np.random.Generator) -> JobTable:
    """A fresh draw of the episode's jobs (arrival ticks ``[0, episode_length)``) with the
    episode's day phase; a ValueError for a workload that cannot be redrawn."""
    wl, horizon, fleet = sim.workload, sim.cfg.episode_length, sim.capacity
    if isinstance(wl, GoogleV2LikeWorkload):
        arrival = _arrival_ticks(wl._rate_profile(horizon, sim.clock_offset, rng), rng)
        return wl._jobs(arrival, rng, fleet, sim.clock_offset)
    if isinstance(wl, PoissonWorkload):
        return wl.generate(horizon, rng, fleet)
    raise ValueError(f"workload {getattr(wl, 'name', wl)!r}: resampled futures support "
                     "poisson and google_v2_like only")


def resample_future(sim: ClusterSim, rng: np.random.Generator) -> int:
    """Replace ``sim``'s jobs that have not arrived yet by a fresh draw arriving after
    ``sim.t``; jobs that arrived (queued, running, ended) keep their ids and state.
    Returns the number of future jobs now in ``sim``."""
    k = sim._next_arrival
    draw = future_jobs(sim, rng)
    keep = draw.arrival > sim.t
    server = sim.job_server[:k].copy()
    past_deadline = sim.job_deadline[:k]
    sim._set_job_arrays(
        np.concatenate([sim.job_arrival[:k], draw.arrival[keep]]),
        np.concatenate([sim.job_cpu[:k], draw.cpu[keep]]),
        np.concatenate([sim.job_mem[:k], draw.mem[keep]]),
        np.concatenate([sim.job_duration[:k], draw.duration[keep]]),
        np.concatenate([past_deadline, draw.arrival[keep] + draw.deadline[keep]]))
    sim.job_server[:k] = server
    sim._server[:k] = server.tolist()
    return int(keep.sum())


def _play(env: GatedControllerEnv, choice: int, tail_steps: int) -> float:
    """Summed reward of ``choice`` for one decision, then preset 0 for ``tail_steps``."""
    _, total, term, trunc, _ = env.step(choice)
    for _ in range(tail_steps):
        if term or trunc:
            break
        _, reward, term, trunc, _ = env.step(0)
        total += reward
    return total


def rollout_scores(env: GatedControllerEnv, horizon: int, futures: str,
                   rngs: Sequence[np.random.Generator]) -> np.ndarray:
    """(M, P) summed reward of each preset in each of ``M = len(rngs)`` futures: the preset
    for one decision, then preset 0 for ``horizon`` ticks (rounded up to whole decisions).
    ``futures="true"`` plays the env's own future (``rngs`` then only sets the count;
    one is enough, the simulator is deterministic); ``"resampled"`` redraws it per future,
    the same draw for every preset (common random numbers)."""
    if futures not in FUTURES:
        raise ValueError(f"futures must be one of {', '.join(FUTURES)}, got {futures!r}")
    if horizon < 0:
        raise ValueError(f"horizon must be >= 0, got {horizon}")
    tail = -(-horizon // env.decision_every)
    scores = np.zeros((len(rngs), env.n_choices))
    for m, rng in enumerate(rngs):
        base = clone_env(env)
        if futures == "resampled":
            resample_future(base.sim, rng)
        for p in range(env.n_choices):
            scores[m, p] = _play(clone_env(base), p, tail)
    return scores


RULES = ("mean", "consistent")


def choose(scores: np.ndarray, rule: str = "mean", base: int = 0) -> int:
    """The choice to play from (M, P) rollout scores. ``"mean"``: the best mean (ties go to
    ``base``, then to the lowest index). ``"consistent"``: the best mean among choices that
    beat ``base`` in every future, else ``base`` (guards against picking the noise of M
    sampled futures: the max of P noisy estimates is biased up). ``base`` is preset 0 for
    the gated env; the clairvoyant supervisor passes its base sub-agent."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    mean = scores.mean(axis=0)
    if rule == "consistent":
        mean = np.where(np.all(scores > scores[:, base:base + 1], axis=0), mean, -np.inf)
        mean[base] = scores[:, base].mean()
    return base if mean[base] >= mean.max() else int(np.argmax(mean))
