"""Periodic re-querying of the teacher during phase 3 (Christiano et al. 2017: a reward model
fitted once, offline, is exploited by the policy it trains; fresh labels on the policy's
own segments keep it honest).

Two RLlib callback functions (``config.callbacks(on_sample_end=..., on_train_result=...)``,
next to cloudrl's callback class):

* :func:`collect_episodes` (``on_sample_end``, on every env runner): keeps the episode
  chunks the policy just sampled, as arrays (:class:`cloudrl.data.segments.EpisodeData`:
  observations, actions, and from the infos the violations and energy), stitched per
  episode id (DQN-style samplers return chunks of a few steps), the newest
  ``max_episodes`` episodes;
* :class:`Requery` (``on_train_result``, in the driver): every ``every`` iterations it
  pulls those episodes from the runners (``foreach_env_runner``) and empties the stores,
  cuts random segment pairs of the pair set's length T from them, labels them with the
  teacher (the label budget is counted: no labels once ``label_budget`` is spent),
  appends them to the pair set (in memory and as parquet files under ``out``),
  fine-tunes the reward model for ``epochs`` epochs in the driver (plain torch AdamW,
  Bradley-Terry loss; the DeepSpeed trainer is for the offline phase 2), recomputes the
  reward normalisation over the grown pair set and pushes the new weights to every
  learner's :class:`~cloudrl.alignment.learned_reward.LearnedRewardConnector`.

Why a callback and not a custom ``training_step``: the same two functions serve PPO, APPO
(asynchronous, its own training step) and BDQ without subclassing any algorithm; and the
reward changes only between iterations, never inside one update. What each re-query did
goes into the iteration's result (``result["learned_reward"]``) and into
``out/requery.json``.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from cloudrl.algorithms.bradley_terry import bt_loss
from cloudrl.alignment.teacher import Teacher, TeacherConfig
from cloudrl.data.pairs import PairArrays, pair_row, write_pairs
from cloudrl.data.segments import EpisodeData, cut_segment, episode_data

STORE_ATTR = "_cloudrl_requery_episodes"
HISTORY_FILE = "requery.json"


class RequeryConfig(BaseModel):
    """Phase 3's re-querying: how often, how many labels, how the reward model is tuned."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    every: int = Field(0, ge=0, description="re-query every k training iterations; 0: off")
    pairs: int = Field(32, ge=1, description="teacher labels per re-query")
    label_budget: int = Field(1000, ge=0, description="teacher labels over the whole run")
    epochs: int = Field(3, ge=1, description="fine-tune epochs over the grown pair set")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(3e-4, gt=0.0)
    max_episodes: int = Field(64, ge=1, description="episodes each runner keeps")
    seed: int = 0


# ----------------------------------------------------------------------------- runner side


def join_chunks(a: EpisodeData, b: EpisodeData) -> EpisodeData:
    """Chunk ``b`` appended to ``a`` (``b``'s first observation is ``a``'s last)."""
    return EpisodeData(
        macro=np.concatenate([a.macro, b.macro[1:]]),
        servers=np.concatenate([a.servers, b.servers[1:]]),
        jobs=np.concatenate([a.jobs, b.jobs[1:]]), mask=np.concatenate([a.mask, b.mask[1:]]),
        actions=np.concatenate([a.actions, b.actions]),
        violations=np.concatenate([a.violations, b.violations]),
        energy_kwh=np.concatenate([a.energy_kwh, b.energy_kwh]),
        episode_seed=a.episode_seed if a.episode_seed >= 0 else b.episode_seed,
        policy=a.policy, episode_id=a.episode_id)


def collect_episodes(*, env_runner: Any = None, samples: Any = None, max_episodes: int = 64,
                     **kwargs: Any) -> None:
    """``on_sample_end``: store the sampled chunks as arrays on the env runner."""
    if env_runner is None or not samples:
        return
    store: OrderedDict = env_runner.__dict__.setdefault(STORE_ATTR, OrderedDict())
    for ep in samples:
        if len(ep) == 0 or not hasattr(ep, "get_infos"):
            continue
        data = episode_data(ep)
        data.policy = "phase3"
        key = str(ep.id_)
        if key in store:
            store[key] = join_chunks(store[key], data)
            store.move_to_end(key)
        else:
            store[key] = data
        while len(store) > max_episodes:
            store.popitem(last=False)


