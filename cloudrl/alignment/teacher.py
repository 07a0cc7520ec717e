"""The safety-bound teacher: a lexicographic ranking of segments, teacher pair datasets.

A segment is T consecutive steps s..s+T-1 of a recorded episode: the actions taken there
and the T+1 observations s..s+T around them (:mod:`cloudrl.data.segments` cuts them and
computes their statistics), so a transition reward r(o_t, o_{t+1}) sees every step's
before and after, as the phase-3 connector does. The statistics the teacher ranks by:

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
and writes them, labelled, as a pair dataset (``cloudrl.data.pairs``).
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

from cloudrl.data.pairs import STAT_FIELDS, Segment, pair_row, write_pairs
from cloudrl.data.segments import EpisodeData, cut_segment, load_episode_data

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


__all__ = ["STAT_FIELDS", "Criterion", "Teacher", "TeacherConfig", "TeacherPairsSummary",
           "make_teacher_pairs"]
