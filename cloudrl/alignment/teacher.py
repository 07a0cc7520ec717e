"""The safety-bound teacher: segment statistics, a lexicographic ranking, teacher pair datasets.

A segment is T consecutive steps s..s+T-1 of a recorded episode
(``cloudrl.alignment.recording``): the actions taken there and the T+1 observations
s..s+T around them (observation s+k is the one action s+k was taken on, and the one
action s+k-1 led to), so a transition reward r(o_t, o_{t+1}) sees every step's
before and after, as the phase-3 connector does. Its statistics:

* ``sla_violations``: SLA violations (late finishes + drops) reported in the steps' infos;
* ``overload``: server-steps whose utilisation (the larger of CPU and memory use over
  capacity) exceeds ``TeacherConfig.overload_threshold``, counted on the states the
  segment's actions led to (observations s+1..s+T);
* ``slowdown_spread``: the spread (``p90 - p10`` by default, or ``std``) of the slowdowns
  (wait + duration) / duration of the jobs the segment's actions placed. A job's slowdown
  is fixed when it starts (jobs are non-preemptive), so it is read from the job's queue
  row at placement (age and duration), from the observation alone; 0 with fewer than two
  placements. In the branching interface a placement that an earlier slot's placement
  made infeasible in the same tick (``info["placement_conflicts"]``) is still counted;
* ``energy_kwh``: energy drawn during the steps (infos).

:class:`Teacher` ranks A against B criterion by criterion in ``TeacherConfig.order``
(default: violations, overload, fairness, energy). Per criterion: a value that is NaN on
either side skips it; with a ``bound``, a segment within the bound (value <= bound) beats
one outside it and two segments within it tie on it; otherwise the smaller value wins
unless the two differ by no more than ``tolerance + rel_tolerance * max(|a|, |b|)``
(a tie, so the next criterion decides). All criteria tied: label 0.5. ``label_noise``
flips a decided label (1 <-> 0) with that probability, from a seeded generator; ties stay.

:func:`make_teacher_pairs` samples segment pairs from a directory of recorded episodes
and writes them, labelled, as a pair dataset (``cloudrl.alignment.preferences``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from cloudrl.alignment.preferences import STAT_FIELDS, Segment, pair_row, write_pairs
from envs.observation import J, S

CriterionName = Literal["sla_violations", "overload", "slowdown_spread", "energy_kwh"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Criterion(_Strict):
    """How one statistic ranks two segments (smaller is better)."""

    bound: float | None = Field(None, description="values <= bound are all acceptable (tie)")
    tolerance: float = Field(0.0, ge=0.0, description="absolute difference that still ties")
    rel_tolerance: float = Field(0.0, ge=0.0, description="relative difference that still ties")


class TeacherConfig(_Strict):
    """The teacher's criteria, bounds, tolerances and label noise (defaults that run)."""

    order: tuple[CriterionName, ...] = ("sla_violations", "overload", "slowdown_spread",
                                        "energy_kwh")
    sla_violations: Criterion = Criterion(bound=0.0)
    overload: Criterion = Criterion(bound=0.0)
    slowdown_spread: Criterion = Criterion(tolerance=0.05)
    energy_kwh: Criterion = Criterion(rel_tolerance=0.01)
    overload_threshold: float = Field(0.9, gt=0.0, le=1.0,
                                      description="utilisation above which a server is "
                                                  "overloaded")
    fairness: Literal["p90_p10", "std"] = "p90_p10"
    label_noise: float = Field(0.0, ge=0.0, le=0.5, description="probability of flipping "
                                                                 "a decided label")

    @field_validator("order")
    @classmethod
    def _unique(cls, order: tuple[str, ...]) -> tuple[str, ...]:
        if not order:
            raise ValueError("at least one criterion")
        if len(set(order)) != len(order):
            raise ValueError(f"criteria repeat: {list(order)}")
        return order


# ----------------------------------------------------------------------------- statistics


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
    """Arrays of a ``SingleAgentEpisode`` recorded by :mod:`cloudrl.alignment.recording`."""
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


def segment_stats(ep: EpisodeData, start: int, length: int, cfg: TeacherConfig) -> dict[str, float]:
    """The teacher's statistics of steps start..start+length-1 of an episode."""
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


def cut_segment(ep: EpisodeData, start: int, length: int, cfg: TeacherConfig) -> Segment:
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


# ----------------------------------------------------------------------------- ranking


