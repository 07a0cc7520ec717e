"""Segments of recorded episodes: arrays, statistics, and the pair side a segment becomes.

A recorded episode (:mod:`cloudrl.data.episodes`) as arrays is :class:`EpisodeData` (L
steps, L+1 observations). A segment is T consecutive steps s..s+T-1: the actions taken
there and the T+1 observations s..s+T around them (observation s+k is the one action
s+k was taken on, and the one action s+k-1 led to), so a transition reward
r(o_t, o_{t+1}) sees every step's before and after. Its statistics:

* ``sla_violations``: SLA violations (late finishes + drops) reported in the steps' infos;
* ``overload``: server-steps whose utilisation (the larger of CPU and memory use over
  capacity) exceeds ``overload_threshold``, counted on the states the segment's actions
  led to (observations s+1..s+T);
* ``slowdown_spread``: the spread (``p90 - p10`` by default, or ``std``) of the slowdowns
  (wait + duration) / duration of the jobs the segment's actions placed, read from each
  job's queue row at placement; 0 with fewer than two placements;
* ``energy_kwh``: energy drawn during the steps (infos).

:func:`cut_segment` makes a segment a pair side (:class:`cloudrl.data.pairs.Segment`)
with these statistics; the safety-bound teacher (``cloudrl.alignment.teacher``), the
operator-feedback export and the offline datasets' cost all read them from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from cloudrl.data.episodes import read_episodes
from cloudrl.data.pairs import Segment
from envs.observation import J, S


class StatsConfig(Protocol):
    """What the statistics read from a config (``TeacherConfig`` has both)."""

    overload_threshold: float
    fairness: str


@dataclass(frozen=True)
class DefaultStats:
    """The teacher's defaults: overload above 0.9 utilisation, p90 - p10 spread."""

    overload_threshold: float = 0.9
    fairness: Literal["p90_p10", "std"] = "p90_p10"


def utilisation(servers: np.ndarray) -> np.ndarray:
    """Per-server utilisation of server rows (..., N, Fs): max of CPU and memory use / capacity."""
    cpu = servers[..., S["cpu_util"]]
    mem_cap = servers[..., S["mem_cap"]]
    mem_used = mem_cap - servers[..., S["mem_free"]]
    mem = np.divide(mem_used, mem_cap, out=np.zeros_like(mem_cap), where=mem_cap > 0)
    return np.maximum(cpu, mem)


def overload_count(servers: np.ndarray, threshold: float) -> int:
    """Server-steps of (T, N, Fs) rows whose utilisation exceeds ``threshold``."""
    return int(np.sum(utilisation(servers) > threshold + 1e-6))


def placement_slowdowns(jobs: np.ndarray, masks: np.ndarray, actions: np.ndarray,
                        n_servers: int) -> np.ndarray:
    """Slowdowns (age + duration) / duration of the jobs placed by T steps of actions.

    ``jobs`` (T, K, Fj) and ``masks`` (T, mask size) are the observations the actions
    (T, A) were taken on; A = 1 is the flat interface, else the branching one.
    """
    t_len, k = jobs.shape[0], jobs.shape[1]
    out: list[float] = []
    flat = actions.shape[1] == 1
    for t in range(t_len):
        mask = masks[t] > 0.5
        if flat:
            a = int(actions[t, 0])
            placed = [a // n_servers] if a < k * n_servers and mask[a] else []
        else:
            placed = [slot for slot in range(k)
                      if (srv := int(actions[t, slot])) < n_servers
                      and mask[slot * (n_servers + 1) + srv]]
        for slot in placed:
            row = jobs[t, slot]
            if row[J["present"]] > 0.5 and row[J["duration"]] > 0:
                out.append(float((row[J["age"]] + row[J["duration"]]) / row[J["duration"]]))
    return np.asarray(out, dtype=np.float64)


def spread(values: np.ndarray, kind: str = "p90_p10") -> float:
    """p90 - p10 or the standard deviation; 0 for fewer than two values."""
    if values.size < 2:
        return 0.0
    if kind == "std":
        return float(np.std(values))
    p10, p90 = np.percentile(values, [10.0, 90.0])
    return float(p90 - p10)


@dataclass
class EpisodeData:
    """A recorded episode as arrays: L steps, L+1 observations (reset included)."""

    macro: np.ndarray  # (L+1, M)
    servers: np.ndarray  # (L+1, N, Fs)
    jobs: np.ndarray  # (L+1, K, Fj)
    mask: np.ndarray  # (L+1, mask size)
    actions: np.ndarray  # (L, A)
    violations: np.ndarray  # (L,)
    energy_kwh: np.ndarray  # (L,)
    episode_seed: int = -1
    policy: str = ""
    episode_id: str = ""

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])


