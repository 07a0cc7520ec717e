"""Recording logged datasets for offline constrained RL: whole episodes with a per-step ``cost``.

The format (RLlib's offline episode format plus the ``cost`` in every step's infos) and
its reader live in :mod:`cloudrl.data.offline`; episodes are stepped by
:mod:`cloudrl.recording`. What this module adds:

* the **cost column**: every step's ``infos`` hold ``cost`` = SLA violations in that step
  (late finishes + drops), plus ``overload_weight`` x overloaded servers when asked
  (utilisation above ``overload_threshold``, as the alignment teacher counts it). Episodes
  stay whole, so per-episode cost totals exist (``sum(cost)`` over an episode);
* a **behaviour mix**: each heuristic as it is, ε-noised variants (with probability ε a
  uniformly random *valid* action; per branch on the branching interface), and
  checkpoints of learned agents, all on the train seeds. ``custom_data`` of an episode
  names its behaviour (``policy``, ``epsilon``, ``episode_seed``);
* :func:`summarize` (return, cost, action coverage per branch, per behaviour) and
  :func:`subset_dataset` (the episodes within a cost range, written as a new dataset).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from cloudrl.data.episodes import write_episodes
from cloudrl.data.offline import COST_KEY, DatasetError, episode_cost, read_dataset
from cloudrl.policy import Interface, Policy, make_env
from cloudrl.protocol import TRAIN_SEEDS
from cloudrl.recording import make_policy, record_episode
from envs.env_config import EnvConfig

# ----------------------------------------------------------------------------- cost


class CostInfo(gym.Wrapper):
    """Adds ``info["cost"]``: SLA violations of the step (+ weighted overloaded servers)."""

    def __init__(self, env: gym.Env, overload_weight: float = 0.0,
                 overload_threshold: float = 0.9) -> None:
        super().__init__(env)
        self.overload_weight = float(overload_weight)
        self.overload_threshold = float(overload_threshold)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        cost = float(info["violations"])
        if self.overload_weight > 0:
            from cloudrl.data.segments import overload_count

            cost += self.overload_weight * overload_count(obs["servers"][None],
                                                          self.overload_threshold)
        info[COST_KEY] = cost
        return obs, reward, terminated, truncated, info


# ----------------------------------------------------------------------------- behaviour


def random_valid_action(mask: np.ndarray, rng: np.random.Generator,
                        branch_sizes: Sequence[int] | None = None) -> int | np.ndarray:
    """A uniformly random valid action: flat (``branch_sizes`` None) or per branch."""
    valid = mask > 0
    if branch_sizes is None:
        idx = np.flatnonzero(valid)
        return int(rng.choice(idx)) if idx.size else 0
    action = np.empty(len(branch_sizes), dtype=np.int64)
    offset = 0
    for d, size in enumerate(branch_sizes):
        idx = np.flatnonzero(valid[offset:offset + size])
        action[d] = int(rng.choice(idx)) if idx.size else 0
        offset += size
    return action


def branch_sizes_of(obs: Mapping[str, np.ndarray]) -> list[int]:
    """Sizes of the branching interface's branches (slot targets, tiers, priority)."""
    from cloudrl.policy import branch_layout

    k, n, t, levels = branch_layout(obs)
    return [n + 1] * k + [3] * t + [levels]


class EpsilonNoisy:
    """``base`` with probability ``epsilon`` replaced by a random valid action.

    The generator is reseeded per episode by :meth:`seed` (same seed, same episode).
    """

    def __init__(self, base: Policy, epsilon: float, seed: int = 0) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.base, self.epsilon = base, float(epsilon)
        self.interface = base.interface
        self.name = f"{base.name}+eps{epsilon:g}"
        self._seed = seed
        self._rng = np.random.default_rng(seed)

    def seed(self, episode_seed: int) -> None:
        self._rng = np.random.default_rng([self._seed, int(episode_seed)])

    def reset(self) -> None:
        self.base.reset()

    def act(self, obs: dict[str, np.ndarray]) -> int | np.ndarray:
        action = self.base.act(obs)  # always asked: stateful heuristics stay in step
        if self._rng.random() < self.epsilon:
            sizes = None if self.interface == "flat" else branch_sizes_of(obs)
            return random_valid_action(obs["action_mask"], self._rng, sizes)
        return action