class Teacher:
    """Lexicographic, bounded preference between two segments' statistics."""

    def __init__(self, config: TeacherConfig | None = None, seed: int = 0) -> None:
        self.config = config or TeacherConfig()
        self._rng = np.random.default_rng(seed)

    def compare(self, a: dict[str, float], b: dict[str, float]) -> tuple[float, str | None]:
        """(P(A preferred) without noise, the criterion that decided, None for a tie)."""
        for name in self.config.order:
            crit: Criterion = getattr(self.config, name)
            va, vb = float(a.get(name, math.nan)), float(b.get(name, math.nan))
            if math.isnan(va) or math.isnan(vb):
                continue
            if crit.bound is not None:
                ok_a, ok_b = va <= crit.bound, vb <= crit.bound
                if ok_a and ok_b:
                    continue
                if ok_a != ok_b:
                    return (1.0 if ok_a else 0.0), name
            if abs(va - vb) <= crit.tolerance + crit.rel_tolerance * max(abs(va), abs(vb)):
                continue
            return (1.0 if va < vb else 0.0), name
        return 0.5, None

    def label(self, a: dict[str, float], b: dict[str, float]) -> float:
        """P(A preferred), with ``label_noise`` flips of decided labels."""
        p, _ = self.compare(a, b)
        noise = self.config.label_noise
        if p != 0.5 and noise > 0.0 and self._rng.random() < noise:
            return 1.0 - p
        return p


# ----------------------------------------------------------------------------- datasets


@dataclass
class TeacherPairsSummary:
    """What :func:`make_teacher_pairs` wrote."""

    paths: list[Path]
    n_pairs: int
    labels: dict[float, int]
    decided_by: dict[str, int] = field(default_factory=dict)
    flipped: int = 0


def load_episode_data(episodes_dir: str | Path) -> list[EpisodeData]:
    from cloudrl.alignment.recording import read_episodes

    return [episode_data(ep) for ep in read_episodes(episodes_dir)]


def make_teacher_pairs(episodes_dir: str | Path | Sequence[EpisodeData], n_pairs: int,
                       segment_length: int, seed: int, out_dir: str | Path, *,
                       config: TeacherConfig | None = None,
                       rows_per_file: int = 256) -> TeacherPairsSummary:
    """Sample ``n_pairs`` distinct segment pairs, label them with the teacher, write them.

    Segments are drawn uniformly: an episode, then a start in [0, L - T]; the two sides of
    a pair may come from the same episode but never from the same start. ``seed`` fixes
    the draw and the label noise.
    """
    cfg = config or TeacherConfig()
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be >= 1, got {n_pairs}")
    if segment_length < 1:
        raise ValueError(f"segment_length must be >= 1, got {segment_length}")
    episodes = (load_episode_data(episodes_dir) if isinstance(episodes_dir, str | Path)
                else list(episodes_dir))
    usable = [i for i, ep in enumerate(episodes) if ep.length >= segment_length]
    if not usable:
        longest = max((ep.length for ep in episodes), default=0)
        raise ValueError(f"segment_length {segment_length} is longer than every episode "
                         f"(longest {longest} steps)")
    starts = {i: episodes[i].length - segment_length + 1 for i in usable}
    n_segments = sum(starts.values())
    if n_segments < 2 or n_pairs > n_segments * (n_segments - 1) // 2:
        raise ValueError(f"n_pairs {n_pairs}: only {n_segments} segments of length "
                         f"{segment_length} to pair")
    rng = np.random.default_rng(seed)
    teacher = Teacher(cfg, seed=seed + 1)
    seen: set[tuple] = set()
    rows: list[dict[str, Any]] = []
    paths: list[Path] = []
    labels: Counter = Counter()
    decided: Counter = Counter()
    flipped = 0
    cache: dict[tuple[int, int], Segment] = {}

    def segment(i: int, s: int) -> Segment:
        if (i, s) not in cache:
            cache[(i, s)] = cut_segment(episodes[i], s, segment_length, cfg)
        return cache[(i, s)]

    while len(seen) < n_pairs:
        ia, ib = (usable[int(x)] for x in rng.integers(len(usable), size=2))
        sa, sb = int(rng.integers(starts[ia])), int(rng.integers(starts[ib]))
        key = (ia, sa, ib, sb)
        if (ia, sa) == (ib, sb) or key in seen or (ib, sb, ia, sa) in seen:
            continue
        seen.add(key)
        a, b = segment(ia, sa), segment(ib, sb)
        clean, by = teacher.compare(a.stats, b.stats)
        label = teacher.label(a.stats, b.stats)
        flipped += label != clean
        labels[label] += 1
        decided[by or "tie"] += 1
        pid = f"teacher:{episodes[ia].episode_id}:{sa}:{episodes[ib].episode_id}:{sb}"
        rows.append(pair_row(pid, "teacher", label, a, b))
        if len(rows) >= rows_per_file:
            paths += write_pairs(rows, out_dir, rows_per_file=rows_per_file, prefix="teacher")
            rows = []
        if len(cache) > 4096:
            cache.clear()
    if rows:
        paths += write_pairs(rows, out_dir, rows_per_file=rows_per_file, prefix="teacher")
    return TeacherPairsSummary(paths, n_pairs, dict(labels), dict(decided), flipped)


__all__ = ["STAT_FIELDS", "Criterion", "EpisodeData", "Teacher", "TeacherConfig",
           "TeacherPairsSummary", "cut_segment", "episode_data", "make_teacher_pairs",
           "overload_count", "placement_slowdowns", "segment_stats", "spread", "utilisation"]
