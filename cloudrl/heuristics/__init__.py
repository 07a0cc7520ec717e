"""Heuristic scheduling policies and their registry.

Four baselines, each for both env interfaces (``interface="flat"`` or
``"branching"``), acting from the observation dict alone:

* ``round_robin``: :class:`RoundRobin`, head of queue onto the next feasible server;
* ``sjf``: :class:`ShortestJobFirst`, shortest placeable job, first fit;
* ``ffd``: :class:`FirstFitDecreasing`, largest placeable job, first fit;
* ``power_aware``: :class:`PowerAwareConsolidation`, best-fit consolidation that
  sleeps idle servers and wakes ahead of demand (the strongest baseline).

``make_heuristic("power_aware", "branching", spare_floor=2.0)`` builds one by name.
"""

from __future__ import annotations

from typing import Any

from cloudrl.heuristics.base import HeuristicPolicy, JointPlan, ObsView
from cloudrl.heuristics.power_aware import PowerAwareConfig, PowerAwareConsolidation
from cloudrl.heuristics.simple import FirstFitDecreasing, RoundRobin, ShortestJobFirst
from cloudrl.policy import Interface

HEURISTICS: dict[str, type[HeuristicPolicy]] = {
    cls.name: cls
    for cls in (RoundRobin, ShortestJobFirst, FirstFitDecreasing, PowerAwareConsolidation)
}


def make_heuristic(name: str, interface: Interface = "flat", **kwargs: Any) -> HeuristicPolicy:
    """The heuristic registered as ``name`` for ``interface``; ``kwargs`` go to its constructor."""
    try:
        cls = HEURISTICS[name]
    except KeyError:
        raise ValueError(
            f"unknown heuristic {name!r}; valid names: {', '.join(sorted(HEURISTICS))}"
        ) from None
    return cls(interface, **kwargs)


__all__ = [
    "HEURISTICS", "FirstFitDecreasing", "HeuristicPolicy", "JointPlan", "ObsView",
    "PowerAwareConfig", "PowerAwareConsolidation", "RoundRobin", "ShortestJobFirst",
    "make_heuristic",
]