# ----------------------------------------------------------------------------- recording


@dataclass
class BehaviourSummary:
    """One behaviour's episodes in a dataset."""

    policy: str
    episodes: int = 0
    steps: int = 0
    returns: list[float] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "episodes": self.episodes, "steps": self.steps,
                "mean_return": float(np.mean(self.returns)) if self.returns else float("nan"),
                "mean_cost": float(np.mean(self.costs)) if self.costs else float("nan"),
                "max_cost": float(np.max(self.costs)) if self.costs else float("nan")}


def record_dataset(out_dir: str | Path, policies: Sequence[str], *,
                   env_config: EnvConfig | Mapping[str, Any] | None = None,
                   interface: Interface = "flat", episodes: int = 2,
                   epsilons: Sequence[float] = (0.0,), seeds: Sequence[int] | None = None,
                   max_steps: int | None = None, overload_weight: float = 0.0,
                   overload_threshold: float = 0.9, noise_seed: int = 0) -> list[Path]:
    """Record ``episodes`` episodes of every (policy, ε) on train seeds into ``out_dir``.

    ``policies``: heuristic names or checkpoint directories. ε = 0 is the policy itself.
    Seeds default to the first train seeds; test seeds are refused. Returns the files.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if seeds is None:
        seeds = [TRAIN_SEEDS[i % len(TRAIN_SEEDS)] for i in range(episodes)]
    seeds = [int(s) for s in seeds][:episodes]
    bad = [s for s in seeds if s not in TRAIN_SEEDS]
    if bad:
        raise ValueError(f"seed {bad[0]} is not a train seed; datasets never use test seeds")
    env_cfg = EnvConfig.coerce(env_config)
    env = CostInfo(make_env(env_cfg, interface), overload_weight, overload_threshold)
    paths: list[Path] = []
    for spec in policies:
        base = make_policy(spec, interface)
        if base.interface != interface:
            raise ValueError(f"policy {spec} acts on the {base.interface} interface, "
                             f"not {interface}")
        if hasattr(base, "check_env"):
            base.check_env(env_cfg)
        for eps in epsilons:
            pol = EpsilonNoisy(base, eps, noise_seed) if eps > 0 else base
            recorded = []
            for seed in seeds:
                if isinstance(pol, EpsilonNoisy):
                    pol.seed(seed)
                ep = record_episode(env, pol, seed, max_steps=max_steps)
                ep.custom_data["epsilon"] = float(eps)
                ep.custom_data["behaviour"] = pol.name
                recorded.append(ep)
            paths += write_episodes(recorded, out_dir, prefix=f"episodes-{pol.name}",
                                    episodes_per_file=len(recorded))
    return paths


def action_coverage(actions: np.ndarray, interface: Interface, *, k: int, n: int,
                    branch_sizes: Sequence[int] | None = None) -> dict[str, float]:
    """Fraction of each branch's actions that occur in the data.

    Flat (``k`` queue slots, ``n`` servers): per action kind (``place`` k*n, ``toggle``
    n, ``wait`` 1) the share of its actions seen at least once. Branching: per branch the
    share of its values seen.
    """
    if interface == "flat":
        seen = np.zeros(k * n + n + 1, dtype=bool)
        seen[np.asarray(actions, dtype=np.int64).reshape(-1)] = True
        return {"place": float(seen[:k * n].mean()), "toggle": float(seen[k * n:-1].mean()),
                "wait": float(seen[-1])}
    actions = np.asarray(actions, dtype=np.int64).reshape(len(actions), -1)
    return {f"branch_{d}": float(len(np.unique(actions[:, d])) / size)
            for d, size in enumerate(branch_sizes or [])}


def summarize(episodes: Sequence[Any]) -> dict[str, Any]:
    """Per behaviour: episodes, steps, mean return and cost; overall action coverage."""
    by: dict[str, BehaviourSummary] = {}
    actions = []
    interface: Interface = "flat"
    k = n = 0
    sizes: list[int] | None = None
    for ep in episodes:
        name = ep.custom_data.get("behaviour", ep.custom_data.get("policy", "?"))
        s = by.setdefault(name, BehaviourSummary(name))
        s.episodes += 1
        s.steps += len(ep)
        s.returns.append(float(ep.get_return()))
        s.costs.append(episode_cost(ep))
        interface = ep.custom_data.get("interface", "flat")
        actions.append(np.asarray(ep.get_actions(slice(0, len(ep)))).reshape(len(ep), -1))
        obs0 = ep.get_observations(0)
        k, n = obs0["jobs"].shape[0], obs0["servers"].shape[0]
        if interface != "flat" and sizes is None:
            sizes = branch_sizes_of(obs0)
    rows = [s.as_dict() for s in by.values()]
    coverage = (action_coverage(np.concatenate(actions), interface, k=k, n=n,
                                branch_sizes=sizes) if actions else {})
    return {"episodes": len(episodes), "steps": int(sum(len(e) for e in episodes)),
            "behaviours": rows, "coverage": coverage, "interface": interface}


def format_summary(summary: Mapping[str, Any]) -> str:
    """The summary as a small text table."""
    lines = [f"{'behaviour':32s} {'episodes':>8s} {'steps':>8s} {'return':>10s} "
             f"{'cost':>8s} {'max cost':>8s}"]
    for r in summary["behaviours"]:
        lines.append(f"{r['policy']:32s} {r['episodes']:8d} {r['steps']:8d} "
                     f"{r['mean_return']:10.1f} {r['mean_cost']:8.2f} {r['max_cost']:8.1f}")
    cov = ", ".join(f"{k} {v:.1%}" for k, v in summary["coverage"].items())
    lines.append(f"{summary['episodes']} episodes, {summary['steps']} steps, "
                 f"{summary['interface']} interface; action coverage: {cov}")
    return "\n".join(lines)


def summary_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """Flat MLflow metrics of a summary (``dataset/<behaviour>/mean_cost`` ...)."""
    out: dict[str, float] = {"dataset/episodes": float(summary["episodes"]),
                             "dataset/steps": float(summary["steps"])}
    for r in summary["behaviours"]:
        tag = "".join(c if c.isalnum() or c in "_-." else "_" for c in r["policy"])
        for key in ("mean_return", "mean_cost"):
            out[f"dataset/{tag}/{key}"] = float(r[key])
    for k, v in summary["coverage"].items():
        out[f"dataset/coverage/{k}"] = float(v)
    return out


def subset_dataset(src: str | Path, dst: str | Path, *, max_cost: float | None = None,
                   min_cost: float | None = None,
                   drop_behaviours: Sequence[str] = ()) -> dict[str, Any]:
    """Write the episodes of ``src`` with cost in [``min_cost``, ``max_cost``] whose
    behaviour does not start with any of ``drop_behaviours`` to ``dst``; returns the
    subset's :func:`summarize`. BC-Safe's data (``max_cost`` = the budget) and the
    no-feasible-behaviour ablation (``min_cost`` above the budget, the best behaviour
    dropped). An empty subset is a :class:`DatasetError`."""
    kept = []
    for ep in read_dataset(src):
        cost = episode_cost(ep)
        name = str(ep.custom_data.get("behaviour", "?"))
        if max_cost is not None and cost > max_cost:
            continue
        if min_cost is not None and cost < min_cost:
            continue
        if any(name.startswith(b) for b in drop_behaviours):
            continue
        kept.append(ep)
    if not kept:
        raise DatasetError(f"{src}: no episode with cost in [{min_cost}, {max_cost}] "
                           f"outside {list(drop_behaviours)}")
    by_name: dict[str, list[Any]] = defaultdict(list)
    for ep in kept:
        by_name[str(ep.custom_data.get("behaviour", "?"))].append(ep)
    for name, eps in by_name.items():
        write_episodes(eps, dst, prefix=f"episodes-{name}", episodes_per_file=len(eps))
    return summarize(kept)


def per_behaviour_costs(episodes: Sequence[Any]) -> dict[str, list[float]]:
    """Episode costs grouped by behaviour name."""
    out: dict[str, list[float]] = defaultdict(list)
    for ep in episodes:
        out[ep.custom_data.get("behaviour", "?")].append(episode_cost(ep))
    return dict(out)