def _info_series(infos: Sequence[dict], key: str) -> np.ndarray:
    return np.array([float(i.get(key, math.nan)) if i else math.nan for i in infos],
                    dtype=np.float64)


def episode_data(episode: Any) -> EpisodeData:
    """Arrays of a ``SingleAgentEpisode`` recorded by :mod:`cloudrl.recording`."""
    observations = episode.get_observations()
    length = len(episode)
    if isinstance(observations, dict):  # a numpy'd episode
        stacked = {k: np.asarray(v) for k, v in observations.items()}
    else:
        stacked = {k: np.stack([np.asarray(o[k]) for o in observations])
                   for k in ("macro", "servers", "jobs", "action_mask")}
    actions = np.asarray(episode.get_actions(), dtype=np.int64).reshape(length, -1)
    infos = list(episode.get_infos())[1:]  # infos[0] is the reset info
    custom = dict(episode.custom_data or {})
    seed = custom.get("episode_seed", (episode.get_infos(0) or {}).get("episode_seed", -1))
    return EpisodeData(
        macro=stacked["macro"].astype(np.float32), servers=stacked["servers"].astype(np.float32),
        jobs=stacked["jobs"].astype(np.float32), mask=stacked["action_mask"],
        actions=actions, violations=_info_series(infos, "violations"),
        energy_kwh=_info_series(infos, "energy_kwh"), episode_seed=int(seed),
        policy=str(custom.get("policy", "")), episode_id=str(episode.id_))


def segment_stats(ep: EpisodeData, start: int, length: int,
                  cfg: StatsConfig | None = None) -> dict[str, float]:
    """The statistics of steps start..start+length-1 of an episode (the teacher ranks by
    them); ``cfg`` (e.g. a ``TeacherConfig``) sets the overload threshold and the spread."""
    cfg = cfg or DefaultStats()
    stop = start + length
    n = ep.servers.shape[1]
    slowdowns = placement_slowdowns(ep.jobs[start:stop], ep.mask[start:stop],
                                    ep.actions[start:stop], n)
    return {
        "sla_violations": float(np.sum(ep.violations[start:stop])),
        "overload": float(overload_count(ep.servers[start + 1:stop + 1], cfg.overload_threshold)),
        "slowdown_spread": spread(slowdowns, cfg.fairness),
        "energy_kwh": float(np.sum(ep.energy_kwh[start:stop])),
    }


def cut_segment(ep: EpisodeData, start: int, length: int,
                cfg: StatsConfig | None = None) -> Segment:
    """Steps start..start+length-1 of ``ep`` as a transition :class:`Segment` with its
    statistics: the actions of those steps and the length+1 observations start..start+length
    (before the first action, then after each)."""
    if length < 1 or start < 0 or start + length > ep.length:
        raise ValueError(f"segment [{start}, {start + length}) outside the episode's "
                         f"{ep.length} steps")
    stop = start + length
    around = slice(start, stop + 1)  # T+1 observations: T transitions
    return Segment(macro=ep.macro[around], servers=ep.servers[around],
                   jobs=ep.jobs[around], actions=ep.actions[start:stop],
                   episode_seed=ep.episode_seed, start=start, policy=ep.policy,
                   stats=segment_stats(ep, start, length, cfg))


def load_episode_data(episodes_dir: str | Path) -> list[EpisodeData]:
    return [episode_data(ep) for ep in read_episodes(episodes_dir)]
