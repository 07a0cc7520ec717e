"""Recording: run any policy (a heuristic or a checkpoint) on train seeds and keep its episodes.

The episodes are written in RLlib's offline episode format (:mod:`cloudrl.data.episodes`,
which also reads them back). ``record_episode`` steps one episode with the gymnasium env
and builds the ``SingleAgentEpisode`` (observations, actions, rewards and every step's
``info``: energy, violations, toggles, ...); ``record_episodes`` records several on train
seeds (test seeds are refused) and writes them. ``custom_data`` of each episode holds
``episode_seed``, ``policy`` and ``interface``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.data.episodes import write_episodes
from cloudrl.policy import Interface, Policy, make_env
from cloudrl.protocol import TRAIN_SEEDS
from envs.env_config import EnvConfig


def make_policy(spec: str, interface: Interface = "flat") -> Policy:
    """A heuristic by name (``power_aware`` or ``heuristic:power_aware``) or a checkpoint dir."""
    from cloudrl.checkpoint_policy import CheckpointPolicy, is_checkpoint
    from cloudrl.heuristics import HEURISTICS, make_heuristic

    name = spec.removeprefix("heuristic:")
    if name in HEURISTICS:
        return make_heuristic(name, interface)
    if is_checkpoint(spec):
        return CheckpointPolicy(spec)
    raise ValueError(f"policy {spec!r} is neither a heuristic ({', '.join(sorted(HEURISTICS))}) "
                     "nor a cloudrl checkpoint directory")


def _plain(value: Any) -> Any:
    """Python scalars for numpy scalars (infos stay small and portable)."""
    return value.item() if isinstance(value, np.generic) else value


def record_episode(env, policy: Policy, seed: int, *, max_steps: int | None = None):
    """Run ``policy`` on ``env`` from episode seed ``seed``; the episode as RLlib records it."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    episode = SingleAgentEpisode(observation_space=env.observation_space,
                                 action_space=env.action_space)
    policy.reset()
    obs, info = env.reset(seed=int(seed))
    episode.add_env_reset(observation=obs, infos=info)
    steps = 0
    while True:
        action = policy.act(obs)
        action = action.astype(np.int64) if isinstance(action, np.ndarray) else int(action)
        obs, reward, terminated, truncated, info = env.step(action)
        steps += 1
        truncated = bool(truncated) or (max_steps is not None and steps >= max_steps
                                        and not terminated)
        episode.add_env_step(observation=obs, action=action, reward=float(reward),
                             infos={k: _plain(v) for k, v in info.items()},
                             terminated=bool(terminated), truncated=truncated)
        if terminated or truncated:
            break
    episode.custom_data.update({"episode_seed": int(seed), "policy": policy.name,
                                "interface": policy.interface})
    return episode



@dataclass
class RecordingSummary:
    """What :func:`record_episodes` wrote."""

    paths: list[Path]
    policy: str
    seeds: list[int]
    env_steps: int
    returns: list[float]


def record_episodes(policy: str | Policy, out_dir: str | Path, *,
                    env_config: EnvConfig | Mapping[str, Any] | None = None,
                    interface: Interface | None = None, episodes: int = 4,
                    seeds: Sequence[int] | None = None, max_steps: int | None = None,
                    episodes_per_file: int = 1) -> RecordingSummary:
    """Record ``episodes`` episodes of ``policy`` on train seeds into ``out_dir``.

    ``seeds`` default to the first train seeds (``cloudrl.protocol.TRAIN_SEEDS``), cycling
    when more episodes than seeds are asked; test seeds are refused. A checkpoint policy
    runs on its own env config and interface unless ``env_config`` is given (then it is
    checked against the checkpoint's spaces).
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    pol = make_policy(policy, interface or "flat") if isinstance(policy, str) else policy
    if hasattr(pol, "env_config"):  # a checkpoint: its own env unless told otherwise
        env_cfg = EnvConfig.coerce(env_config) if env_config is not None else pol.env_config
        pol.check_env(env_cfg)
    else:
        env_cfg = EnvConfig.coerce(env_config)
    if interface is not None and interface != pol.interface:
        raise ValueError(f"policy {pol.name} acts on the {pol.interface} interface, "
                         f"not {interface}")
    if seeds is None:
        seeds = [TRAIN_SEEDS[i % len(TRAIN_SEEDS)] for i in range(episodes)]
    else:
        seeds = [int(s) for s in seeds][:episodes]
        bad = [s for s in seeds if s not in TRAIN_SEEDS]
        if bad:
            raise ValueError(f"seed {bad[0]} is not a train seed (0..{len(TRAIN_SEEDS) - 1}); "
                             "demonstrations never use test seeds")
    env = make_env(env_cfg, pol.interface)
    recorded = []
    steps = 0
    returns = []
    for seed in seeds:
        ep = record_episode(env, pol, seed, max_steps=max_steps)
        steps += len(ep)
        returns.append(float(ep.get_return()))
        recorded.append(ep)
    paths = write_episodes(recorded, out_dir, prefix=f"episodes-{pol.name}",
                           episodes_per_file=episodes_per_file)
    return RecordingSummary(paths, pol.name, list(seeds), steps, returns)
