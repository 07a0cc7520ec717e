"""Demonstrations: recorded episodes as flat arrays of steps, read and validated.

Behaviour cloning and the anchored fine-tuning read the same thing: every demonstrated
step of the episodes under a directory (:mod:`cloudrl.data.episodes`), as stacked
observations, next observations, actions, rewards and terminal flags
(:class:`Demonstrations`). :func:`load_demonstrations` refuses episodes of the other
interface, with other spaces than the first, or none at all, in one line naming the file
or the episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.data.episodes import episode_files, read_episodes
from cloudrl.policy import Interface

OBS_PARTS = ("macro", "servers", "jobs", "action_mask")


@dataclass
class Demonstrations:
    """Every demonstrated step as arrays (row i: the step's observation, action, ...)."""

    obs: dict[str, np.ndarray]  # macro (n, M), servers (n, N, Fs), jobs (n, K, Fj), mask
    next_obs: dict[str, np.ndarray]
    actions: np.ndarray  # (n,) flat or (n, D) branching, int64
    rewards: np.ndarray  # (n,) float32, unscaled env rewards
    terminateds: np.ndarray  # (n,) float32
    observation_space: Any
    action_space: Any
    interface: Interface
    episodes: int
    policies: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.actions)


def _stack(observations: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    return {k: np.stack([np.asarray(o[k], np.float32) for o in observations])
            for k in OBS_PARTS}


def load_demonstrations(path: str | Path, interface: Interface) -> Demonstrations:
    """The episodes under ``path`` as :class:`Demonstrations`; a ValueError names the
    file or the episode that does not fit (other interface, other spaces, empty)."""
    try:
        files = episode_files(path)
        episodes = read_episodes(path)
    except ValueError as exc:
        raise ValueError(f"demos: {exc}") from None
    if not episodes:
        raise ValueError(f"demos: {path}: no episodes in {len(files)} file(s)")
    first = episodes[0]
    parts: list[tuple[dict, dict, np.ndarray, np.ndarray, np.ndarray]] = []
    policies: set[str] = set()
    for i, ep in enumerate(episodes):
        where = f"demos: {path}: episode {i} (seed {ep.custom_data.get('episode_seed')})"
        ep_interface = ep.custom_data.get("interface")
        if ep_interface is not None and ep_interface != interface:
            raise ValueError(f"{where}: recorded on the {ep_interface} interface, "
                             f"interface is {interface}")
        if (ep.observation_space != first.observation_space
                or ep.action_space != first.action_space):
            raise ValueError(f"{where}: its spaces differ from episode 0's "
                             f"({ep.action_space} vs {first.action_space}); record every "
                             "episode with the same env config")
        t = len(ep)
        if t == 0:
            continue
        observations = ep.get_observations(slice(0, t + 1))
        obs = _stack(observations[:t])
        nxt = _stack(observations[1:t + 1])
        actions = np.asarray(ep.get_actions(slice(0, t)), dtype=np.int64)
        rewards = np.asarray(ep.get_rewards(slice(0, t)), dtype=np.float32)
        done = np.zeros(t, np.float32)
        done[-1] = float(ep.is_terminated)
        parts.append((obs, nxt, actions, rewards, done))
        policies.add(str(ep.custom_data.get("policy", "")))
    if not parts:
        raise ValueError(f"demos: {path}: every episode is empty")
    want_flat = interface == "flat"
    import gymnasium as gym

    is_flat = isinstance(first.action_space, gym.spaces.Discrete)
    if want_flat != is_flat:
        raise ValueError(f"demos: {path}: action space {first.action_space} is not the "
                         f"{interface} interface's")
    return Demonstrations(
        obs={k: np.concatenate([p[0][k] for p in parts]) for k in OBS_PARTS},
        next_obs={k: np.concatenate([p[1][k] for p in parts]) for k in OBS_PARTS},
        actions=np.concatenate([p[2] for p in parts]),
        rewards=np.concatenate([p[3] for p in parts]),
        terminateds=np.concatenate([p[4] for p in parts]),
        observation_space=first.observation_space, action_space=first.action_space,
        interface=interface, episodes=len(parts), policies=sorted(policies))
