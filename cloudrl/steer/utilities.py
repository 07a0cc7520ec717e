"""Hidden utilities of scripted operators: costs in $ per segment (lower is better), each a
function of the per-tick trace (:class:`cloudrl.steer.trace.Trace`), never of episode sums
alone, so none lies in the span of the steering pipeline's summary FEATURES.

Base: ``cost`` = energy $ + carbon $ + SLA $ of the segment. Windows are one hour.

- ``lc_window``: cost + $1 x sum over windows of ((mean latency-critical cores waiting,
  as a share of the fleet, - 1.2%) / 1%)^2 above zero -- a convex per-window latency SLA.
- ``hour_carbon``: energy $ + SLA $ + carbon $ weighted 40x in the afternoon peak
  (12:00-18:00, when this operator's grid runs its dirtiest marginal plant: $4 per kg
  instead of the scenario's $0.10) and 1x otherwise.
- ``toggle_cap``: cost + $0.02 per power-state toggle beyond 12 per server per day (wear).
- ``class_fairness``: cost + $2 x sum over windows of (batch waiting share - latency-
  critical waiting share)^2 -- neither class's tenants may wait much longer than the other's.
- ``smooth_controls``: cost + $3 per unit of |change| of the ready-cores target (share of
  the fleet) between decisions -- a dislike of oscillating controls.

The weights of ``hour_carbon`` and ``smooth_controls`` were raised (from 8x and $0.3) so
that on ``tiny`` the search on the utility itself beats the default-tuned heuristic by more
than the test noise: with the smaller weights U differed from the cost by cents there.

Only the operator's process reads this module (:mod:`cloudrl.steer.operators`) and the
evaluation that measures policies under it (:mod:`cloudrl.steer.evaluate`); the learner
(:mod:`cloudrl.steer.reward`) never imports it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cloudrl.steer.names import utilities_of
from cloudrl.steer.trace import Trace

WINDOW_HOURS = 1.0
LC_SHARE = 0.012
LC_STEP = 0.01
LC_PRICE = 1.0
PEAK_HOURS = (12.0, 18.0)
PEAK_WEIGHT = 40.0
TOGGLE_CAP = 12
TOGGLE_USD = 0.02
FAIRNESS_USD = 2.0
SMOOTH_USD = 3.0


def _windows(tr: Trace, x: np.ndarray) -> np.ndarray:
    """Per-window means of a per-tick series (a last partial window kept)."""
    w = max(1, int(round(WINDOW_HOURS * 3600.0 / tr.tick_seconds)))
    n = len(x)
    edges = np.arange(0, n, w)
    return np.add.reduceat(x, edges) / np.diff(np.append(edges, n))


def lc_window(tr: Trace) -> float:
    share = _windows(tr, tr.ticks["queued_lc"]) / tr.fleet_cores
    excess = np.maximum(share - LC_SHARE, 0.0) / LC_STEP
    return tr.cost_usd() + LC_PRICE * float((excess ** 2).sum())


def hour_carbon(tr: Trace) -> float:
    t = tr.ticks
    lo, hi = PEAK_HOURS
    w = np.where((t["hour"] >= lo) & (t["hour"] < hi), PEAK_WEIGHT, 1.0)
    return float((t["energy_usd"] + t["sla_usd"] + w * t["carbon_usd"]).sum())


def toggle_cap(tr: Trace) -> float:
    return tr.cost_usd() + TOGGLE_USD * float(np.maximum(tr.toggles - TOGGLE_CAP, 0.0).sum())


def class_fairness(tr: Trace) -> float:
    t = tr.ticks
    batch = _windows(tr, t["queued_batch"] + t["pool_cores"]) / tr.fleet_cores
    lc = _windows(tr, t["queued_lc"]) / tr.fleet_cores
    return tr.cost_usd() + FAIRNESS_USD * float(((batch - lc) ** 2).sum())


def smooth_controls(tr: Trace) -> float:
    ready = tr.ticks["ready_cores"]
    moves = np.abs(np.diff(ready))
    return tr.cost_usd() + SMOOTH_USD * float(moves.sum())


UTILITIES: dict[str, Callable[[Trace], float]] = {
    "lc_window": lc_window, "hour_carbon": hour_carbon, "toggle_cap": toggle_cap,
    "class_fairness": class_fairness, "smooth_controls": smooth_controls}


def utility(name: str) -> Callable[[Trace], float]:
    """The utility called ``name``; a ValueError naming the valid ones."""
    if name not in UTILITIES:
        raise ValueError(f"utility {name!r}: valid: {', '.join(UTILITIES)}")
    return UTILITIES[name]


def utilities_at_end(text: str) -> Callable[[Trace], float]:
    """The utility an operator spec (``A`` or drift ``A>B@f``) holds at its end."""
    first, second, _ = utilities_of(text)
    return utility(second or first)
