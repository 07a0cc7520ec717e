"""Pairs for the queue: from rollouts of policies, recorded episodes, or the feedback store.

* :func:`record_rollouts` runs heuristics or checkpoints on an env config (a workload or
  scenario) and chosen train seeds (test seeds are refused: they are held out);
* :func:`episode_segments` cuts recorded episodes (``cloudrl align record``'s format)
  into segments of T steps (every ``stride`` steps), each with its view, its T+1
  observations and the teacher's statistics;
* :func:`make_pairs` pairs segments: first the same situation under different policies
  (same scenario, seed and start), then random pairs, up to ``n_pairs``;
* :func:`mark_gold` gives a share of pairs a known answer where the safety teacher
  decides on SLA violations or overload (never on the tolerance-based criteria);
* :func:`feedback_pairs` takes the decision service's stored pairs (inline trajectories,
  ``POST /v1/feedback``) through the same observation path as
  ``cloudrl align operator-pairs`` and shows them as segments; their stored preference
  can become the gold answer.
"""

from __future__ import annotations

import hashlib
import math
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.labelling.queue import PairSpec
from cloudrl.labelling.segments import (
    EnvMeta,
    SegmentRecord,
    make_view,
    merge_series,
    series_from_infos,
    series_from_observations,
)


def record_rollouts(policies: Sequence[str], seeds: Sequence[int], *, env_config: Any = None,
                    interface: str = "flat", max_steps: int | None = None) -> list[Any]:
    """Episodes (RLlib ``SingleAgentEpisode``) of each policy on each seed."""
    from cloudrl.policy import make_env
    from cloudrl.protocol import TRAIN_SEEDS
    from cloudrl.recording import make_policy, record_episode

    bad = [s for s in seeds if s not in TRAIN_SEEDS]
    if bad:
        raise ValueError(f"seeds: {bad[0]} is not a train seed (0..{len(TRAIN_SEEDS) - 1}); "
                         "test seeds stay held out")
    out = []
    for spec in policies:
        policy = make_policy(spec, interface)  # type: ignore[arg-type]
        env = make_env(getattr(policy, "env_config", None) or env_config, policy.interface)
        for seed in seeds:
            out.append((env, record_episode(env, policy, int(seed), max_steps=max_steps)))
    return out


def episode_segments(episode: Any, meta: EnvMeta, length: int, stride: int | None = None,
                     teacher_config: Any = None) -> list[SegmentRecord]:
    """Segments of ``length`` steps every ``stride`` steps (default: back to back)."""
    from cloudrl.alignment.teacher import TeacherConfig
    from cloudrl.data.segments import cut_segment, episode_data

    if length < 1:
        raise ValueError(f"segment_length: {length} < 1")
    ep = episode_data(episode)
    infos = list(episode.get_infos())[1:]
    cfg = teacher_config or TeacherConfig()
    out = []
    n_servers = ep.servers.shape[1]
    for start in range(0, ep.length - length + 1, stride or length):
        seg = cut_segment(ep, start, length, cfg)
        step_infos = infos[start:start + length]
        series = merge_series(
            series_from_observations(ep.macro[start + 1:start + length + 1],
                                     ep.servers[start + 1:start + length + 1], meta),
            series_from_infos(step_infos))
        energy = float(np.nansum(ep.energy_kwh[start:start + length]))
        view = make_view(series=series, meta=meta, policy=ep.policy, source="rollout",
                         seed=ep.episode_seed, start=start,
                         energy_kwh=energy if math.isfinite(energy) else None)
        key = (f"ep:{meta.scenario}:{n_servers}:{ep.policy}:{ep.episode_seed}:{start}:"
               f"{length}")
        out.append(SegmentRecord(key=key, view=view, obs={
            "macro": seg.macro, "servers": seg.servers, "jobs": seg.jobs,
            "actions": seg.actions}, stats=dict(seg.stats)))
    return out


