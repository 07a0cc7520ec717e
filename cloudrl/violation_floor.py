"""A lower bound on the SLA violations of any policy on the flat interface.

The flat interface takes one action per tick: one placement, one toggle or a wait.
Arrivals beyond the queue's capacity are dropped, and queued jobs are dropped when
their deadline comes. A burst of arrivals larger than the queue plus the placements
that can be made while it arrives therefore loses jobs whatever the policy does, with
every server awake and empty.

Derivation (the simulator's order of events, ``envs/sim.py``): the arrivals of tick
``t`` join the queue (up to ``queue_capacity``, the rest dropped) at the end of the
step that moves time to ``t``, after the expired jobs are dropped; the action of tick
``t`` comes after that. Take the ``n`` jobs that arrive in the ticks
``t1..t2`` (``0 <= t1 <= t2 <= T``, ``T`` the episode length). Right after the
arrivals of ``t2`` join, each of them is in one of four places:

* dropped on arrival, or dropped when its deadline came (at a tick <= ``t2 <= T``):
  a violation the episode counts;
* placed, at one of the ticks ``t1..t2-1``: at most ``t2 - t1`` of them on the flat
  interface;
* in the queue: at most ``queue_capacity``.

So at least ``n - queue_capacity - (t2 - t1)`` of them are violations. Disjoint tick
intervals hold disjoint jobs, so their bounds add; :func:`burst_floor` takes the best
set of disjoint intervals by dynamic programming over the episode (O(T^2)). Server
capacity, memory, the visible window and late finishes are all ignored, which only
lowers the bound: it holds for every policy on the flat interface, learned or not.
The branching interface places up to ``queue_window`` jobs a tick; it has no such floor.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def burst_floor(arrivals: np.ndarray, horizon: int, queue_capacity: int) -> int:
    """Least number of violations of any one-placement-per-tick policy, from the
    arrival ticks of the episode's jobs (pre-loaded jobs excluded).

    ``best[k]`` is the largest bound from disjoint intervals inside ticks ``< k``;
    an interval ``t1..t2`` adds ``max(0, n(t1..t2) - queue_capacity - (t2 - t1))``.
    """
    if horizon < 0 or queue_capacity < 0:
        raise ValueError(f"horizon ({horizon}) and queue_capacity ({queue_capacity}) "
                         "must be >= 0")
    ticks = np.asarray(arrivals, dtype=np.int64)
    ticks = ticks[(ticks >= 0) & (ticks <= horizon)]
    counts = np.bincount(ticks, minlength=horizon + 1)
    before = np.concatenate([[0], np.cumsum(counts)])  # before[k]: arrivals at ticks < k
    best = np.zeros(horizon + 2, dtype=np.int64)
    starts = np.arange(horizon + 1)
    for t2 in range(horizon + 1):
        t1 = starts[:t2 + 1]
        gain = before[t2 + 1] - before[t1] - queue_capacity - (t2 - t1)
        best[t2 + 1] = max(best[t2], int((best[t1] + np.maximum(gain, 0)).max()))
    return int(best[horizon + 1])


def episode_floor(sim, seed: int) -> int:
    """:func:`burst_floor` of episode ``seed`` of the simulator ``sim`` (reset here)."""
    sim.reset(seed)
    return burst_floor(sim.job_arrival[sim.n_warm:], sim.cfg.episode_length,
                       sim.cfg.queue_capacity)


def episode_floors(env_cfg, seeds: Iterable[int]) -> list[int]:
    """:func:`episode_floor` for each seed of the env config ``env_cfg`` (dict or
    ``EnvConfig``), one simulator reused."""
    from cloudrl.lower_bound import make_sim

    sim = make_sim(env_cfg)
    return [episode_floor(sim, s) for s in seeds]
