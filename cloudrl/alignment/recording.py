"""Demonstrations: record episodes of any policy in RLlib's offline episode format.

RLlib 2.60's ``OfflineEnvRunner`` with ``output_write_episodes=True`` stores each
finished, not-yet-numpy'd ``SingleAgentEpisode`` as
``msgpack.packb(episode.get_state(), default=msgpack_numpy.encode)`` in the single
binary column ``item`` of parquet files (``ray.data.from_items(...).write_parquet``).
Its readers (``OfflinePreLearner`` and ``OfflinePolicyEvaluationRunner`` with
``input_read_episodes=True``) undo exactly that:
``SingleAgentEpisode.from_state(msgpack.unpackb(item, object_hook=msgpack_numpy.decode))``.
This module writes the same thing without a Ray cluster: the heuristics are plain
Python, so an episode is stepped here with the gymnasium env, built as a
``SingleAgentEpisode`` (observations, actions, rewards and every step's ``info``:
energy, violations, toggles, ...) and written with pyarrow.

``custom_data`` of each episode holds ``episode_seed``, ``policy`` and ``interface``.
Files: ``<out>/episodes-<policy>-<tag>-<i>.parquet``, ``episodes_per_file`` episodes
each; ``ray.data.read_parquet(out)`` and ``AlgorithmConfig.offline_data(input_=[out],
input_read_episodes=True)`` read the directory.

``msgpack_numpy`` (what RLlib imports to decode) is a dependency of cloudrl: ``ray[rllib]``
does not declare it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import msgpack_numpy
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cloudrl.policy import Interface, Policy
from cloudrl.protocol import TRAIN_SEEDS
from envs.env_config import EnvConfig

ITEM_COLUMN = "item"  # the column ray.data.from_items() gives the packed episodes


def pack_episode(episode) -> bytes:
    """One episode's ``item`` bytes, as ``OfflineEnvRunner`` packs them."""
    if episode.is_numpy:
        raise ValueError("RLlib records episodes before to_numpy(); got a numpy'd episode")
    return msgpack.packb(episode.get_state(), default=msgpack_numpy.encode)


def unpack_episode(item: bytes):
    """The ``SingleAgentEpisode`` of one ``item`` (RLlib's reader does the same)."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    return SingleAgentEpisode.from_state(
        msgpack.unpackb(item, object_hook=msgpack_numpy.decode))


# ----------------------------------------------------------------------------- policies


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


def make_env(env_config: EnvConfig | Mapping[str, Any] | None, interface: Interface):
    from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv

    cls = ClusterSchedulingEnv if interface == "flat" else ClusterBranchingEnv
    return cls(EnvConfig.coerce(env_config))


# ----------------------------------------------------------------------------- recording


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


def _file_tag(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "policy"


def write_episodes(episodes: Iterable[Any], out_dir: str | Path, *, prefix: str = "episodes",
                   episodes_per_file: int = 1) -> list[Path]:
    """Pack episodes into parquet files with the one binary column ``item``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    paths: list[Path] = []
    batch: list[bytes] = []

    def flush() -> None:
        path = out / f"{_file_tag(prefix)}-{tag}-{len(paths):05d}.parquet"
        pq.write_table(pa.table({ITEM_COLUMN: pa.array(batch, type=pa.binary())}), path)
        paths.append(path)
        batch.clear()

    for episode in episodes:
        batch.append(pack_episode(episode))
        if len(batch) >= max(1, episodes_per_file):
            flush()
    if batch:
        flush()
    return paths


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


# ----------------------------------------------------------------------------- reading


def episode_files(path: str | Path) -> list[Path]:
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise ValueError(f"{p}: no such file or directory")
    files = sorted(f for f in p.rglob("*.parquet") if f.is_file())
    if not files:
        raise ValueError(f"{p}: no .parquet episode files")
    return files


def iter_episodes(path: str | Path) -> Iterator[tuple[Path, int, Any]]:
    """(file, row, episode) of every episode under ``path`` (a file or a directory,
    recursively), Ray-free; a malformed file or row is a ValueError naming both."""
    for f in episode_files(path):
        try:
            table = pq.read_table(f, columns=[ITEM_COLUMN])
        except (pa.ArrowInvalid, KeyError, OSError) as exc:
            raise ValueError(f"{f}: not an episode file (a parquet file with a binary "
                             f"'{ITEM_COLUMN}' column): {str(exc).splitlines()[0]}") from exc
        for i, item in enumerate(table.column(ITEM_COLUMN).to_pylist()):
            try:
                episode = unpack_episode(item)
            except Exception as exc:  # noqa: BLE001 - any decode failure names file and row
                raise ValueError(f"{f}: row {i}: field {ITEM_COLUMN}: not a packed "
                                 f"SingleAgentEpisode ({type(exc).__name__}: {exc})") from exc
            yield Path(f), i, episode


def read_episodes(path: str | Path) -> list[Any]:
    """Every episode under ``path`` (a file or a directory, recursively), Ray-free."""
    return [episode for _, _, episode in iter_episodes(path)]