def make_pairs(segments: Sequence[SegmentRecord], n_pairs: int, seed: int = 0
               ) -> list[tuple[SegmentRecord, SegmentRecord]]:
    """Up to ``n_pairs`` distinct pairs: same situation, different policies first."""
    rng = np.random.default_rng(seed)
    groups: dict[tuple, list[SegmentRecord]] = {}
    for s in segments:
        v = s.view
        groups.setdefault((v["scenario"], v["seed"], v["start"]), []).append(s)
    same: list[tuple[SegmentRecord, SegmentRecord]] = []
    for group in groups.values():
        for i in range(len(group)):
            for j in range(i + 1, len(group)):
                if group[i].view["policy"] != group[j].view["policy"]:
                    same.append((group[i], group[j]))
    order = rng.permutation(len(same))
    pairs = [same[i] for i in order[:n_pairs]]
    seen = {frozenset((a.key, b.key)) for a, b in pairs}
    tries = 0
    while len(pairs) < n_pairs and len(segments) >= 2 and tries < 20 * n_pairs:
        tries += 1
        i, j = rng.choice(len(segments), size=2, replace=False)
        key = frozenset((segments[i].key, segments[j].key))
        if key not in seen:
            seen.add(key)
            pairs.append((segments[int(i)], segments[int(j)]))
    # show each pair in a random orientation
    return [(a, b) if rng.random() < 0.5 else (b, a) for a, b in pairs]


def mark_gold(pairs: Sequence[PairSpec], fraction: float, seed: int = 0,
              teacher_config: Any = None) -> int:
    """Give about ``fraction`` of the pairs a gold answer (safety criteria only)."""
    from cloudrl.alignment.teacher import Teacher, TeacherConfig

    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"gold_fraction: {fraction} is not in [0, 1]")
    want = int(round(fraction * len(pairs)))
    teacher = Teacher(teacher_config or TeacherConfig())
    rng = np.random.default_rng(seed)
    marked = 0
    for i in rng.permutation(len(pairs)):
        if marked >= want:
            break
        p = pairs[int(i)]
        label, by = teacher.compare(p.a.stats, p.b.stats)
        if by in ("sla_violations", "overload") and label in (0.0, 1.0):
            p.gold = "a" if label == 1.0 else "b"
            marked += 1
    return marked


def feedback_pairs(db: str | Path, *, env_config: Any = None, interface: str = "flat",
                   segment_length: int = 25, as_gold: bool = False,
                   scenario: str = "feedback") -> tuple[list[PairSpec], dict[str, int]]:
    """The feedback store's pairs as queue pairs; returns them and the skip counts."""
    from cloudrl.data.pairs import read_pairs
    from cloudrl.feedback import export_pairs
    from cloudrl.policy import make_env

    if not Path(db).is_file():
        raise FileNotFoundError(f"feedback database {db} does not exist")
    with tempfile.TemporaryDirectory() as tmp:
        res = export_pairs(db, tmp, env_config=env_config, interface=interface,
                           segment_length=segment_length)
        data = read_pairs(tmp) if res.written else None
    conn = sqlite3.connect(f"file:{Path(db).resolve()}?mode=ro", uri=True)
    try:
        stored = {f"operator:{key[:24]}": (pref, version) for key, pref, version in
                  conn.execute("SELECT pair_key, preferred, policy_version FROM feedback")}
    finally:
        conn.close()
    meta = EnvMeta.of_env(make_env(env_config, interface), scenario)  # type: ignore[arg-type]
    out: list[PairSpec] = []
    for i in range(len(data) if data is not None else 0):
        pid = str(data.meta["pair_id"][i])
        preferred, version = stored.get(pid, (None, None))
        sides = []
        for s in ("a", "b"):
            obs = {part: data.obs[s][part][i] for part in ("macro", "servers", "jobs",
                                                           "actions")}
            series = series_from_observations(obs["macro"][1:], obs["servers"][1:], meta)
            view = make_view(series=series, meta=meta, policy=version or "serving",
                             source="feedback", seed=-1, start=int(data.meta[f"{s}_start"][i]))
            stats = {k: float(data.meta[f"{s}_{k}"][i]) for k in
                     ("sla_violations", "overload", "slowdown_spread", "energy_kwh")}
            digest = hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes()
                                             for v in obs.values())).hexdigest()[:24]
            sides.append(SegmentRecord(key=f"fb:{digest}", view=view, obs=obs, stats=stats))
        if sides[0].key == sides[1].key:
            res.skip("identical", f"{pid}: both sides are the same segment")
            continue
        out.append(PairSpec(a=sides[0], b=sides[1], source="feedback",
                            gold=preferred if as_gold else None))
    return out, dict(res.skipped)
