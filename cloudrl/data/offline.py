"""Offline datasets: recorded episodes with a per-step ``cost``, read and validated.

An offline dataset is a directory of recorded episodes (:mod:`cloudrl.data.episodes`,
RLlib's offline episode format) whose every step's ``infos`` hold ``cost`` (``COST_KEY``):
the SLA violations of that step, plus a weighted overload count when the recording asked
for it. Episodes are whole, so per-episode cost totals exist. ``cloudrl offline record``
(:mod:`cloudrl.offline.dataset`) writes them; :func:`read_dataset` reads and checks them,
and its errors (:class:`DatasetError`) name the malformed file and row.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cloudrl.data.episodes import iter_episodes

COST_KEY = "cost"  # the per-step cost in each step's infos


class DatasetError(ValueError):
    """A dataset file that is not what ``cloudrl offline record`` writes (names the file)."""


def _check_episode(ep: Any, where: str) -> None:
    if not ep.is_done:
        raise DatasetError(f"{where}: episode is not done (offline datasets keep whole "
                           "episodes)")
    for t in range(len(ep)):
        info = ep.get_infos(t + 1)
        if not isinstance(info, Mapping) or COST_KEY not in info:
            raise DatasetError(f"{where}: step {t}: no '{COST_KEY}' in infos (record the "
                               "dataset with `cloudrl offline record`)")


def read_dataset(path: str | Path) -> list[Any]:
    """Every episode under ``path``; a malformed file is a :class:`DatasetError` naming it."""
    episodes = []
    try:
        for f, i, ep in iter_episodes(path):
            _check_episode(ep, f"{f}: row {i}")
            episodes.append(ep)
    except DatasetError:
        raise
    except ValueError as exc:
        raise DatasetError(str(exc)) from None
    return episodes


def episode_cost(ep: Any) -> float:
    """Sum of the per-step costs of one recorded episode."""
    return float(sum(ep.get_infos(t + 1)[COST_KEY] for t in range(len(ep))))