def collector(max_episodes: int) -> Any:
    """The ``on_sample_end`` function with its cap (picklable for remote runners)."""
    return partial(collect_episodes, max_episodes=max_episodes)


def pop_episodes(env_runner: Any) -> list[EpisodeData]:
    """Take (and clear) what :func:`collect_episodes` stored on a runner."""
    store = env_runner.__dict__.get(STORE_ATTR)
    if not store:
        return []
    out = list(store.values())
    store.clear()
    return out


# ----------------------------------------------------------------------------- driver side


def label_pairs(episodes: list[EpisodeData], n_pairs: int, segment_length: int,
                teacher: Teacher, rng: np.random.Generator, tag: str) -> list[dict[str, Any]]:
    """Up to ``n_pairs`` teacher-labelled pair rows of random segments of ``episodes``."""
    usable = [ep for ep in episodes if ep.length >= segment_length]
    if not usable:
        return []
    rows = []
    for i in range(n_pairs):
        ea, eb = (usable[int(j)] for j in rng.integers(len(usable), size=2))
        sa = int(rng.integers(ea.length - segment_length + 1))
        sb = int(rng.integers(eb.length - segment_length + 1))
        if ea is eb and sa == sb:
            continue
        a = cut_segment(ea, sa, segment_length, teacher.config)
        b = cut_segment(eb, sb, segment_length, teacher.config)
        rows.append(pair_row(f"requery:{tag}:{i}", "teacher", teacher.label(a.stats, b.stats),
                             a, b))
    return rows


def rows_to_arrays(rows: list[dict[str, Any]], like: PairArrays) -> PairArrays:
    """Pair rows as :class:`PairArrays` with the shapes of ``like``: rows of T+1
    observations keep the last T (the post-step ones) when ``like`` holds state segments."""
    t = like.shape["segment_length"]
    keep = int(like.shape.get("obs_steps", t))
    dims = {"macro": (like.shape["macro_dim"],),
            "servers": (like.shape["n_servers"], like.shape["server_dim"]),
            "jobs": (like.shape["k_slots"], like.shape["job_dim"]),
            "actions": (like.shape["action_dim"],)}

    def part_array(r: dict[str, Any], side: str, part: str) -> np.ndarray:
        d = dims[part]
        if part == "actions":
            return np.asarray(r[f"{side}_{part}"]).reshape(t, *d)
        return np.asarray(r[f"{side}_{part}"]).reshape(-1, *d)[-keep:]

    obs = {s: {part: np.stack([part_array(r, s, part) for r in rows]) for part in dims}
           for s in ("a", "b")}
    meta = {"pair_id": np.array([r["pair_id"] for r in rows], dtype=object),
            "source": np.array([r["source"] for r in rows], dtype=object)}
    return PairArrays(label=np.array([r["label"] for r in rows], dtype=np.float64), obs=obs,
                      meta=meta, shape=dict(like.shape))


def concat_pairs(a: PairArrays, b: PairArrays) -> PairArrays:
    obs = {s: {p: np.concatenate([a.obs[s][p], b.obs[s][p].astype(a.obs[s][p].dtype)])
               for p in a.obs[s]} for s in a.obs}
    meta = {k: np.concatenate([a.meta[k], b.meta[k]]) for k in ("pair_id", "source")
            if k in a.meta and k in b.meta}
    return PairArrays(label=np.concatenate([a.label, b.label]), obs=obs, meta=meta,
                      shape=dict(a.shape))


