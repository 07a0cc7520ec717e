"""Recorded episodes: RLlib's offline episode format, written and read without a Ray cluster.

RLlib 2.60's ``OfflineEnvRunner`` with ``output_write_episodes=True`` stores each
finished, not-yet-numpy'd ``SingleAgentEpisode`` as
``msgpack.packb(episode.get_state(), default=msgpack_numpy.encode)`` in the single
binary column ``item`` of parquet files (``ray.data.from_items(...).write_parquet``).
Its readers (``OfflinePreLearner`` and ``OfflinePolicyEvaluationRunner`` with
``input_read_episodes=True``) undo exactly that:
``SingleAgentEpisode.from_state(msgpack.unpackb(item, object_hook=msgpack_numpy.decode))``.
This module writes and reads the same thing with pyarrow, without a Ray cluster
(:mod:`cloudrl.recording` steps the episodes; every reader of demonstrations, teacher
segments and offline datasets starts here).

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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import msgpack_numpy
import pyarrow as pa
import pyarrow.parquet as pq

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


# ----------------------------------------------------------------------------- writing


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
