"""The shared data formats this package reads and writes, from wherever they live.

Pair datasets (``Segment``, ``pair_row``, ``write_pairs``, ``read_pairs``), recorded
episodes (``read_episodes``) and recording (``make_policy``, ``record_episode``,
``make_env``) are moving from ``cloudrl.alignment`` into the low ``cloudrl.data`` layer;
this module imports them from the new place and falls back to the old one.
"""

from __future__ import annotations

try:
    from cloudrl.data.pairs import PairArrays, Segment, pair_row, read_pairs, write_pairs
except ImportError:  # before the move
    from cloudrl.alignment.preferences import (  # type: ignore[no-redef]
        PairArrays,
        Segment,
        pair_row,
        read_pairs,
        write_pairs,
    )

try:
    from cloudrl.data.episodes import read_episodes
except ImportError:  # before the move
    from cloudrl.alignment.recording import read_episodes  # type: ignore[no-redef]

try:
    from cloudrl.policy import make_env
    from cloudrl.recording import make_policy, record_episode
except ImportError:  # before the move
    from cloudrl.alignment.recording import (  # type: ignore[no-redef]
        make_env,
        make_policy,
        record_episode,
    )

__all__ = ["PairArrays", "Segment", "make_env", "make_policy", "pair_row", "read_episodes",
           "read_pairs", "record_episode", "write_pairs"]