def finetune(model: torch.nn.Module, pairs: PairArrays, *, epochs: int, batch_size: int,
             lr: float, seed: int) -> float:
    """Bradley-Terry fine-tuning of a reward ensemble on ``pairs`` (driver, plain torch);
    returns the last epoch's mean loss."""
    from cloudrl.alignment.reward_model import pair_batch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    last = math.nan
    for _ in range(epochs):
        order = rng.permutation(len(pairs))
        total, count = 0.0, 0
        for start in range(0, len(order), batch_size):
            obs, label = pair_batch(pairs, order[start:start + batch_size], "cpu",
                                    model.transition)
            returns = model(obs).sum(-1)
            half = returns.shape[1] // 2
            loss = bt_loss(returns[:, :half], returns[:, half:],
                           label.expand(returns.shape[0], -1), reduction="none").mean(1).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * half
            count += half
        last = total / max(count, 1)
    model.eval()
    return last


@dataclass
class RequeryRecord:
    """What one re-query did."""

    iteration: int
    episodes: int
    new_pairs: int
    labels_used: int
    pairs_total: int
    finetune_loss: float
    reward_mean: float
    reward_std: float
    learner_versions: list[int] = field(default_factory=list)


class Requery:
    """``on_train_result``: re-query the teacher every ``cfg.every`` iterations (see module)."""

    def __init__(self, cfg: RequeryConfig, teacher: TeacherConfig, model: torch.nn.Module,
                 spec: dict[str, Any], pairs: PairArrays, out: str | Path) -> None:
        self.cfg = cfg
        self.teacher = Teacher(teacher, seed=cfg.seed + 1)
        self.rng = np.random.default_rng(cfg.seed)
        self.model = model
        self.spec = dict(spec)
        self.pairs = pairs
        self.out = Path(out)
        self.iteration = 0
        self.labels_used = 0
        self.version = 0
        self.history: list[RequeryRecord] = []

    @property
    def due(self) -> bool:
        return (self.cfg.every > 0 and self.iteration % self.cfg.every == 0
                and self.labels_used < self.cfg.label_budget)

    def __call__(self, *, algorithm: Any, result: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        self.iteration += 1
        if not self.due:
            return
        record = self.step(algorithm)
        if result is not None and record is not None:
            result["learned_reward"] = asdict(record)

    def fetch(self, algorithm: Any) -> list[EpisodeData]:
        per_runner = algorithm.env_runner_group.foreach_env_runner(pop_episodes,
                                                                   local_env_runner=True)
        return [ep for eps in per_runner for ep in (eps or [])]

    def step(self, algorithm: Any) -> RequeryRecord | None:
        """One re-query now (the callback's work, callable directly)."""
        from cloudrl.alignment.learned_reward import (
            pair_reward_stats,
            push_reward_state,
            reward_payload,
        )

        episodes = self.fetch(algorithm)
        n = min(self.cfg.pairs, self.cfg.label_budget - self.labels_used)
        t = int(self.pairs.shape["segment_length"])
        rows = label_pairs(episodes, n, t, self.teacher, self.rng,
                           f"{self.iteration}-{self.version}") if n > 0 else []
        if not rows:
            return None
        write_pairs(rows, self.out / "pairs", prefix=f"requery-{self.iteration:05d}")
        self.labels_used += len(rows)
        self.pairs = concat_pairs(self.pairs, rows_to_arrays(rows, self.pairs))
        loss = finetune(self.model, self.pairs, epochs=self.cfg.epochs,
                        batch_size=self.cfg.batch_size, lr=self.cfg.lr,
                        seed=self.cfg.seed + self.iteration)
        mean, std = pair_reward_stats(self.model, self.pairs)
        self.version += 1
        versions = push_reward_state(algorithm, reward_payload(self.model, self.spec, mean, std),
                                     self.version)
        record = RequeryRecord(self.iteration, len(episodes), len(rows), self.labels_used,
                               len(self.pairs), loss, mean, std, versions)
        self.history.append(record)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / HISTORY_FILE).write_text(json.dumps([asdict(r) for r in self.history],
                                                        indent=1))
        return record
